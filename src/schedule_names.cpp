// The schedules and warmup types by name, as DeepSpeed's config spells them.
#include <stepwise/errors.h>
#include <stepwise/lr_schedules.h>

#include "check.h"
#include "lr_schedules_detail.h"
#include "option_checks.h"

#include <algorithm>
#include <string>
#include <variant>
#include <vector>

namespace stepwise {

const std::vector<std::string>& warmup_type_names() {
  static const std::vector<std::string> names = {"log", "linear"};
  return names;
}

WarmupType parse_warmup_type(const std::string& value, const std::string& path) {
  const auto& names = warmup_type_names();
  const auto it = std::find(names.begin(), names.end(), value);
  STEPWISE_CHECK(it != names.end(), ConfigError, path, " \"", value,
                 "\" is not a warmup type; use \"log\" or \"linear\"");
  return static_cast<WarmupType>(it - names.begin());
}

std::string to_string(WarmupType type) { return warmup_type_names().at(static_cast<int>(type)); }

const std::vector<std::string>& supported_scheduler_types() {
  static const std::vector<std::string> names = {"WarmupLR", "WarmupDecayLR", "WarmupCosineLR",
                                                 "OneCycle", "LRRangeTest"};
  return names;
}

namespace {

// Builds the alternative of ScheduleOptions at `index`, default-constructed.
template <size_t I = 0>
ScheduleOptions options_at(size_t index) {
  if constexpr (I + 1 < std::variant_size_v<ScheduleOptions>) {
    if (index != I) return options_at<I + 1>(index);
  }
  return ScheduleOptions(std::in_place_index<I>);
}

}  // namespace

ScheduleOptions default_schedule_options(const std::string& type, const std::string& path) {
  const auto& names = supported_scheduler_types();
  const auto it = std::find(names.begin(), names.end(), type);
  STEPWISE_CHECK(it != names.end(), ConfigError, path, " \"", type,
                 "\" is not supported; use one of: ", detail::join(names));
  return options_at(static_cast<size_t>(it - names.begin()));
}

const std::string& schedule_type(const ScheduleOptions& options) {
  return supported_scheduler_types().at(options.index());
}

}  // namespace stepwise
