#include <stepwise/config.h>
#include <stepwise/errors.h>

#include "check.h"
#include "json_reader.h"
#include "lr_schedules_detail.h"
#include "optimizers_detail.h"
#include "option_checks.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <fstream>
#include <sstream>

namespace stepwise {

using detail::join;
using detail::ObjectReader;
using detail::show;

namespace {

// DeepSpeed keys that stepwise knows but does not implement: an error names them
// instead of an "unknown key" message, so the user knows it is a feature gap.
const std::vector<std::string>& unsupported_deepspeed_keys() {
  static const std::vector<std::string> keys = {"amp",
                                                "activation_checkpointing",
                                                "aio",
                                                "autotuning",
                                                "comms_logger",
                                                "communication_data_type",
                                                "compression_training",
                                                "curriculum_learning",
                                                "data_efficiency",
                                                "data_types",
                                                "disable_allgather",
                                                "dump_state",
                                                "elasticity",
                                                "flops_profiler",
                                                "fp32_allreduce",
                                                "gradient_predivide_factor",
                                                "memory_breakdown",
                                                "pipeline",
                                                "prescale_gradients",
                                                "sparse_attention",
                                                "sparse_gradients",
                                                "tensorboard",
                                                "wandb",
                                                "csv_monitor",
                                                "zero_allow_untested_optimizer",
                                                "zero_force_ds_cpu_optimizer",
                                                "seq_parallel_size",
                                                "tensor_parallel",
                                                "monitor_config"};
  return keys;
}

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

OptimizerOptions parse_optimizer(ObjectReader r) {
  OptimizerOptions out;
  r.require("type", out.type(),
            "optimizer.type is missing; use one of: " + join(supported_optimizer_types()));
  // DeepSpeed lower-cases the names of its own optimizers ("adam", "ADAMW", ...); SGD goes
  // to torch.optim by its exact name.
  std::string lower = out.type();
  for (auto& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (lower == "adam") out.type("Adam");
  if (lower == "adamw") out.type("AdamW");
  auto p = r.object_or_empty("params");
  p.get("lr", out.lr());
  p.get("weight_decay", out.weight_decay());
  if (out.type() == "SGD") {
    p.get("momentum", out.momentum());
    p.get("dampening", out.dampening());
    p.get("nesterov", out.nesterov());
  } else {  // Adam, AdamW (an unknown type is named by validate() below)
    p.get("betas", out.betas());
    p.get("eps", out.eps());
    p.get("adam_w_mode", out.adam_w_mode());
    p.get("amsgrad", out.amsgrad());
    p.get("torch_adam", out.torch_adam());
  }
  r.finish();
  at_path([&] { validate(out); },
          [](const std::string& option) {
            return option == "type" ? "optimizer.type" : "optimizer.params." + option;
          });
  p.finish();
  return out;
}

void read_warmup_type(ObjectReader& p, WarmupType& out) {
  std::string text = to_string(out);
  if (p.get("warmup_type", text)) {
    out = parse_warmup_type(text, p.path_of("warmup_type"));
  }
}

// One schedule's params. Required keys are read last, so every key is asked
// for (and recorded: NOTE: [one source per key]) before a missing one throws.
void read_params(ObjectReader& p, WarmupLROptions& o) {
  p.get("warmup_min_lr", o.warmup_min_lr());
  p.get("warmup_max_lr", o.warmup_max_lr());
  p.get("warmup_num_steps", o.warmup_num_steps());
  read_warmup_type(p, o.warmup_type());
}

void read_params(ObjectReader& p, WarmupDecayLROptions& o) {
  read_params(p, o.warmup());
  p.require("total_num_steps", o.total_num_steps(),
            "scheduler.params.total_num_steps is required for WarmupDecayLR");
}

void read_params(ObjectReader& p, WarmupCosineLROptions& o) {
  p.get("warmup_min_ratio", o.warmup_min_ratio());
  p.get("warmup_num_steps", o.warmup_num_steps());
  p.get("cos_min_ratio", o.cos_min_ratio());
  read_warmup_type(p, o.warmup_type());
  p.require("total_num_steps", o.total_num_steps(),
            "scheduler.params.total_num_steps is required for WarmupCosineLR");
}

void read_params(ObjectReader& p, OneCycleOptions& o) {
  p.get("decay_lr_rate", o.decay_lr_rate());
  p.get("cycle_first_step_size", o.cycle_first_step_size());
  p.get("cycle_second_step_size", o.cycle_second_step_size());
  p.get("decay_step_size", o.decay_step_size());
  p.get("cycle_momentum", o.cycle_momentum());
  p.get("cycle_min_mom", o.cycle_min_mom());
  p.get("cycle_max_mom", o.cycle_max_mom());
  p.get("decay_mom_rate", o.decay_mom_rate());
  const bool min_given = p.get_required("cycle_min_lr", o.cycle_min_lr());
  const bool max_given = p.get_required("cycle_max_lr", o.cycle_max_lr());
  STEPWISE_CHECK(min_given && max_given, ConfigError,
                 "scheduler.params.cycle_min_lr and scheduler.params.cycle_max_lr are "
                 "required for OneCycle");
}

void read_params(ObjectReader& p, LRRangeTestOptions& o) {
  p.get("lr_range_test_min_lr", o.lr_range_test_min_lr());
  p.get("lr_range_test_step_size", o.lr_range_test_step_size());
  p.get("lr_range_test_step_rate", o.lr_range_test_step_rate());
  p.get("lr_range_test_staircase", o.lr_range_test_staircase());
}

ScheduleOptions parse_scheduler(ObjectReader r) {
  std::string type;
  r.require("type", type,
            "scheduler.type is missing; use one of: " + join(supported_scheduler_types()));
  ScheduleOptions out = default_schedule_options(type, "scheduler.type");
  auto p = r.object_or_empty("params");
  std::visit([&](auto& options) { read_params(p, options); }, out);
  r.finish();
  p.finish();
  at_path([&] { validate(out); },
          [](const std::string& option) { return "scheduler.params." + option; });
  return out;
}

// DeepSpeed's "fp16" keys, mapped onto the loss scaler's options: a loss_scale > 0 is a
// static scale, 0 a dynamic one starting at 2^initial_scale_power.
LossScalerOptions parse_fp16(ObjectReader r, bool& enabled) {
  double loss_scale = 0.0;
  int64_t initial_scale_power = 16;
  LossScalerOptions out;
  r.get("enabled", enabled);
  r.get("loss_scale", loss_scale);
  r.get("initial_scale_power", initial_scale_power);
  r.get("loss_scale_window", out.scale_window());
  r.get("hysteresis", out.hysteresis());
  r.get("consecutive_hysteresis", out.consecutive_hysteresis());
  r.get("min_loss_scale", out.min_scale());
  r.finish();
  detail::check_in_range("fp16.loss_scale", loss_scale, 0.0, detail::kFloatMax);
  STEPWISE_CHECK(initial_scale_power >= 0 && initial_scale_power <= 64, ConfigError,
                 "fp16.initial_scale_power must be in 0..64, got ", initial_scale_power);
  const bool dynamic = loss_scale <= 0.0;
  out.dynamic(dynamic).init_scale(dynamic ? std::ldexp(1.0, static_cast<int>(initial_scale_power))
                                          : loss_scale);
  // The scaler's own checks, named by the keys its options come from.
  at_path([&] { LossScaler{out}; },
          [&](const std::string& option) -> std::string {
            if (option == "scale_window") return "fp16.loss_scale_window";
            if (option == "min_scale") return "fp16.min_loss_scale";
            if (option == "init_scale") {
              return dynamic ? "fp16.initial_scale_power" : "fp16.loss_scale";
            }
            return "fp16." + option;  // hysteresis
          });
  return out;
}

void parse_zero(ObjectReader r, Config& out) {
  r.get("stage", out.zero_stage);
  r.finish();
  STEPWISE_CHECK(out.zero_stage == 0, ConfigError, "zero_optimization.stage ", out.zero_stage,
                 " is not supported (ZeRO is not implemented); use stage 0 or remove the "
                 "zero_optimization section");
}

void parse_checkpoint(ObjectReader r, CheckpointOptions& out) {
  std::string mode = "Warn";
  r.get("tag_validation", mode);
  r.finish();
  std::string upper = mode;
  for (auto& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  STEPWISE_CHECK(upper == "IGNORE" || upper == "WARN" || upper == "FAIL", ConfigError,
                 "checkpoint.tag_validation is \"", mode,
                 "\"; use one of: Ignore, Warn, Fail (case does not matter)");
  out.tag_validation(upper == "IGNORE" ? TagValidation::kIgnore
                     : upper == "FAIL" ? TagValidation::kFail
                                       : TagValidation::kWarn);
}

// The "stepwise" section: options DeepSpeed does not have, for three components.
void parse_stepwise(ObjectReader r, Config& out) {
  r.get("strict_cadence", out.accumulation.strict_cadence());
  r.get("scale_wrt_gas", out.accumulation.scale_wrt_gas());
  r.get("check_grads_cleared", out.guard_rails.check_grads_cleared());
  r.get("check_grads_changed", out.guard_rails.check_grads_changed());
  r.get("check_params_changed", out.guard_rails.check_params_changed());
  r.get("reduce_bucket_size", out.reducer.bucket_size());
  r.get("overlap_comm", out.reducer.overlap_comm());
  r.finish();
  detail::check_positive("stepwise.reduce_bucket_size", out.reducer.bucket_size());
}

}  // namespace

Config Config::from_json(const nlohmann::json& json) {
  ObjectReader r(json, "");
  for (const auto& key : unsupported_deepspeed_keys()) {
    STEPWISE_CHECK(!json.contains(key), ConfigError, "\"", key,
                   "\" is a DeepSpeed feature stepwise does not support; remove the key (its "
                   "value was ",
                   show(json.at(key)), ")");
  }
  Config out;
  r.get("train_batch_size", out.train_batch_size);
  r.get("train_micro_batch_size_per_gpu", out.train_micro_batch_size_per_gpu);
  r.get("gradient_accumulation_steps", out.gradient_accumulation_steps);
  r.get("gradient_clipping", out.gradient_clipping);
  detail::check_in_range("gradient_clipping", out.gradient_clipping, 0.0, detail::kFloatMax);
  r.get("steps_per_print", out.steps_per_print);
  detail::check_positive("steps_per_print", out.steps_per_print);
  r.get("wall_clock_breakdown", out.wall_clock_breakdown);
  if (auto o = r.object("optimizer")) out.optimizer = parse_optimizer(*o);
  if (auto o = r.object("scheduler")) out.scheduler = parse_scheduler(*o);
  bool fp16 = false;
  bool bf16 = false;
  if (auto o = r.object("fp16")) out.precision.loss_scaler(parse_fp16(*o, fp16));
  if (auto o = r.object("bf16")) {
    o->get("enabled", bf16);
    o->finish();
  }
  STEPWISE_CHECK(!(fp16 && bf16), ConfigError,
                 "fp16.enabled and bf16.enabled are both true; enable at most one");
  out.precision.mode(fp16   ? PrecisionMode::kFp16
                     : bf16 ? PrecisionMode::kBf16
                            : PrecisionMode::kFp32);
  if (auto o = r.object("zero_optimization")) parse_zero(*o, out);
  if (auto o = r.object("stepwise")) parse_stepwise(*o, out);
  if (auto o = r.object("checkpoint")) parse_checkpoint(*o, out.checkpoint);
  r.finish();
  out.json_text = json.dump();
  return out;
}

const std::vector<ConfigKey>& config_keys() {
  static const std::vector<ConfigKey> keys = [] {
    // One probe reads every section; one per optimizer and scheduler type reads
    // that type's params. A type with required params throws after reading the
    // others (read_params), which is all the recording needs.
    std::vector<nlohmann::json> probes = {{{"fp16", nlohmann::json::object()},
                                           {"bf16", nlohmann::json::object()},
                                           {"zero_optimization", nlohmann::json::object()},
                                           {"stepwise", nlohmann::json::object()},
                                           {"checkpoint", nlohmann::json::object()}}};
    for (const auto& type : supported_optimizer_types()) {
      probes.push_back({{"optimizer", {{"type", type}}}});
    }
    for (const auto& type : supported_scheduler_types()) {
      probes.push_back({{"scheduler", {{"type", type}}}});
    }
    std::vector<ConfigKey> recorded;
    {
      detail::KeyRecording recording(recorded);
      for (const auto& probe : probes) {
        try {
          Config::from_json(probe);
        } catch (const ConfigError&) {
        }
      }
    }
    std::vector<ConfigKey> unique;
    for (const auto& key : recorded) {
      auto same = std::find_if(unique.begin(), unique.end(),
                               [&](const ConfigKey& k) { return k.path == key.path; });
      if (same == unique.end()) {
        unique.push_back(key);
        continue;
      }
      TORCH_INTERNAL_ASSERT(same->type == key.type && same->default_value == key.default_value,
                            "config key ", key.path, " is read as ", same->type, " = ",
                            same->default_value, " and as ", key.type, " = ", key.default_value);
    }
    return unique;
  }();
  return keys;
}

Config Config::from_string(const std::string& json_text) {
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(json_text);
  } catch (const nlohmann::json::parse_error& e) {
    throw ConfigError(c10::str("the configuration is not valid JSON: ", e.what()));
  }
  return from_json(json);
}

Config Config::from_file(const std::string& path) {
  std::ifstream in(path);
  STEPWISE_CHECK(in.good(), ConfigError, "cannot open the configuration file \"", path,
                 "\"; check the path (relative paths start at the working directory)");
  std::stringstream text;
  text << in.rdbuf();
  try {
    return from_string(text.str());
  } catch (const ConfigError& e) {
    throw ConfigError(c10::str(path, ": ", e.what()));
  }
}

}  // namespace stepwise
