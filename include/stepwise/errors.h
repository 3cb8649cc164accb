// stepwise: the error types every user-facing check throws.
//
// Usage {.cpp .fragment context="basic"}:
//
//   try {
//     auto config = stepwise::Config::from_string(R"({"train_batch_size": 0})");
//   } catch (const stepwise::ConfigError& e) {
//     std::cerr << e.what() << "\n";  // names the JSON path, the value, the fix
//   }
//
// Four kinds: `ConfigError` for a bad configuration (a JSON key, a value, an
// option), `UsageError` for a training loop that calls the engine in an order
// that would silently give wrong weights (the guard rails), `TrainingError` for
// a run that cannot go on as configured (fp16 gradients that overflow even at
// the minimum loss scale), `CheckpointError` for a checkpoint that cannot be
// written or loaded into this engine.
#pragma once

#include <c10/util/StringUtil.h>

#include <stdexcept>
#include <string>

namespace stepwise {

/// A configuration value is missing, unknown, of the wrong type, out of range
/// or inconsistent with another. The message names the JSON path (for
/// example `optimizer.params.lr`), the value given and what would be valid.
class ConfigError : public std::invalid_argument {
 public:
  /// Builds the error from its full message.
  explicit ConfigError(const std::string& message) : std::invalid_argument(message) {}
  /// An error about one option: the message is `option`, a space, then `problem`.
  /// The config parser rethrows it with the option's JSON path in place of its name.
  ConfigError(const std::string& option, const std::string& problem)
      : std::invalid_argument(option + " " + problem), option_(option), problem_(problem) {}
  /// The option the message starts with; empty when the error is not about one option.
  const std::string& option() const { return option_; }
  /// The message after the option's name; empty when option() is.
  const std::string& problem() const { return problem_; }

 private:
  std::string option_;
  std::string problem_;
};

/// The training loop called the engine in an order that breaks the contract
/// (for example `backward()` twice without `step()`). The message says what to
/// change and where the docs explain it.
class UsageError : public std::logic_error {
 public:
  /// Builds the error from its full message.
  explicit UsageError(const std::string& message) : std::logic_error(message) {}
};

/// The run cannot go on as configured, for example fp16 gradients that overflow
/// again at fp16.min_loss_scale. The message says what to change.
class TrainingError : public std::runtime_error {
 public:
  /// Builds the error from its full message.
  explicit TrainingError(const std::string& message) : std::runtime_error(message) {}
};

/// A checkpoint cannot be saved or loaded: a file is missing, truncated or corrupted
/// (the message names it), or it does not fit this engine (a parameter's name, shape or
/// dtype; a window in progress saved with another GAS, world size or precision). A
/// failed load leaves the engine as it was.
class CheckpointError : public std::runtime_error {
 public:
  /// Builds the error from its full message.
  explicit CheckpointError(const std::string& message) : std::runtime_error(message) {}
};

}  // namespace stepwise
