// Internal: checks of one option's value, shared by every options validator. Each
// throws ConfigError(option, problem), so a caller that knows the option's JSON
// path (the config parser) can name it instead: see NOTE: [option errors].
//
// NOTE: [option errors] A value check lives in one place: the validator of the
// options struct the value belongs to (validate(ScheduleOptions), LossScaler's
// constructor, validate(OptimizerOptions), ...). It names the option as the C++
// options struct spells it. The config parser runs the same validator and
// rethrows with the JSON path in place of the name (config.cpp, at_path).
#pragma once

#include <stepwise/errors.h>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "check.h"

namespace stepwise::detail {

/// The largest finite float: a value used in fp32 arithmetic (an lr, a loss
/// scale, a clipping norm) must not exceed it.
inline constexpr double kFloatMax = std::numeric_limits<float>::max();

/// Whether a range's lower bound belongs to it: [lo, hi] or (lo, hi].
enum class LowerBound { kClosed, kOpen };

/// `value` is finite and lo <= value <= hi (lo < value with kOpen); otherwise a
/// ConfigError naming `option`, the value and the range.
void check_in_range(const std::string& option, double value, double lo, double hi,
                    LowerBound lower = LowerBound::kClosed);
/// `value` >= 1 ("must be a positive integer").
void check_positive(const std::string& option, int64_t value);
/// "a, b, c".
std::string join(const std::vector<std::string>& items);

}  // namespace stepwise::detail

/// Throws ConfigError(option, message) when `cond` is false; the message is the
/// concatenation of the remaining arguments. see NOTE: [option errors]
#define STEPWISE_CHECK_OPTION(cond, option, ...)                      \
  do {                                                                \
    if (!(cond)) {                                                    \
      throw ::stepwise::ConfigError(option, ::c10::str(__VA_ARGS__)); \
    }                                                                 \
  } while (false)
