#include "config_sections.h"

#include "check.h"
#include "deepspeed_features.h"
#include "option_checks.h"

#include <stepwise/loss_scaler.h>

#include <c10/util/StringUtil.h>

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

// NOTE: [ZeRO keys at stage 0] DeepSpeed accepts every DeepSpeedZeroConfig key at any
// stage and reads them only at stages 1-3: at stage 0 they are accepted, with one note
// that names them. An unknown key is refused, as DeepSpeed's config model forbids extras.
void parse_zero(ObjectReader r, Config& out) {
  r.get("stage", out.zero_stage);
  std::vector<std::string> unused;
  for (const auto& key : deepspeed_zero_keys()) {
    if (key == "stage" || !r.json().contains(key)) continue;
    r.claim(key);
    unused.push_back(key);
  }
  r.finish();
  STEPWISE_CHECK(out.zero_stage == 0, ConfigError, "zero_optimization.stage ", out.zero_stage,
                 " is not supported (ZeRO is not implemented); use stage 0 or remove the "
                 "zero_optimization section");
  if (!unused.empty()) {
    out.notes.push_back(
        c10::str("zero_optimization keys with no effect at stage 0 (DeepSpeed "
                 "reads them only at stages 1-3): ",
                 join(unused)));
  }
}

// DeepSpeed's older form, "zero_optimization": true or false, read as DeepSpeed reads it
// (read_zero_config_deprecated): stage 1 or 0, with its deprecation warning as a note.
void parse_zero_legacy(bool enabled, Config& out) {
  out.notes.push_back(c10::str("\"zero_optimization\": ", enabled ? "true" : "false",
                               " is DeepSpeed's deprecated form of {\"stage\": ", enabled ? 1 : 0,
                               "}; write that instead"));
  out.zero_stage = enabled ? 1 : 0;
  STEPWISE_CHECK(!enabled, ConfigError,
                 "\"zero_optimization\": true means ZeRO stage 1, which is not supported "
                 "(ZeRO is not implemented); use false or remove the key");
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
