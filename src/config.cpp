#include <stepwise/config.h>
#include <stepwise/errors.h>

#include "json_reader.h"
#include "schedule_checks.h"

#include <nlohmann/json.hpp>

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
                                                "checkpoint",
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

void check_positive(int64_t value, const std::string& path) {
  STEPWISE_CHECK(value > 0, ConfigError, path, " must be a positive integer, got ", value);
}

void check_non_negative(double value, const std::string& path) {
  STEPWISE_CHECK(value >= 0.0, ConfigError, path, " must be >= 0, got ", value);
}

OptimizerConfig parse_optimizer(const nlohmann::json& json) {
  ObjectReader r(json, "optimizer");
  OptimizerConfig out;
  STEPWISE_CHECK(r.get("type", out.type), ConfigError,
                 "optimizer.type is missing; use one of: Adam, AdamW, SGD");
  const bool adam = out.type == "Adam" || out.type == "AdamW";
  STEPWISE_CHECK(adam || out.type == "SGD", ConfigError, "optimizer.type \"", out.type,
                 "\" is not supported; use one of: Adam, AdamW, SGD (names are case-sensitive)");
  std::vector<std::string> valid = {"lr", "weight_decay"};
  if (r.has("params")) {
    ObjectReader p(r.raw("params"), "optimizer.params");
    p.get("lr", out.lr);
    p.get("weight_decay", out.weight_decay);
    if (adam) {
      valid.insert(valid.end(), {"betas", "eps", "adam_w_mode", "amsgrad", "torch_adam"});
      p.get("betas", out.betas);
      p.get("eps", out.eps);
      p.get("adam_w_mode", out.adam_w_mode);
      p.get("amsgrad", out.amsgrad);
      if (p.has("torch_adam")) {
        bool torch_adam = true;
        p.get("torch_adam", torch_adam);
        out.torch_adam = torch_adam;
      }
    } else {
      valid.insert(valid.end(), {"momentum", "dampening", "nesterov"});
      p.get("momentum", out.momentum);
      p.get("dampening", out.dampening);
      p.get("nesterov", out.nesterov);
    }
    p.finish(valid);
  }
  r.finish({"type", "params"});
  STEPWISE_CHECK(out.lr >= 0.0, ConfigError, "optimizer.params.lr must be >= 0, got ", out.lr);
  check_non_negative(out.weight_decay, "optimizer.params.weight_decay");
  check_non_negative(out.momentum, "optimizer.params.momentum");
  STEPWISE_CHECK(out.eps > 0.0, ConfigError, "optimizer.params.eps must be > 0, got ", out.eps);
  for (double beta : out.betas) {
    STEPWISE_CHECK(beta >= 0.0 && beta < 1.0, ConfigError,
                   "optimizer.params.betas must be two numbers in [0, 1), got [", out.betas[0],
                   ", ", out.betas[1], "]");
  }
  STEPWISE_CHECK(!out.nesterov || (out.momentum > 0.0 && out.dampening == 0.0), ConfigError,
                 "optimizer.params.nesterov needs momentum > 0 and dampening 0, got momentum ",
                 out.momentum, " and dampening ", out.dampening);
  STEPWISE_CHECK(!(out.amsgrad && out.torch_adam == false), ConfigError,
                 "optimizer.params.amsgrad is true but torch_adam is false: the fused Adam has no "
                 "AMSGrad; set \"torch_adam\": true (or drop amsgrad)");
  return out;
}

void get_warmup_type(ObjectReader& p, WarmupType& out) {
  std::string text;
  if (p.get("warmup_type", text)) {
    out = parse_warmup_type(text, p.path_of("warmup_type"));
  }
}

