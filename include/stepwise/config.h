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

#include <stepwise/lr_schedules.h>

#include <nlohmann/json_fwd.hpp>

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace stepwise {

/// The `"optimizer"` section. `type` is "Adam", "AdamW" or "SGD".
/// NOTE: [Adam means AdamW] As in DeepSpeed, `"type": "Adam"` applies weight
/// decay decoupled (AdamW) unless `"adam_w_mode": false`.
struct OptimizerConfig {
  /// The type name as in DeepSpeed's config.
  std::string type;
  /// Learning rate (optimizer.params.lr).
  double lr = 1e-3;
  /// Adam/AdamW (beta1, beta2).
  std::array<double, 2> betas{0.9, 0.999};
  /// Adam/AdamW term added to the denominator.
  double eps = 1e-8;
  /// Weight decay; decoupled for AdamW, and for Adam unless adam_w_mode is false.
  double weight_decay = 0.0;
  /// Adam only: true (default) means decoupled weight decay, i.e. AdamW.
  bool adam_w_mode = true;
  /// Adam/AdamW: the AMSGrad variant.
  bool amsgrad = false;
  /// Adam/AdamW: true = LibTorch's torch::optim::Adam/AdamW, false = stepwise's
  /// FusedAdamW (fused_adamw.h); unset = fused when the parameters are on CUDA.
  std::optional<bool> torch_adam;
  /// SGD momentum.
  double momentum = 0.0;
  /// SGD dampening.
  double dampening = 0.0;
  /// SGD Nesterov momentum.
  bool nesterov = false;
};

/// The `"scheduler"` section: the typed parameters of one schedule.
struct SchedulerConfig {
  /// The schedule's options; which alternative it holds is the schedule's type.
  ScheduleOptions params;
  /// The type name as in DeepSpeed's config ("WarmupLR", ...).
  std::string type() const;
};

/// The `"fp16"` section (DeepSpeed's keys and defaults).
struct Fp16Config {
  /// Whether this precision is on.
  bool enabled = false;
  /// > 0: static scale; 0: dynamic.
  double loss_scale = 0.0;
  /// Dynamic scaling starts at S = 2^initial_scale_power.
  int64_t initial_scale_power = 16;
  /// Good steps since the last overflow before S doubles.
  int64_t loss_scale_window = 1000;
  /// Overflows tolerated before S halves.
  int64_t hysteresis = 2;
  /// Refill the hysteresis budget on every good step.
  bool consecutive_hysteresis = false;
  /// S never goes below this; an overflow there is an error.
  double min_loss_scale = 1.0;
};

/// The `"bf16"` section.
struct Bf16Config {
  /// Whether this precision is on.
  bool enabled = false;
};

/// The `"stepwise"` section: options DeepSpeed does not have.
struct StepwiseOptions {
  /// Refuse backward() twice without step() and step() without backward().
  bool strict_cadence = true;
  /// Divide the loss by GAS in backward() (DeepSpeed's behaviour, default on).
  bool scale_wrt_gas = true;
  /// Refuse gradients cleared or changed between micro-steps of a window (a
  /// leftover zero_grad(); docs/gradient-accumulation.md, pitfall 5).
  bool check_grads_cleared = true;
  /// Refuse gradients changed between backward() and step() (a leftover
  /// clip_grad_norm_; pitfall 5).
  bool check_grads_changed = true;
  /// Refuse parameters updated outside step() (a leftover optimizer.step(); pitfall 5).
  bool check_params_changed = true;
  /// Elements per flat all-reduce bucket when W > 1 (DeepSpeed's stage-0 bucket
  /// is 500,000,000 elements and has no key).
  int64_t reduce_bucket_size = 500000000;
  /// When W > 1, start each bucket's all-reduce during the backward() that ends the
  /// window, as soon as the bucket is full (DeepSpeed's overlap_comm); false: all at
  /// step() (NOTE: [bucket views]).
  bool overlap_comm = true;
};

/// What a save does when the ranks pass different checkpoint tags
/// (`checkpoint.tag_validation`, DeepSpeed's values).
enum class TagValidation {
  /// Do not compare the tags.
  kIgnore,
  /// Print a warning on rank 0 and save anyway.
  kWarn,
  /// Throw CheckpointError on every rank; nothing is written.
  kFail,
};

/// The `"checkpoint"` section.
struct CheckpointConfig {
  /// Whether the ranks' tags are compared before a save (default Warn).
  TagValidation tag_validation = TagValidation::kWarn;
};

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

/// A whole configuration. Fields are std::optional where "not set" and a
/// default differ (the batch sizes are derived from each other).
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
  std::optional<OptimizerConfig> optimizer;
  /// The "scheduler" section, if present.
  std::optional<SchedulerConfig> scheduler;
  /// The "fp16" section.
  Fp16Config fp16;
  /// The "bf16" section.
  Bf16Config bf16;
  /// zero_optimization.stage: only 0 is supported.
  int64_t zero_stage = 0;
  /// The "stepwise" section.
  StepwiseOptions stepwise;
  /// The "checkpoint" section.
  CheckpointConfig checkpoint;
  /// The JSON this config was parsed from (compact); checkpoints save it.
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
