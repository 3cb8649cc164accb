#include "option_checks.h"
#include "check.h"

#include <cmath>

namespace stepwise::detail {

void check_in_range(const std::string& option, double value, double lo, double hi,
                    LowerBound lower) {
  const bool open = lower == LowerBound::kOpen;
  STEPWISE_CHECK_OPTION(std::isfinite(value) && (open ? value > lo : value >= lo) && value <= hi,
                        option, "must be a finite number in ", open ? "(" : "[", lo, ", ", hi,
                        "], got ", value);
}

void check_positive(const std::string& option, int64_t value) {
  STEPWISE_CHECK_OPTION(value > 0, option, "must be a positive integer, got ", value);
}

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& item : items) {
    out += (out.empty() ? "" : ", ") + item;
  }
  return out;
}

}  // namespace stepwise::detail
