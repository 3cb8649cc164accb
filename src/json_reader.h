// Internal: reads one JSON object's keys with type checks and JSON-path errors.
//
// Usage (config.cpp):
//
//   ObjectReader r(json, "optimizer.params");
//   r.get("lr", out.lr);          // type-checked, path "optimizer.params.lr"
//   r.finish();                   // a key nobody asked for is a ConfigError
//
// NOTE: [one source per key] The reader records every key it is asked for, with
// its type and default (the value `out` holds before the read). finish() names
// the recorded keys as the valid ones, and config_keys() (config.h) lists the
// records of every object, so the parser's own reads are the only list of keys.
#pragma once

#include <stepwise/errors.h>

#include <nlohmann/json.hpp>

#include <array>
#include <cstdint>
#include <exception>
#include <optional>
#include <string>
#include <vector>

#include "check.h"

namespace stepwise {
struct ConfigKey;  // what config_keys() lists (the config layer's public header)
}  // namespace stepwise

namespace stepwise::detail {

/// "a.b" from a parent path and a key.
std::string join_path(const std::string& parent, const std::string& key);
/// A JSON value rendered for a message (strings quoted, long values cut).
std::string show(const nlohmann::json& value);

/// While alive, every ObjectReader on this thread appends what it is asked for
/// to `keys` (config_keys() runs the parser under one).
class KeyRecording {
 public:
  /// Starts recording into `keys`.
  explicit KeyRecording(std::vector<ConfigKey>& keys);
  /// Stops recording.
  ~KeyRecording();
  KeyRecording(const KeyRecording&) = delete;
  KeyRecording& operator=(const KeyRecording&) = delete;
};

/// NOTE: [every problem at once] The problems of one configuration, gathered so that
/// one ConfigError lists them all: a user fixes a file in one pass, not one key a run.
/// A value of the wrong type and an unknown key are recorded where they are read, and
/// parsing goes on with the default; a check that throws is caught by guard(), which
/// abandons the rest of that step only.
class Problems {
 public:
  /// Records `error` (a ConfigError).
  void add(std::exception_ptr error, std::string message);
  /// Runs `step`; a ConfigError it throws is recorded instead of propagating.
  template <class Step>
  void guard(Step&& step) {
    try {
      step();
    } catch (const ConfigError& e) {
      add(std::current_exception(), e.what());
    }
  }
  /// Throws nothing if no problem was recorded; the one error as it was if one was;
  /// else one ConfigError listing all of them, numbered, in the order found.
  void throw_if_any() const;

 private:
  std::vector<std::exception_ptr> errors_;
  std::vector<std::string> messages_;
};

/// Reads keys of one JSON object. A key present but never asked for (or claimed) is a
/// ConfigError at finish(), so an unknown key can never be ignored.
class ObjectReader {
 public:
  /// Throws ConfigError if `json` is not an object. With `problems`, a wrong type and
  /// the unknown keys are recorded there (and in the objects read from this one)
  /// instead of thrown.
  ObjectReader(const nlohmann::json& json, std::string path, Problems* problems = nullptr);

  /// Path of `key` inside this object.
  std::string path_of(const std::string& key) const;

  /// Reads `key` into `out` if present; returns whether it was. `out` keeps
  /// its value (the default) otherwise.
  bool get(const std::string& key, bool& out);
  bool get(const std::string& key, int64_t& out);
  bool get(const std::string& key, double& out);
  bool get(const std::string& key, std::string& out);
  bool get(const std::string& key, std::array<double, 2>& out);
  /// As get(), for keys whose absence differs from any default ("unset").
  bool get(const std::string& key, std::optional<int64_t>& out);
  bool get(const std::string& key, std::optional<bool>& out);
  /// As get(), for a key that must be present (recorded as "required"); the
  /// caller throws when it is not, after reading the others.
  template <class T>
  bool get_required(const std::string& key, T& out) {
    return read(key, out, "required");
  }
  /// Reads a key that must be present; throws ConfigError(`missing`) if it is not.
  /// A key present with a bad value is not also called missing: that problem is recorded.
  template <class T>
  void require(const std::string& key, T& out, const std::string& missing) {
    STEPWISE_CHECK(get_required(key, out) || (problems_ != nullptr && json_.contains(key)),
                   ConfigError, missing);
  }
  /// The object under `key`, if present.
  std::optional<ObjectReader> object(const std::string& key);
  /// The object under `key`, or an empty one.
  ObjectReader object_or_empty(const std::string& key);
  /// Marks `key` as handled elsewhere (a DeepSpeed feature read by its own rules):
  /// finish() accepts it, and it is not listed among this object's keys.
  void claim(const std::string& key);
  /// Throws `error`, or records it in problems() when there are.
  void fail(const ConfigError& error) const;
  /// The JSON object read.
  const nlohmann::json& json() const { return json_; }
  /// Where problems go (null: thrown).
  Problems* problems() const { return problems_; }

  /// A ConfigError (recorded, with problems()) for each key present but not asked for
  /// or claimed, listing the keys asked for as the valid ones.
  void finish() const;

 private:
  // Records `key` as asked for, with its type and default text.
  void ask(const std::string& key, const char* type, const std::string& default_text);
  template <class T>
  bool read(const std::string& key, T& out, const std::string& default_text);

  const nlohmann::json& json_;
  std::string path_;
  Problems* problems_;
  std::vector<std::string> asked_;
  std::vector<std::string> claimed_;
};

}  // namespace stepwise::detail
