// stepwise: DeepSpeed JSON configuration, parsed once into typed structs.
//
// Usage:
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

#include <stepwise/lr_schedules.h>

#include <nlohmann/json_fwd.hpp>

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

namespace stepwise {

/// The `"optimizer"` section. `type` is "Adam", "AdamW" or "SGD".
/// NOTE: [Adam means AdamW] As in DeepSpeed, `"type": "Adam"` applies weight
/// decay decoupled (AdamW) unless `"adam_w_mode": false`.
struct OptimizerConfig {
  std::string type;
  double lr = 1e-3;
  std::array<double, 2> betas{0.9, 0.999};
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool adam_w_mode = true;
  bool amsgrad = false;
  double momentum = 0.0;
  double dampening = 0.0;
  bool nesterov = false;
};

/// The `"scheduler"` section: its type name and typed parameters.
struct SchedulerConfig {
  std::string type;
  std::variant<WarmupLROptions, WarmupDecayLROptions, WarmupCosineLROptions, OneCycleOptions,
               LRRangeTestOptions>
      params;
};

/// The `"fp16"` section (DeepSpeed's keys and defaults).
struct Fp16Config {
  bool enabled = false;
  /// > 0: static scale; 0: dynamic.
  double loss_scale = 0.0;
  int64_t initial_scale_power = 16;
  int64_t loss_scale_window = 1000;
  int64_t hysteresis = 2;
  bool consecutive_hysteresis = false;
  double min_loss_scale = 1.0;
};

/// The `"bf16"` section.
struct Bf16Config {
  bool enabled = false;
};

/// The `"stepwise"` section: options DeepSpeed does not have.
struct StepwiseOptions {
  /// Refuse backward() twice without step() and step() without backward().
  bool strict_cadence = true;
  /// Divide the loss by GAS in backward() (DeepSpeed's behaviour, default on).
  bool scale_wrt_gas = true;
  /// Elements per flat all-reduce bucket when W > 1 (DeepSpeed's stage-0 bucket
  /// is 500,000,000 elements and has no key).
  int64_t reduce_bucket_size = 500000000;
};

/// Batch sizes after SEMANTICS section 2: tb == micro_batch * gas * world_size.
struct BatchSizes {
  int64_t train_batch_size = 0;
  int64_t micro_batch = 0;
  int64_t gradient_accumulation_steps = 0;
  int64_t world_size = 1;
};

/// A whole configuration. Fields are std::optional where "not set" and a
/// default differ (the batch sizes are derived from each other).
struct Config {
  std::optional<int64_t> train_batch_size;
  std::optional<int64_t> train_micro_batch_size_per_gpu;
  std::optional<int64_t> gradient_accumulation_steps;
  /// Clip the global L2 norm of the gradients to this value; 0 = off.
  double gradient_clipping = 0.0;
  /// Print a progress line every this many optimizer steps.
  int64_t steps_per_print = 10;
  /// Add time spent in backward() and step() to the progress line.
  bool wall_clock_breakdown = false;
  std::optional<OptimizerConfig> optimizer;
  std::optional<SchedulerConfig> scheduler;
  Fp16Config fp16;
  Bf16Config bf16;
  /// zero_optimization.stage: only 0 is supported.
  int64_t zero_stage = 0;
  StepwiseOptions stepwise;

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

/// Every top-level key stepwise accepts, for docs and error messages.
const std::vector<std::string>& supported_top_level_keys();

}  // namespace stepwise
