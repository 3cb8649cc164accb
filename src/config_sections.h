// The config layer's section readers for precision ("fp16", "bf16"), ZeRO
// ("zero_optimization") and "checkpoint": each maps one DeepSpeed section onto the
// options of the component that owns them. Config::from_json (config.cpp) calls them.
#pragma once

#include <stepwise/config.h>
#include <stepwise/errors.h>

#include "json_reader.h"

#include <string>
#include <vector>

namespace stepwise::detail {

// Runs `check` (an options validator) and rethrows its error about one option with
// that option's JSON path in place of its name. see NOTE: [option errors]
template <class Check, class PathOf>
void at_path(Check&& check, PathOf&& path_of) {
  try {
    check();
  } catch (const ConfigError& e) {
    if (e.option().empty()) throw;
    throw ConfigError(path_of(e.option()), e.problem());
  }
}

/// "fp16": the loss scaler's options; `enabled` is set from fp16.enabled.
LossScalerOptions parse_fp16(ObjectReader r, bool& enabled, std::vector<std::string>& notes);
/// "bf16" (or its older name "bfloat16"): `enabled` is set from bf16.enabled.
void parse_bf16(ObjectReader r, bool& enabled, std::vector<std::string>& notes);
/// "zero_optimization" as an object: the stage, and the keys that have no effect at it.
void parse_zero(ObjectReader r, Config& out);
/// "zero_optimization": true or false, DeepSpeed's deprecated form.
void parse_zero_legacy(bool enabled, Config& out);
/// "checkpoint": tag validation, and the checkpoint features DeepSpeed has.
void parse_checkpoint(ObjectReader r, CheckpointOptions& out, std::vector<std::string>& notes);

/// "csv_monitor": enabled, output_path, job_name.
void parse_csv_monitor(ObjectReader r, CsvMonitorOptions& out);

}  // namespace stepwise::detail
