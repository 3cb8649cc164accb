#include <stepwise/config.h>
#include <stepwise/errors.h>

#include "auto_values.h"
#include "check.h"
#include "config_sections.h"
#include "deepspeed_features.h"
#include "json_reader.h"
#include "lr_schedules_detail.h"
#include "optimizers_detail.h"
#include "option_checks.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <fstream>
#include <sstream>

namespace stepwise {

using detail::at_path;
using detail::join;
using detail::ObjectReader;
using detail::parse_bf16;
using detail::parse_checkpoint;
using detail::parse_csv_monitor;
using detail::parse_fp16;
using detail::parse_zero;
using detail::parse_zero_legacy;
using detail::show;

namespace {

OptimizerOptions parse_optimizer(ObjectReader r, std::vector<std::string>& notes) {
  OptimizerOptions out;
  r.require("type", out.type(),
            "optimizer.type is missing; use one of: " + join(supported_optimizer_types()));
  // DeepSpeed lower-cases the names of its own optimizers ("adam", "ADAMW", ...); SGD goes
  // to torch.optim by its exact name.
  std::string lower = out.type();
  for (auto& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (lower == "adam") out.type("Adam");
  if (lower == "adamw") out.type("AdamW");
  if (lower == "lamb") out.type("Lamb");
  auto p = r.object_or_empty("params");
  p.get("lr", out.lr());
  p.get("weight_decay", out.weight_decay());
  if (out.type() == "SGD") {
    p.get("momentum", out.momentum());
    p.get("dampening", out.dampening());
    p.get("nesterov", out.nesterov());
  } else {  // Adam, AdamW, Lamb (an unknown type is named by validate() below)
    p.get("betas", out.betas());
    p.get("eps", out.eps());
    p.get("amsgrad", out.amsgrad());
    p.get("bias_correction", out.bias_correction());
    if (out.type() == "Lamb") {  // the rest of DeepSpeed's FusedLamb's keyword arguments
      p.get("eps_inside_sqrt", out.eps_inside_sqrt());
      p.get("max_coeff", out.max_coeff());
      p.get("min_coeff", out.min_coeff());
    } else {
      p.get("adam_w_mode", out.adam_w_mode());
      p.get("torch_adam", out.torch_adam());
    }
  }
  detail::read_features(p, "optimizer.params", notes);
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

ScheduleOptions parse_scheduler(ObjectReader r, std::vector<std::string>& notes) {
  std::string type;
  r.require("type", type,
            "scheduler.type is missing; use one of: " + join(supported_scheduler_types()));
  ScheduleOptions out = default_schedule_options(type, "scheduler.type");
  auto p = r.object_or_empty("params");
  detail::read_features(p, "scheduler.params", notes);
  if (std::holds_alternative<OneCycleOptions>(out)) {
    detail::read_features(p, "scheduler.params (OneCycle)", notes);
  }
  std::visit([&](auto& options) { read_params(p, options); }, out);
  r.finish();
  p.finish();
  at_path([&] { validate(out); },
          [](const std::string& option) { return "scheduler.params." + option; });
  return out;
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

// The gradient reducer's bucket and overlap have two spellings: DeepSpeed's (in
// zero_optimization, read from stage 1) and the "stepwise" section's (at any stage). Two
// different values would leave one silently unused, so that is refused.
void check_reducer_keys_agree(const nlohmann::json& json) {
  if (!json.contains("stepwise") || !json.at("stepwise").is_object() ||
      !json.contains("zero_optimization") || !json.at("zero_optimization").is_object()) {
    return;
  }
  const auto& zero = json.at("zero_optimization");
  const auto& mine = json.at("stepwise");
  const auto stage = zero.value("stage", nlohmann::json(0));
  if (stage == nlohmann::json(0)) return;
  for (const std::string key : {"reduce_bucket_size", "overlap_comm"}) {
    if (!zero.contains(key) || !mine.contains(key) || zero.at(key) == "auto") continue;
    STEPWISE_CHECK(zero.at(key) == mine.at(key), ConfigError, "zero_optimization.", key, " is ",
                   zero.at(key).dump(), " and stepwise.", key, " is ", mine.at(key).dump(),
                   "; both set the gradient reducer's ",
                   key == "overlap_comm" ? "overlap" : "bucket size", " at ZeRO stage ",
                   stage.dump(), ": keep one");
  }
}

// The batch sizes. HF's "auto" left unfilled in one of them is derived from the other two
// and the world size (resolve_batch_sizes), as HF computes train_batch_size; an "auto"
// that the others do not determine is a problem that names the AutoValues field.
void read_batch_sizes(ObjectReader& r, Config& out) {
  const std::array<const char*, 3> keys = {"train_batch_size", "train_micro_batch_size_per_gpu",
                                           "gradient_accumulation_steps"};
  const std::array<std::optional<int64_t>*, 3> fields = {
      &out.train_batch_size, &out.train_micro_batch_size_per_gpu, &out.gradient_accumulation_steps};
  std::vector<size_t> autos;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (r.json().contains(keys[i]) && r.json().at(keys[i]) == "auto") {
      r.claim(keys[i]);
      autos.push_back(i);
    } else {
      r.get(keys[i], *fields[i]);
    }
  }
  if (autos.size() != 1) {
    for (size_t i : autos) {
      r.fail(detail::unfilled_auto(keys[i], ", and the other batch sizes do not determine it"));
    }
  }
}

}  // namespace

Config Config::from_json(const nlohmann::json& given, const AutoValues& auto_values) {
  const nlohmann::json json = detail::fill_auto(given, auto_values);
  detail::Problems problems;
  ObjectReader r(json, "", &problems);
  Config out;
  auto& notes = out.notes;
  read_batch_sizes(r, out);
  r.get("gradient_clipping", out.gradient_clipping);
  problems.guard([&] {
    detail::check_in_range("gradient_clipping", out.gradient_clipping, 0.0, detail::kFloatMax);
  });
  r.get("steps_per_print", out.steps_per_print);
  problems.guard([&] { detail::check_positive("steps_per_print", out.steps_per_print); });
  r.get("wall_clock_breakdown", out.wall_clock_breakdown);
  r.get("prescale_gradients", out.reducer.prescale_gradients());
  r.get("gradient_predivide_factor", out.reducer.gradient_predivide_factor());
  problems.guard([&] {
    detail::check_in_range("gradient_predivide_factor", out.reducer.gradient_predivide_factor(),
                           0.0, detail::kFloatMax, detail::LowerBound::kOpen);
  });
  problems.guard([&] {
    if (auto o = r.object("optimizer")) out.optimizer = parse_optimizer(*o, notes);
  });
  problems.guard([&] {
    if (auto o = r.object("scheduler")) out.scheduler = parse_scheduler(*o, notes);
  });
  bool fp16 = false;
  bool bf16 = false;
  problems.guard([&] {
    if (auto o = r.object("fp16")) out.precision.loss_scaler(parse_fp16(*o, fp16, notes));
  });
  problems.guard([&] {
    if (auto o = r.object("bf16")) {
      parse_bf16(*o, bf16, notes);
    } else if (json.contains("bfloat16")) {  // DeepSpeed's older name, which it still reads
      r.claim("bfloat16");
      notes.push_back("\"bfloat16\" is DeepSpeed's older name of \"bf16\", read as \"bf16\"");
      parse_bf16(ObjectReader(json.at("bfloat16"), "bfloat16", &problems), bf16, notes);
    }
  });
  problems.guard([&] {
    STEPWISE_CHECK(!(fp16 && bf16), ConfigError,
                   "fp16.enabled and bf16.enabled are both true; enable at most one");
  });
  out.precision.mode(fp16   ? PrecisionMode::kFp16
                     : bf16 ? PrecisionMode::kBf16
                            : PrecisionMode::kFp32);
  problems.guard([&] {
    if (json.contains("zero_optimization") && json.at("zero_optimization").is_boolean()) {
      r.claim("zero_optimization");
      parse_zero_legacy(json.at("zero_optimization").get<bool>(), out);
    } else if (auto o = r.object("zero_optimization")) {
      parse_zero(*o, out);
    }
  });
  r.get("zero_force_ds_cpu_optimizer", out.zero.force_ds_cpu_optimizer());
  problems.guard([&] {
    if (!out.optimizer) return;
    // DeepSpeed steps FusedLamb on each rank's flat partition at stages 1 and 2 (one trust
    // ratio per partition, and only with zero_allow_untested_optimizer); stepwise's ratio is
    // per tensor, as at stage 0.
    STEPWISE_CHECK(!(out.optimizer->type() == "Lamb" && out.zero.stage() >= 1), ConfigError,
                   "optimizer.type \"Lamb\" at zero_optimization.stage ", out.zero.stage(),
                   ": DeepSpeed then computes one trust ratio per rank's flat partition, which "
                   "stepwise (whole tensors, one ratio each) does not reproduce; use stage 0");
    // see NOTE: [ZeRO-Offload]: DeepSpeed's CPU Adam takes amsgrad and ignores it.
    STEPWISE_CHECK(!(out.optimizer->amsgrad() && out.zero.offload_optimizer()), ConfigError,
                   "optimizer.params.amsgrad with zero_optimization.offload_optimizer: "
                   "DeepSpeed's CPU Adam ignores amsgrad there (plain Adam), which stepwise does "
                   "not imitate; drop amsgrad or the offload");
  });
  problems.guard([&] {
    if (auto o = r.object("stepwise")) parse_stepwise(*o, out);
    check_reducer_keys_agree(json);
  });
  problems.guard([&] {
    if (auto o = r.object("checkpoint")) parse_checkpoint(*o, out.checkpoint, notes);
  });
  problems.guard([&] {
    if (auto o = r.object("csv_monitor")) parse_csv_monitor(*o, out.csv_monitor);
  });
  detail::read_features(r, "", notes);
  r.finish();
  problems.throw_if_any();
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
                                           {"checkpoint", nlohmann::json::object()},
                                           {"csv_monitor", nlohmann::json::object()}}};
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

Config Config::from_string(const std::string& json_text, const AutoValues& auto_values) {
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(json_text);
  } catch (const nlohmann::json::parse_error& e) {
    throw ConfigError(c10::str("the configuration is not valid JSON: ", e.what()));
  }
  return from_json(json, auto_values);
}

Config Config::from_file(const std::string& path, const AutoValues& auto_values) {
  std::ifstream in(path);
  STEPWISE_CHECK(in.good(), ConfigError, "cannot open the configuration file \"", path,
                 "\"; check the path (relative paths start at the working directory)");
  std::stringstream text;
  text << in.rdbuf();
  try {
    return from_string(text.str(), auto_values);
  } catch (const ConfigError& e) {
    throw ConfigError(c10::str(path, ": ", e.what()));
  }
}

}  // namespace stepwise
