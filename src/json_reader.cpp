#include "json_reader.h"

#include <cmath>

namespace stepwise::detail {

std::string join_path(const std::string& parent, const std::string& key) {
  return parent.empty() ? key : parent + "." + key;
}

std::string show(const nlohmann::json& value) {
  std::string text = value.dump();
  if (text.size() > 60) {
    text = text.substr(0, 57) + "...";
  }
  return text;
}

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& item : items) {
    out += (out.empty() ? "" : ", ") + item;
  }
  return out;
}

namespace {
const char* type_name(const nlohmann::json& v) { return v.type_name(); }
}  // namespace

ObjectReader::ObjectReader(const nlohmann::json& json, std::string path)
    : json_(json), path_(std::move(path)) {
  STEPWISE_CHECK(json_.is_object(), ConfigError, (path_.empty() ? "the configuration" : path_),
                 " must be a JSON object, got ", type_name(json_), " ", show(json_));
}

bool ObjectReader::has(const std::string& key) const { return json_.contains(key); }

std::string ObjectReader::path_of(const std::string& key) const { return join_path(path_, key); }

const nlohmann::json& ObjectReader::raw(const std::string& key) {
  read_.insert(key);
  return json_.at(key);
}

bool ObjectReader::get(const std::string& key, bool& out) {
  if (!has(key)) return false;
  const auto& v = raw(key);
  STEPWISE_CHECK(v.is_boolean(), ConfigError, path_of(key), " must be true or false, got ",
                 type_name(v), " ", show(v));
  out = v.get<bool>();
  return true;
}

bool ObjectReader::get(const std::string& key, int64_t& out) {
  if (!has(key)) return false;
  const auto& v = raw(key);
  bool integral = v.is_number_integer() || (v.is_number_float() && std::isfinite(v.get<double>()) &&
                                            std::floor(v.get<double>()) == v.get<double>() &&
                                            std::fabs(v.get<double>()) < 9.0e15);
  STEPWISE_CHECK(integral, ConfigError, path_of(key), " must be an integer, got ", type_name(v),
                 " ", show(v));
  out = v.is_number_integer() ? v.get<int64_t>() : static_cast<int64_t>(v.get<double>());
  return true;
}

bool ObjectReader::get(const std::string& key, double& out) {
  if (!has(key)) return false;
  const auto& v = raw(key);
  STEPWISE_CHECK(v.is_number(), ConfigError, path_of(key), " must be a number, got ", type_name(v),
                 " ", show(v));
  out = v.get<double>();
  STEPWISE_CHECK(std::isfinite(out), ConfigError, path_of(key), " must be finite, got ", out);
  return true;
}

bool ObjectReader::get(const std::string& key, std::string& out) {
  if (!has(key)) return false;
  const auto& v = raw(key);
  STEPWISE_CHECK(v.is_string(), ConfigError, path_of(key), " must be a string, got ", type_name(v),
                 " ", show(v));
  out = v.get<std::string>();
  return true;
}

bool ObjectReader::get(const std::string& key, std::array<double, 2>& out) {
  if (!has(key)) return false;
  const auto& v = raw(key);
  bool ok = v.is_array() && v.size() == 2 && v[0].is_number() && v[1].is_number();
  STEPWISE_CHECK(ok, ConfigError, path_of(key), " must be a list of two numbers, got ", show(v));
  out = {v[0].get<double>(), v[1].get<double>()};
  return true;
}

void ObjectReader::finish(const std::vector<std::string>& valid_keys) const {
  for (const auto& item : json_.items()) {
    if (read_.count(item.key()) == 0) {
      throw ConfigError(c10::str("unknown key ", path_of(item.key()), " (value ",
                                 show(item.value()), "); valid keys here are: ", join(valid_keys)));
    }
  }
}

}  // namespace stepwise::detail
