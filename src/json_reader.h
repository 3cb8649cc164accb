// Internal: reads one JSON object's keys with type checks and JSON-path errors.
//
// Usage (config.cpp):
//
//   ObjectReader r(json, "optimizer.params");
//   r.get("lr", out.lr);          // type-checked, path "optimizer.params.lr"
//   r.finish();                   // any key not read is a ConfigError
#pragma once

#include <stepwise/errors.h>

#include <nlohmann/json.hpp>

#include <array>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

namespace stepwise::detail {

/// "a.b" from a parent path and a key.
std::string join_path(const std::string& parent, const std::string& key);
/// A JSON value rendered for a message (strings quoted, long values cut).
std::string show(const nlohmann::json& value);
/// "a, b, c".
std::string join(const std::vector<std::string>& items);

/// Reads keys of one JSON object. Every key must be read (or explicitly
/// rejected) before finish(), so an unknown key can never be ignored.
class ObjectReader {
 public:
  /// Throws ConfigError if `json` is not an object.
  ObjectReader(const nlohmann::json& json, std::string path);

  bool has(const std::string& key) const;
  /// Path of `key` inside this object.
  std::string path_of(const std::string& key) const;
  /// The raw value of a present key (marks it read).
  const nlohmann::json& raw(const std::string& key);

  /// Reads `key` into `out` if present; returns whether it was.
  bool get(const std::string& key, bool& out);
  bool get(const std::string& key, int64_t& out);
  bool get(const std::string& key, double& out);
  bool get(const std::string& key, std::string& out);
  bool get(const std::string& key, std::array<double, 2>& out);

  /// Marks `key` as read without reading it.
  void consume(const std::string& key) { read_.insert(key); }
  /// Throws ConfigError for the first key not read, listing the valid ones.
  void finish(const std::vector<std::string>& valid_keys) const;

 private:
  const nlohmann::json& json_;
  std::string path_;
  std::set<std::string> read_;
};

}  // namespace stepwise::detail