SchedulerConfig parse_scheduler(const nlohmann::json& json) {
  ObjectReader r(json, "scheduler");
  SchedulerConfig out;
  STEPWISE_CHECK(r.get("type", out.type), ConfigError,
                 "scheduler.type is missing; use one of: WarmupLR, WarmupDecayLR, "
                 "WarmupCosineLR, OneCycle, LRRangeTest");
  static const nlohmann::json kEmpty = nlohmann::json::object();
  ObjectReader p(r.has("params") ? r.raw("params") : kEmpty, "scheduler.params");
  const std::string path = "scheduler.params";
  if (out.type == "WarmupLR" || out.type == "WarmupDecayLR") {
    WarmupDecayLROptions o;
    p.get("warmup_min_lr", o.warmup_min_lr());
    p.get("warmup_max_lr", o.warmup_max_lr());
    p.get("warmup_num_steps", o.warmup_num_steps());
    get_warmup_type(p, o.warmup_type());
    detail::check_warmup_steps(o.warmup_num_steps(), o.warmup_type(), path + ".");
    if (out.type == "WarmupLR") {
      p.finish({"warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type"});
      out.params = WarmupLROptions()
                       .warmup_min_lr(o.warmup_min_lr())
                       .warmup_max_lr(o.warmup_max_lr())
                       .warmup_num_steps(o.warmup_num_steps())
                       .warmup_type(o.warmup_type());
    } else {
      STEPWISE_CHECK(p.get("total_num_steps", o.total_num_steps()), ConfigError,
                     "scheduler.params.total_num_steps is required for WarmupDecayLR");
      p.finish(
          {"total_num_steps", "warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type"});
      detail::check_total_steps(o.total_num_steps(), o.warmup_num_steps(), path + ".");
      out.params = o;
    }
  } else if (out.type == "WarmupCosineLR") {
    WarmupCosineLROptions o;
    STEPWISE_CHECK(p.get("total_num_steps", o.total_num_steps()), ConfigError,
                   "scheduler.params.total_num_steps is required for WarmupCosineLR");
    p.get("warmup_min_ratio", o.warmup_min_ratio());
    p.get("warmup_num_steps", o.warmup_num_steps());
    p.get("cos_min_ratio", o.cos_min_ratio());
    get_warmup_type(p, o.warmup_type());
    p.finish({"total_num_steps", "warmup_min_ratio", "warmup_num_steps", "cos_min_ratio",
              "warmup_type"});
    detail::check_warmup_steps(o.warmup_num_steps(), o.warmup_type(), path + ".");
    detail::check_total_steps(o.total_num_steps(), o.warmup_num_steps(), path + ".");
    check_non_negative(o.warmup_min_ratio(), path + ".warmup_min_ratio");
    check_non_negative(o.cos_min_ratio(), path + ".cos_min_ratio");
    out.params = o;
  } else if (out.type == "OneCycle") {
    OneCycleOptions o;
    STEPWISE_CHECK(
        p.get("cycle_min_lr", o.cycle_min_lr()) && p.get("cycle_max_lr", o.cycle_max_lr()),
        ConfigError,
        "scheduler.params.cycle_min_lr and scheduler.params.cycle_max_lr are "
        "required for OneCycle");
    p.get("decay_lr_rate", o.decay_lr_rate());
    p.get("cycle_first_step_size", o.cycle_first_step_size());
    p.get("cycle_second_step_size", o.cycle_second_step_size());
    p.get("decay_step_size", o.decay_step_size());
    p.get("cycle_momentum", o.cycle_momentum());
    p.get("cycle_min_mom", o.cycle_min_mom());
    p.get("cycle_max_mom", o.cycle_max_mom());
    p.get("decay_mom_rate", o.decay_mom_rate());
    p.finish({"cycle_min_lr", "cycle_max_lr", "decay_lr_rate", "cycle_first_step_size",
              "cycle_second_step_size", "decay_step_size", "cycle_momentum", "cycle_min_mom",
              "cycle_max_mom", "decay_mom_rate"});
    check_positive(o.cycle_first_step_size(), path + ".cycle_first_step_size");
    STEPWISE_CHECK(o.decay_step_size() >= 0, ConfigError, path,
                   ".decay_step_size must be >= 0 (0 = no decay), got ", o.decay_step_size());
    check_non_negative(o.cycle_min_lr(), path + ".cycle_min_lr");
    out.params = o;
  } else if (out.type == "LRRangeTest") {
    LRRangeTestOptions o;
    p.get("lr_range_test_min_lr", o.lr_range_test_min_lr());
    p.get("lr_range_test_step_size", o.lr_range_test_step_size());
    p.get("lr_range_test_step_rate", o.lr_range_test_step_rate());
    p.get("lr_range_test_staircase", o.lr_range_test_staircase());
    p.finish({"lr_range_test_min_lr", "lr_range_test_step_size", "lr_range_test_step_rate",
              "lr_range_test_staircase"});
    check_positive(o.lr_range_test_step_size(), path + ".lr_range_test_step_size");
    out.params = o;
  } else {
    throw ConfigError(c10::str("scheduler.type \"", out.type,
                               "\" is not supported; use one of: WarmupLR, WarmupDecayLR, "
                               "WarmupCosineLR, OneCycle, LRRangeTest"));
  }
  r.finish({"type", "params"});
  return out;
}

