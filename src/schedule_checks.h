// Internal: the checks of warmup and total step counts, shared by the config
// parser (with the JSON path as prefix) and the schedule constructors (no prefix).
#pragma once

#include <stepwise/lr_schedules.h>

#include <cstdint>
#include <string>

namespace stepwise::detail {

/// warmup_num_steps > 0, and >= 2 with log warmup (ln(1) = 0). `prefix` is
/// prepended to the key in the message ("scheduler.params." or "").
void check_warmup_steps(int64_t steps, WarmupType type, const std::string& prefix);
/// total_num_steps > warmup_num_steps.
void check_total_steps(int64_t total, int64_t warmup, const std::string& prefix);

}  // namespace stepwise::detail
