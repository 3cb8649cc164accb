// stepwise (internal): what the config parser and the checkpoint need of the schedules:
// their names as the config spells them, their defaults, and the position a load sets.
#pragma once

#include <stepwise/lr_schedules.h>

#include <cstdint>
#include <string>
#include <vector>

namespace stepwise {

/// The warmup type names as spelled in the config, in WarmupType's order.
const std::vector<std::string>& warmup_type_names();
/// Parses one of warmup_type_names(); anything else is a ConfigError naming `path`.
WarmupType parse_warmup_type(const std::string& value, const std::string& path);
/// The schedule names as spelled in DeepSpeed's config, in ScheduleOptions' order.
const std::vector<std::string>& supported_scheduler_types();
/// Default options of the schedule named `type`; an unknown name is a ConfigError
/// naming `path` and the supported names.
ScheduleOptions default_schedule_options(const std::string& type, const std::string& path);
/// Sets the count scheduler_step_count() reads (a checkpoint's): with the optimizer's lrs restored,
/// the scheduler continues where it was (every LRScheduler's state is its step count and the lrs).
void set_scheduler_step_count(torch::optim::LRScheduler& scheduler, int64_t count);

}  // namespace stepwise