Fp16Config parse_fp16(const nlohmann::json& json) {
  ObjectReader r(json, "fp16");
  Fp16Config out;
  r.get("enabled", out.enabled);
  r.get("loss_scale", out.loss_scale);
  r.get("initial_scale_power", out.initial_scale_power);
  r.get("loss_scale_window", out.loss_scale_window);
  r.get("hysteresis", out.hysteresis);
  r.get("consecutive_hysteresis", out.consecutive_hysteresis);
  r.get("min_loss_scale", out.min_loss_scale);
  r.finish({"enabled", "loss_scale", "initial_scale_power", "loss_scale_window", "hysteresis",
            "consecutive_hysteresis", "min_loss_scale"});
  check_non_negative(out.loss_scale, "fp16.loss_scale");
  STEPWISE_CHECK(out.initial_scale_power >= 0 && out.initial_scale_power <= 64, ConfigError,
                 "fp16.initial_scale_power must be in 0..64, got ", out.initial_scale_power);
  check_positive(out.loss_scale_window, "fp16.loss_scale_window");
  check_positive(out.hysteresis, "fp16.hysteresis");
  STEPWISE_CHECK(out.min_loss_scale > 0.0, ConfigError, "fp16.min_loss_scale must be > 0, got ",
                 out.min_loss_scale);
  const double initial = std::ldexp(1.0, static_cast<int>(out.initial_scale_power));
  STEPWISE_CHECK(out.loss_scale > 0.0 || out.min_loss_scale <= initial, ConfigError,
                 "fp16.min_loss_scale (", out.min_loss_scale,
                 ") must not exceed the initial scale 2^fp16.initial_scale_power (", initial, ")");
  return out;
}

void parse_zero(const nlohmann::json& json, Config& out) {
  ObjectReader r(json, "zero_optimization");
  r.get("stage", out.zero_stage);
  STEPWISE_CHECK(out.zero_stage == 0, ConfigError, "zero_optimization.stage ", out.zero_stage,
                 " is not supported (ZeRO is not implemented); use stage 0 or remove the "
                 "zero_optimization section");
  r.finish({"stage"});
}

}  // namespace

const std::vector<std::string>& supported_top_level_keys() {
  static const std::vector<std::string> keys = {"train_batch_size",
                                                "train_micro_batch_size_per_gpu",
                                                "gradient_accumulation_steps",
                                                "gradient_clipping",
                                                "steps_per_print",
                                                "wall_clock_breakdown",
                                                "optimizer",
                                                "scheduler",
                                                "fp16",
                                                "bf16",
                                                "zero_optimization",
                                                "stepwise"};
  return keys;
}

