// stepwise: DeepSpeed JSON configuration, parsed once into typed structs.
//
// Usage {.cpp .fragment context="basic"}:
//
//   auto config = stepwise::Config::from_string(R"({
//     "train_batch_size": 32,
//     "gradient_accumulation_steps": 4,
//     "gradient_clipping": 1.0,
//     "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
//     "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 100}}
//   })");
//   stepwise::BatchSizes sizes = config.resolve_batch_sizes(/*world_size=*/1);
//   // sizes.micro_batch == 8: derived from train_batch_size / GAS
//
// A user's ds_config.json works unchanged where it only uses supported keys.
// Unknown keys, wrong types, unsupported DeepSpeed features and inconsistent
// batch sizes are ConfigErrors naming the JSON path, the value and the fix:
// nothing is silently ignored.
#pragma once

#include <stepwise/accumulation.h>
#include <stepwise/checkpoint.h>
#include <stepwise/gradient_reducer.h>
#include <stepwise/guard_rails.h>
#include <stepwise/lr_schedules.h>
#include <stepwise/optimizers.h>
#include <stepwise/precision.h>

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace stepwise {

// NOTE: [components own their options] Each component declares its options in its own
// header (OptimizerOptions, ScheduleOptions, PrecisionOptions with LossScalerOptions,
// AccumulationOptions, GuardRailOptions, distributed::ReducerOptions,
// CheckpointOptions) and is usable without any JSON. The config maps DeepSpeed's keys
// onto those options, once; nothing but the engine's construction reads a Config.
// The dependency direction is one way: components -> config -> engine.

/// Resolved batch sizes: tb == micro_batch * gas * world_size (docs/config.md, "Batch sizes").
struct BatchSizes {
  /// Samples per optimizer step over all ranks (tb).
  int64_t train_batch_size = 0;
  /// Samples per micro-batch on one rank (mbs).
  int64_t micro_batch = 0;
  /// Micro-batches per optimizer step (GAS).
  int64_t gradient_accumulation_steps = 0;
  /// Data-parallel ranks (W).
  int64_t world_size = 1;
};

/// A whole configuration: DeepSpeed's keys mapped onto the components' options.
/// Fields are std::optional where "not set" and a default differ (the batch sizes are
/// derived from each other).
struct Config {
  /// train_batch_size, if set.
  std::optional<int64_t> train_batch_size;
  /// train_micro_batch_size_per_gpu, if set.
  std::optional<int64_t> train_micro_batch_size_per_gpu;
  /// gradient_accumulation_steps, if set.
  std::optional<int64_t> gradient_accumulation_steps;
  /// Clip the global L2 norm of the gradients to this value; 0 = off.
  double gradient_clipping = 0.0;
  /// Print a progress line every this many optimizer steps.
  int64_t steps_per_print = 10;
  /// Add time spent in backward() and step() to the progress line.
  bool wall_clock_breakdown = false;
  /// The "optimizer" section, if present.
  std::optional<OptimizerOptions> optimizer;
  /// The "scheduler" section, if present (its type is the alternative it holds).
  std::optional<ScheduleOptions> scheduler;
  /// The "fp16" and "bf16" sections.
  PrecisionOptions precision;
  /// stepwise.strict_cadence and stepwise.scale_wrt_gas.
  AccumulationOptions accumulation;
  /// stepwise.check_grads_cleared, check_grads_changed and check_params_changed.
  GuardRailOptions guard_rails;
  /// stepwise.reduce_bucket_size and stepwise.overlap_comm.
  distributed::ReducerOptions reducer;
  /// The "checkpoint" section.
  CheckpointOptions checkpoint;
  /// zero_optimization.stage: only 0 is supported.
  int64_t zero_stage = 0;
  /// The JSON this config was parsed from (compact), which checkpoints save with the
  /// batch sizes resolved; empty for a Config built in C++ (then they save only those).
  std::string json_text;

  /// Parses a JSON text. Throws ConfigError on any problem.
  static Config from_string(const std::string& json_text);
  /// Reads and parses a JSON file (a ds_config.json).
  static Config from_file(const std::string& path);
  /// Parses an already-parsed JSON object.
  static Config from_json(const nlohmann::json& json);

  /// Resolves the three batch sizes with `world_size` data-parallel ranks.
  /// Throws ConfigError naming the values when they are missing or inconsistent.
  BatchSizes resolve_batch_sizes(int64_t world_size) const;
};

/// One key Config::from_json accepts.
struct ConfigKey {
  /// Its JSON path, for example "optimizer.params.lr".
  std::string path;
  /// "integer", "number", "bool", "string", "[number, number]" or "object".
  std::string type;
  /// The value used when the key is absent, as JSON ("0.001", "\"log\""), or
  /// "unset", "required" or (for an object) "none".
  std::string default_value;
};

/// Every key the parser accepts, with its type and default, in the order the
/// parser reads them. Recorded from the parser's own reads, so it cannot drift
/// from what from_json accepts (see docs/config.md, which is checked against it).
const std::vector<ConfigKey>& config_keys();

}  // namespace stepwise
