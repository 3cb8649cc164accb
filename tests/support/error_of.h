// Test support: the message of the exception a call throws, for tests that check
// every user-facing message's text.
#pragma once

#include <exception>
#include <string>
#include <utility>

namespace stepwise::testing {

/// Calls `f` and returns the what() of the `Error` it throws, or "no error" when it
/// returns normally. An exception of another type propagates, so the test fails on it.
template <typename Error = std::exception, typename F>
std::string error_of(F&& f) {
  try {
    std::forward<F>(f)();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace stepwise::testing
