#include "config_sections.h"

#include "check.h"
#include "deepspeed_features.h"
#include "option_checks.h"

#include <stepwise/loss_scaler.h>

#include <c10/util/StringUtil.h>

#include <algorithm>
#include <cctype>
#include <cmath>

namespace stepwise::detail {

// DeepSpeed's "fp16" keys, mapped onto the loss scaler's options: a loss_scale > 0 is a
// static scale, 0 a dynamic one starting at 2^initial_scale_power.
LossScalerOptions parse_fp16(ObjectReader r, bool& enabled, std::vector<std::string>& notes) {
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
  read_features(r, "fp16", notes);
  r.finish();
  check_in_range("fp16.loss_scale", loss_scale, 0.0, kFloatMax);
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

namespace {

// NOTE: [ZeRO-Offload] DeepSpeed reads offload_optimizer (or the older cpu_offload: true)
// at every stage it runs (zero_use_cpu_optimizer): the optimizer state and fp32 masters in
// host memory, stepped there by its CPU Adam (the same update), and a client optimizer
// refused unless zero_force_ds_cpu_optimizer is false; offload_param is ZeRO-3's. stepwise
// keeps them where the parameters are, so on CPU parameters offload to the CPU changes
// nothing (initialize notes it), and on CUDA parameters it is refused by name; NVMe, a
// partial offload (ratio < 1: ZeRO-3 only, as DeepSpeed asserts), both the older key and
// the newer one, or a key DeepSpeed's offload config does not have are refused here.
// Returns whether the optimizer is offloaded to the CPU.
bool optimizer_offloaded(const nlohmann::json& zero) {
  const bool legacy = zero.contains("cpu_offload");
  STEPWISE_CHECK(!(legacy && zero.contains("offload_optimizer")), ConfigError,
                 "zero_optimization has both cpu_offload and offload_optimizer, which DeepSpeed "
                 "refuses (the first is the older name of the second): keep offload_optimizer");
  if (legacy) return zero.at("cpu_offload") == true;
  if (!zero.contains("offload_optimizer") || zero.at("offload_optimizer").is_null()) return false;
  const auto& o = zero.at("offload_optimizer");
  STEPWISE_CHECK(o.is_object(), ConfigError,
                 "zero_optimization.offload_optimizer must be an object such as "
                 "{\"device\": \"cpu\"}, got ",
                 o.dump());
  static const std::vector<std::string> keys = {
      "device",         "nvme_path", "buffer_count", "pin_memory",    "pipeline_read",
      "pipeline_write", "fast_init", "ratio",        "super_offload", "cpuadam_cores_perc"};
  for (const auto& [key, value] : o.items()) {
    STEPWISE_CHECK(std::find(keys.begin(), keys.end(), key) != keys.end(), ConfigError,
                   "unknown key zero_optimization.offload_optimizer.", key, " (value ",
                   value.dump(), "); valid keys here are: ", join(keys));
  }
  const auto device = o.value("device", nlohmann::json("none"));
  STEPWISE_CHECK(device == "none" || device == "cpu" || device == "nvme", ConfigError,
                 "zero_optimization.offload_optimizer.device is ", device.dump(),
                 "; DeepSpeed's devices are \"none\", \"cpu\" and \"nvme\"");
  STEPWISE_CHECK(device != "nvme", ConfigError,
                 "zero_optimization.offload_optimizer.device \"nvme\" turns on ZeRO-Infinity's "
                 "NVMe offload, which stepwise does not implement: use \"cpu\" (with the model "
                 "on the CPU, where the state already is) or \"none\"");
  const auto ratio = o.value("ratio", nlohmann::json(1.0));
  STEPWISE_CHECK(ratio.is_number() && ratio.get<double>() == 1.0, ConfigError,
                 "zero_optimization.offload_optimizer.ratio is ", ratio.dump(),
                 ": partial offload is ZeRO stage 3's only, as DeepSpeed asserts; drop it");
  return device == "cpu";
}

}  // namespace

// NOTE: [ZeRO keys] DeepSpeed accepts every DeepSpeedZeroConfig key at any stage and reads
// each only at the stages it belongs to. stepwise runs stages 0, 1 and 2: at stages 1 and 2
// it honours reduce_bucket_size and overlap_comm (the gradient reducer's) and
// allgather_bucket_size (the gather of the updated parameters); every other key
// present is accepted with one note that names it, or refused when it turns on ZeRO-Offload. An
// unknown key is refused, as DeepSpeed's config model forbids extras.
void parse_zero(ObjectReader r, Config& out) {
  int64_t stage = 0;
  r.get("stage", stage);
  // Read at every stage (so that the key table lists them), applied from stage 1.
  distributed::ZeroOptions zero;
  int64_t reduce_bucket_size = out.reducer.bucket_size();
  bool overlap_comm = out.reducer.overlap_comm();
  // HF's "auto" in a bucket size (the Trainer fills it from the model's hidden size)
  // keeps the default: a bucket groups the communication, it changes no value.
  std::vector<std::string> auto_buckets;
  const auto read_bucket = [&](const char* key, int64_t& out) {
    if (r.json().contains(key) && r.json().at(key) == "auto") {
      r.claim(key);
      auto_buckets.emplace_back(key);
      return false;
    }
    return r.get(key, out);
  };
  const bool has_reduce = read_bucket("reduce_bucket_size", reduce_bucket_size);
  const bool has_overlap = r.get("overlap_comm", overlap_comm);
  read_bucket("allgather_bucket_size", zero.allgather_bucket_size());
  const bool offloaded = stage <= 2 && optimizer_offloaded(r.json());
  std::vector<std::string> unused;
  for (const auto& key : deepspeed_zero_keys()) {
    if (!r.json().contains(key)) continue;
    if (offloaded && (key == "offload_optimizer" || key == "cpu_offload")) {
      r.claim(key);  // read by optimizer_offloaded()
      continue;
    }
    const bool honoured =
        key == "reduce_bucket_size" || key == "overlap_comm" || key == "allgather_bucket_size";
    if (key == "stage" || (honoured && stage >= 1)) continue;
    r.claim(key);
    unused.push_back(key);
  }
  r.finish();
  STEPWISE_CHECK(stage >= 0 && stage <= 3, ConfigError, "zero_optimization.stage is ", stage,
                 "; DeepSpeed's stages are 0, 1, 2 and 3");
  STEPWISE_CHECK(stage != 3, ConfigError,
                 "zero_optimization.stage 3 partitions the parameters themselves, which stepwise "
                 "does not implement; use stage 2 (the optimizer state, the fp32 masters and "
                 "the gradients sharded) or 1");
  STEPWISE_CHECK(zero.allgather_bucket_size() > 0, ConfigError,
                 "zero_optimization.allgather_bucket_size is ", zero.allgather_bucket_size(),
                 "; it counts elements per broadcast: use a positive number (DeepSpeed's "
                 "default is 500000000)");
  zero.stage(stage);
  zero.offload_optimizer(offloaded);
  out.zero = zero;
  if (stage >= 1) {
    if (has_reduce) {
      STEPWISE_CHECK(reduce_bucket_size > 0, ConfigError,
                     "zero_optimization.reduce_bucket_size is ", reduce_bucket_size,
                     "; it counts elements per all-reduce: use a positive number (DeepSpeed's "
                     "default is 500000000)");
      out.reducer.bucket_size(reduce_bucket_size);
    }
    if (has_overlap) out.reducer.overlap_comm(overlap_comm);
  }
  if (stage >= 1 && !auto_buckets.empty()) {
    out.notes.push_back(c10::str("zero_optimization.", join(auto_buckets),
                                 " \"auto\" (HF Trainer's placeholder) keeps the default, "
                                 "500000000 elements: a bucket size groups the communication "
                                 "and changes no value"));
  }
  if (!unused.empty()) {
    out.notes.push_back(c10::str(
        "zero_optimization keys with no effect at stage ", stage,
        stage == 0 ? " (DeepSpeed reads them only at stages 1-3): " : " here (see docs/zero.md): ",
        join(unused)));
  }
}

// DeepSpeed's older form, "zero_optimization": true or false, read as DeepSpeed reads it
// (read_zero_config_deprecated): stage 1 or 0, with its deprecation warning as a note.
void parse_zero_legacy(bool enabled, Config& out) {
  out.notes.push_back(c10::str("\"zero_optimization\": ", enabled ? "true" : "false",
                               " is DeepSpeed's deprecated form of {\"stage\": ", enabled ? 1 : 0,
                               "}; write that instead"));
  out.zero.stage(enabled ? 1 : 0);
}

void parse_checkpoint(ObjectReader r, CheckpointOptions& out, std::vector<std::string>& notes) {
  std::string mode = "Warn";
  r.get("tag_validation", mode);
  read_features(r, "checkpoint", notes);
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

void parse_csv_monitor(ObjectReader r, CsvMonitorOptions& out) {
  r.get("enabled", out.enabled());
  r.get("output_path", out.output_path());
  r.get("job_name", out.job_name());
  r.finish();
}

void parse_bf16(ObjectReader r, bool& enabled, std::vector<std::string>& notes) {
  r.get("enabled", enabled);
  read_features(r, "bf16", notes);
  r.finish();
}

}  // namespace stepwise::detail
