#include "json_reader.h"

#include <stepwise/config.h>

#include "auto_values.h"
#include "check.h"
#include "option_checks.h"

#include <algorithm>
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

namespace {

thread_local std::vector<ConfigKey>* recording = nullptr;

// Type-checked conversions of one value; `path` names it in the error.
void convert(const nlohmann::json& v, bool& out, const std::string& path) {
  STEPWISE_CHECK(v.is_boolean(), ConfigError, path, " must be true or false, got ", v.type_name(),
                 " ", show(v));
  out = v.get<bool>();
}

void convert(const nlohmann::json& v, int64_t& out, const std::string& path) {
  const bool integral =
      v.is_number_integer() ||
      (v.is_number_float() && std::isfinite(v.get<double>()) &&
       std::floor(v.get<double>()) == v.get<double>() && std::fabs(v.get<double>()) < 9.0e15);
  STEPWISE_CHECK(integral, ConfigError, path, " must be an integer, got ", v.type_name(), " ",
                 show(v));
  out = v.is_number_integer() ? v.get<int64_t>() : static_cast<int64_t>(v.get<double>());
}

void convert(const nlohmann::json& v, double& out, const std::string& path) {
  STEPWISE_CHECK(v.is_number(), ConfigError, path, " must be a number, got ", v.type_name(), " ",
                 show(v));
  out = v.get<double>();
  STEPWISE_CHECK(std::isfinite(out), ConfigError, path, " must be finite, got ", out);
}

void convert(const nlohmann::json& v, std::string& out, const std::string& path) {
  STEPWISE_CHECK(v.is_string(), ConfigError, path, " must be a string, got ", v.type_name(), " ",
                 show(v));
  out = v.get<std::string>();
}

void convert(const nlohmann::json& v, std::array<double, 2>& out, const std::string& path) {
  const bool ok = v.is_array() && v.size() == 2 && v[0].is_number() && v[1].is_number();
  STEPWISE_CHECK(ok, ConfigError, path, " must be a list of two numbers, got ", show(v));
  out = {v[0].get<double>(), v[1].get<double>()};
}

template <class T>
void convert(const nlohmann::json& v, std::optional<T>& out, const std::string& path) {
  T value{};
  convert(v, value, path);
  out = value;
}

template <class T>
const char* type_of(const T*) {
  if constexpr (std::is_same_v<T, bool>) return "bool";
  if constexpr (std::is_same_v<T, int64_t>) return "integer";
  if constexpr (std::is_same_v<T, double>) return "number";
  if constexpr (std::is_same_v<T, std::string>) return "string";
  if constexpr (std::is_same_v<T, std::array<double, 2>>) return "[number, number]";
  return "?";
}

template <class T>
const char* type_of(const std::optional<T>*) {
  return type_of(static_cast<const T*>(nullptr));
}

template <class T>
std::string default_of(const T& value) {
  return nlohmann::json(value).dump();
}

template <class T>
std::string default_of(const std::optional<T>& value) {
  return value ? nlohmann::json(*value).dump() : "unset";
}

}  // namespace

KeyRecording::KeyRecording(std::vector<ConfigKey>& keys) { recording = &keys; }

KeyRecording::~KeyRecording() { recording = nullptr; }

void Problems::add(std::exception_ptr error, std::string message) {
  errors_.push_back(std::move(error));
  messages_.push_back(std::move(message));
}

void Problems::throw_if_any() const {
  if (errors_.empty()) return;
  if (errors_.size() == 1) std::rethrow_exception(errors_.front());
  std::string text =
      c10::str(messages_.size(), " problems in the configuration (fix them all, then run again):");
  for (size_t i = 0; i < messages_.size(); ++i) text += c10::str("\n  ", i + 1, ". ", messages_[i]);
  throw ConfigError(text);
}

ObjectReader::ObjectReader(const nlohmann::json& json, std::string path, Problems* problems)
    : json_(json), path_(std::move(path)), problems_(problems) {
  STEPWISE_CHECK(json_.is_object(), ConfigError, (path_.empty() ? "the configuration" : path_),
                 " must be a JSON object, got ", json_.type_name(), " ", show(json_));
}

std::string ObjectReader::path_of(const std::string& key) const { return join_path(path_, key); }

void ObjectReader::ask(const std::string& key, const char* type, const std::string& default_text) {
  if (std::find(asked_.begin(), asked_.end(), key) != asked_.end()) return;
  asked_.push_back(key);
  if (recording != nullptr) recording->push_back({path_of(key), type, default_text});
}

template <class T>
bool ObjectReader::read(const std::string& key, T& out, const std::string& default_text) {
  // The default is rendered only for config_keys(): parsing itself never needs it.
  const bool describe = recording != nullptr && default_text.empty();
  ask(key, type_of(&out), describe ? default_of(out) : default_text);
  if (!json_.contains(key)) return false;
  const auto& value = json_.at(key);
  if (value.is_string() && value.get<std::string>() == "auto" && !std::is_same_v<T, std::string>) {
    fail(unfilled_auto(path_of(key), ""));  // see NOTE: [HF auto]
    return false;
  }
  if (problems_ == nullptr) {
    convert(value, out, path_of(key));
    return true;
  }
  T checked = out;
  try {
    convert(value, checked, path_of(key));
  } catch (const ConfigError& e) {
    problems_->add(std::current_exception(), e.what());
    return false;
  }
  out = checked;
  return true;
}

template bool ObjectReader::read(const std::string&, std::string&, const std::string&);
template bool ObjectReader::read(const std::string&, int64_t&, const std::string&);
template bool ObjectReader::read(const std::string&, double&, const std::string&);

bool ObjectReader::get(const std::string& key, bool& out) { return read(key, out, ""); }
bool ObjectReader::get(const std::string& key, int64_t& out) { return read(key, out, ""); }
bool ObjectReader::get(const std::string& key, double& out) { return read(key, out, ""); }
bool ObjectReader::get(const std::string& key, std::string& out) { return read(key, out, ""); }
bool ObjectReader::get(const std::string& key, std::array<double, 2>& out) {
  return read(key, out, "");
}
bool ObjectReader::get(const std::string& key, std::optional<int64_t>& out) {
  return read(key, out, "");
}
bool ObjectReader::get(const std::string& key, std::optional<bool>& out) {
  return read(key, out, "");
}

void ObjectReader::fail(const ConfigError& error) const {
  if (problems_ == nullptr) throw error;
  problems_->add(std::make_exception_ptr(error), error.what());
}

std::optional<ObjectReader> ObjectReader::object(const std::string& key) {
  ask(key, "object", "none");
  if (!json_.contains(key)) return std::nullopt;
  return ObjectReader(json_.at(key), path_of(key), problems_);
}

void ObjectReader::claim(const std::string& key) { claimed_.push_back(key); }

ObjectReader ObjectReader::object_or_empty(const std::string& key) {
  static const nlohmann::json kEmpty = nlohmann::json::object();
  auto child = object(key);
  return child ? *child : ObjectReader(kEmpty, path_of(key), problems_);
}

void ObjectReader::finish() const {
  const auto known = [](const std::vector<std::string>& keys, const std::string& key) {
    return std::find(keys.begin(), keys.end(), key) != keys.end();
  };
  for (const auto& item : json_.items()) {
    if (!known(asked_, item.key()) && !known(claimed_, item.key())) {
      fail(ConfigError(c10::str("unknown key ", path_of(item.key()), " (value ", show(item.value()),
                                "); valid keys here are: ", join(asked_))));
    }
  }
}

}  // namespace stepwise::detail