Config Config::from_json(const nlohmann::json& json) {
  ObjectReader r(json, "");
  for (const auto& key : unsupported_deepspeed_keys()) {
    STEPWISE_CHECK(!r.has(key), ConfigError, "\"", key,
                   "\" is a DeepSpeed feature stepwise does not support; remove the key (its "
                   "value was ",
                   show(json.at(key)), ")");
  }
  Config out;
  int64_t value = 0;
  if (r.get("train_batch_size", value)) out.train_batch_size = value;
  if (r.get("train_micro_batch_size_per_gpu", value)) out.train_micro_batch_size_per_gpu = value;
  if (r.get("gradient_accumulation_steps", value)) out.gradient_accumulation_steps = value;
  r.get("gradient_clipping", out.gradient_clipping);
  check_non_negative(out.gradient_clipping, "gradient_clipping");
  r.get("steps_per_print", out.steps_per_print);
  check_positive(out.steps_per_print, "steps_per_print");
  r.get("wall_clock_breakdown", out.wall_clock_breakdown);
  if (r.has("optimizer")) out.optimizer = parse_optimizer(r.raw("optimizer"));
  if (r.has("scheduler")) out.scheduler = parse_scheduler(r.raw("scheduler"));
  if (r.has("fp16")) out.fp16 = parse_fp16(r.raw("fp16"));
  if (r.has("bf16")) {
    ObjectReader b(r.raw("bf16"), "bf16");
    b.get("enabled", out.bf16.enabled);
    b.finish({"enabled"});
  }
  STEPWISE_CHECK(!(out.fp16.enabled && out.bf16.enabled), ConfigError,
                 "fp16.enabled and bf16.enabled are both true; enable at most one");
  if (r.has("zero_optimization")) parse_zero(r.raw("zero_optimization"), out);
  if (r.has("stepwise")) {
    ObjectReader s(r.raw("stepwise"), "stepwise");
    s.get("strict_cadence", out.stepwise.strict_cadence);
    s.get("scale_wrt_gas", out.stepwise.scale_wrt_gas);
    s.get("reduce_bucket_size", out.stepwise.reduce_bucket_size);
    check_positive(out.stepwise.reduce_bucket_size, "stepwise.reduce_bucket_size");
    s.finish({"strict_cadence", "scale_wrt_gas", "reduce_bucket_size"});
  }
  r.finish(supported_top_level_keys());
  return out;
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

BatchSizes Config::resolve_batch_sizes(int64_t world_size) const {
  STEPWISE_CHECK(world_size > 0, ConfigError, "world size must be positive, got ", world_size);
  auto check_given = [](const std::optional<int64_t>& v, const char* key) {
    STEPWISE_CHECK(!v || *v > 0, ConfigError, key, " must be a positive integer, got ", *v);
  };
  check_given(train_batch_size, "train_batch_size");
  check_given(train_micro_batch_size_per_gpu, "train_micro_batch_size_per_gpu");
  check_given(gradient_accumulation_steps, "gradient_accumulation_steps");
  STEPWISE_CHECK(train_batch_size || train_micro_batch_size_per_gpu, ConfigError,
                 "neither train_batch_size nor train_micro_batch_size_per_gpu is set; set at "
                 "least one of them");
  BatchSizes out;
  out.world_size = world_size;
  const int64_t w = world_size;
  if (train_batch_size && train_micro_batch_size_per_gpu && gradient_accumulation_steps) {
    out = {*train_batch_size, *train_micro_batch_size_per_gpu, *gradient_accumulation_steps, w};
  } else if (train_batch_size && train_micro_batch_size_per_gpu) {
    out = {*train_batch_size, *train_micro_batch_size_per_gpu,
           *train_batch_size / (*train_micro_batch_size_per_gpu * w), w};
  } else if (train_batch_size && gradient_accumulation_steps) {
    out = {*train_batch_size, *train_batch_size / (w * *gradient_accumulation_steps),
           *gradient_accumulation_steps, w};
  } else if (train_micro_batch_size_per_gpu && gradient_accumulation_steps) {
    out = {*train_micro_batch_size_per_gpu * *gradient_accumulation_steps * w,
           *train_micro_batch_size_per_gpu, *gradient_accumulation_steps, w};
  } else if (train_batch_size) {
    out = {*train_batch_size, *train_batch_size / w, 1, w};
  } else {
    out = {*train_micro_batch_size_per_gpu * w, *train_micro_batch_size_per_gpu, 1, w};
  }
  const bool consistent =
      out.micro_batch > 0 && out.gradient_accumulation_steps > 0 &&
      out.train_batch_size == out.micro_batch * out.gradient_accumulation_steps * w;
  STEPWISE_CHECK(
      consistent, ConfigError, "inconsistent batch sizes: train_batch_size (", out.train_batch_size,
      ") must equal train_micro_batch_size_per_gpu (", out.micro_batch,
      ") * gradient_accumulation_steps (", out.gradient_accumulation_steps, ") * world size (", w,
      ")",
      (train_batch_size && !(train_micro_batch_size_per_gpu && gradient_accumulation_steps)
           ? " after dividing; make train_batch_size a multiple of the other two "
             "times the world size"
           : "; change one of the values so the product matches"));
  return out;
}

}  // namespace stepwise
