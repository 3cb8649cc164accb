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
// A user's ds_config.json works unchanged where it only uses supported keys, or
// DeepSpeed features that are off or that do not change the numbers (those are listed
// in `notes`). Unknown keys, wrong types and unsupported DeepSpeed features turned on
// are ConfigErrors naming the JSON path, the value and the fix, all of a file's problems
// in one error; inconsistent batch sizes are named at initialize. Nothing is silently
// ignored.
#pragma once

#include <stepwise/accumulation.h>
#include <stepwise/checkpoint.h>
#include <stepwise/gradient_reducer.h>
#include <stepwise/guard_rails.h>
#include <stepwise/lr_schedules.h>
#include <stepwise/monitor.h>
#include <stepwise/optimizers.h>
#include <stepwise/precision.h>
#include <stepwise/zero.h>

#include <torch/arg.h>
#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace stepwise {

// NOTE: [components own their options] Each component declares its options in its own
// header (OptimizerOptions, ScheduleOptions, PrecisionOptions with LossScalerOptions,
// AccumulationOptions, GuardRailOptions, distributed::ReducerOptions,
// CheckpointOptions, CsvMonitorOptions) and is usable without any JSON. The config maps DeepSpeed's
// keys onto those options, once; nothing but the engine's construction reads a Config. The
// dependency direction is one way: components -> config -> engine.

/// The values that fill HF's `"auto"` placeholders, named after HF's TrainingArguments,
/// with the meaning the HF Trainer gives each (transformers' integrations/deepspeed.py,
/// HfTrainerDeepSpeedConfig): see docs/config.md, "HF's auto". Unset fields fill nothing.
struct AutoValues {
  /// train_micro_batch_size_per_gpu.
  TORCH_ARG(std::optional<int64_t>, per_device_train_batch_size) = std::nullopt;
  /// gradient_accumulation_steps.
  TORCH_ARG(std::optional<int64_t>, gradient_accumulation_steps) = std::nullopt;
  /// gradient_clipping.
  TORCH_ARG(std::optional<double>, max_grad_norm) = std::nullopt;
  /// optimizer.params.lr and scheduler.params.warmup_max_lr.
  TORCH_ARG(std::optional<double>, learning_rate) = std::nullopt;
  /// optimizer.params.betas[0].
  TORCH_ARG(std::optional<double>, adam_beta1) = std::nullopt;
  /// optimizer.params.betas[1].
  TORCH_ARG(std::optional<double>, adam_beta2) = std::nullopt;
  /// optimizer.params.eps.
  TORCH_ARG(std::optional<double>, adam_epsilon) = std::nullopt;
  /// optimizer.params.weight_decay.
  TORCH_ARG(std::optional<double>, weight_decay) = std::nullopt;
  /// scheduler.params.warmup_num_steps (HF: args.get_warmup_steps(num_training_steps)).
  TORCH_ARG(std::optional<int64_t>, warmup_steps) = std::nullopt;
  /// scheduler.params.total_num_steps (HF: the number of optimizer steps it will run).
  TORCH_ARG(std::optional<int64_t>, num_training_steps) = std::nullopt;
  /// fp16.enabled (HF: --fp16).
  TORCH_ARG(std::optional<bool>, fp16) = std::nullopt;
  /// bf16.enabled (HF: --bf16).
  TORCH_ARG(std::optional<bool>, bf16) = std::nullopt;
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
  /// The "csv_monitor" section.
  CsvMonitorOptions csv_monitor;
  /// The "zero_optimization" section: the ZeRO stage (0 or 1) and its bucket.
  distributed::ZeroOptions zero;
  /// What the file asks for that has no effect in stepwise (DeepSpeed keys turned on
  /// that only observe or arrange, ZeRO keys at stage 0): one line each, which
  /// stepwise::initialize prints once, on rank 0. Nothing is silently ignored.
  std::vector<std::string> notes;
  /// The JSON this config was parsed from (compact), which checkpoints save with the
  /// batch sizes resolved; empty for a Config built in C++ (then they save only those).
  std::string json_text;

  /// Parses a JSON text. Throws ConfigError on any problem. `auto_values` fill HF's
  /// `"auto"` placeholders; an `"auto"` left unfilled is a problem naming the field,
  /// except in a batch size that the other two determine.
  static Config from_string(const std::string& json_text, const AutoValues& auto_values = {});
  /// Reads and parses a JSON file (a ds_config.json).
  static Config from_file(const std::string& path, const AutoValues& auto_values = {});
  /// Parses an already-parsed JSON object.
  static Config from_json(const nlohmann::json& json, const AutoValues& auto_values = {});

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

/// A DeepSpeed key that no stepwise component reads: what the parser does with it
/// (docs/config.md, "DeepSpeed features stepwise does not implement").
struct DeepSpeedFeatureKey {
  /// Its JSON path: "amp", "fp16.auto_cast", ...
  std::string path;
  /// What leaves it off, accepted without a word: "enabled: false" (a section whose
  /// "enabled" is false or absent), "-" (present means on), or DeepSpeed's default as JSON.
  std::string off;
  /// "note" (on, it is accepted with a note: it does not change the numbers) or
  /// "refused" (on, it is a ConfigError: it would).
  std::string when_on;
  /// Why: the note's or the refusal's reason.
  std::string why;
};

/// Every such key, read by the parser's own table (so the page cannot drift from it).
std::vector<DeepSpeedFeatureKey> deepspeed_feature_keys();

/// Every key the parser accepts, with its type and default, in the order the
/// parser reads them. Recorded from the parser's own reads, so it cannot drift
/// from what from_json accepts (see docs/config.md, which is checked against it).
const std::vector<ConfigKey>& config_keys();

}  // namespace stepwise
