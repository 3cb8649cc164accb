// The checks of a docs block's complete program (snippets/blocks.py pastes this file, from
// the line after this comment, into every copied program that uses one). The docs tests
// run the same code under doctest; copied, these stand-ins keep doctest's meaning for the
// names the blocks use, except that a failed check prints the expression and exits with
// status 1 at once.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <limits>

// LibTorch includes glog, whose CHECK(condition) aborts the process; these replace it.
#undef CHECK
#undef CHECK_FALSE
#undef CHECK_MESSAGE
#undef REQUIRE
#undef CHECK_NOTHROW
#undef CHECK_THROWS_AS
[[noreturn]] inline void stepwise_check_failed(const char* what, const char* expr, int line) {
  std::cerr << "line " << line << ": " << what << "(" << expr << ") failed\n";
  std::exit(1);
}
#define CHECK(...) \
  (static_cast<bool>(__VA_ARGS__) ? void() : stepwise_check_failed("CHECK", #__VA_ARGS__, __LINE__))
#define CHECK_FALSE(...)                    \
  (!static_cast<bool>(__VA_ARGS__) ? void() \
                                   : stepwise_check_failed("CHECK_FALSE", #__VA_ARGS__, __LINE__))
#define CHECK_MESSAGE(cond, message) \
  ((cond)                            \
       ? void()                      \
       : (std::cerr << message << "\n", stepwise_check_failed("CHECK_MESSAGE", #cond, __LINE__)))
#define REQUIRE(...) CHECK(__VA_ARGS__)
#define CHECK_NOTHROW(...)                                            \
  [&] {                                                               \
    try {                                                             \
      static_cast<void>(__VA_ARGS__);                                 \
    } catch (...) {                                                   \
      stepwise_check_failed("CHECK_NOTHROW", #__VA_ARGS__, __LINE__); \
    }                                                                 \
  }()
#define CHECK_THROWS_AS(expr, ...)                             \
  [&] {                                                        \
    try {                                                      \
      static_cast<void>(expr);                                 \
    } catch (const __VA_ARGS__&) {                             \
      return;                                                  \
    } catch (...) {                                            \
    }                                                          \
    stepwise_check_failed("CHECK_THROWS_AS", #expr, __LINE__); \
  }()
namespace doctest {  // doctest::Approx(v): equal within 100 float epsilons of the larger
struct Approx {
  explicit Approx(double v) : value(v) {}
  double value;
  friend bool operator==(double x, const Approx& a) {
    double eps = std::numeric_limits<float>::epsilon() * 100;
    return std::fabs(x - a.value) < eps * (1.0 + std::max(std::fabs(x), std::fabs(a.value)));
  }
};
}  // namespace doctest
