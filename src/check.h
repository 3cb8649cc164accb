// stepwise (internal): STEPWISE_CHECK, how the library throws its own error types.
#pragma once

#include <stepwise/errors.h>

#include <c10/util/StringUtil.h>

/// Throws `ErrorType` with the concatenation of the remaining arguments when
/// `cond` is false. Like TORCH_CHECK, but with our error types.
#define STEPWISE_CHECK(cond, ErrorType, ...)    \
  do {                                          \
    if (!(cond)) {                              \
      throw ErrorType(::c10::str(__VA_ARGS__)); \
    }                                           \
  } while (false)
