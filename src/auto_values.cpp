#include "auto_values.h"

#include <c10/util/StringUtil.h>

#include <optional>

namespace stepwise::detail {

// NOTE: [HF auto] HF's Trainer writes its TrainingArguments into the "auto" values of a
// DeepSpeed config before DeepSpeed reads it (transformers' integrations/deepspeed.py:
// HfTrainerDeepSpeedConfig.trainer_config_process and trainer_config_finalize). AutoValues
// carries the same arguments; each key is filled from the same one, with the same
// meaning. train_batch_size is left for resolve_batch_sizes to derive, as HF computes it
// from the other two and the world size.
const std::vector<AutoKey>& auto_keys() {
  static const std::vector<AutoKey> keys = {
      {"train_micro_batch_size_per_gpu", "per_device_train_batch_size"},
      {"gradient_accumulation_steps", "gradient_accumulation_steps"},
      {"gradient_clipping", "max_grad_norm"},
      {"optimizer.params.lr", "learning_rate"},
      {"optimizer.params.betas", "adam_beta1 and adam_beta2"},
      {"optimizer.params.eps", "adam_epsilon"},
      {"optimizer.params.weight_decay", "weight_decay"},
      {"scheduler.params.warmup_max_lr", "learning_rate"},
      {"scheduler.params.warmup_num_steps", "warmup_steps"},
      {"scheduler.params.total_num_steps", "num_training_steps"},
      {"fp16.enabled", "fp16"},
      {"bf16.enabled", "bf16"},
  };
  return keys;
}

namespace {

nlohmann::json::json_pointer pointer(const std::string& path) {
  std::string text = "/" + path;
  for (auto& c : text) c = c == '.' ? '/' : c;
  return nlohmann::json::json_pointer(text);
}

std::optional<nlohmann::json> value_for(const std::string& path, const AutoValues& v) {
  const auto some = [](const auto& field) -> std::optional<nlohmann::json> {
    if (!field) return std::nullopt;
    return nlohmann::json(*field);
  };
  if (path == "train_micro_batch_size_per_gpu") return some(v.per_device_train_batch_size());
  if (path == "gradient_accumulation_steps") return some(v.gradient_accumulation_steps());
  if (path == "gradient_clipping") return some(v.max_grad_norm());
  if (path == "optimizer.params.lr" || path == "scheduler.params.warmup_max_lr") {
    return some(v.learning_rate());
  }
  if (path == "optimizer.params.betas") {
    if (!v.adam_beta1() || !v.adam_beta2()) return std::nullopt;
    return nlohmann::json::array({*v.adam_beta1(), *v.adam_beta2()});
  }
  if (path == "optimizer.params.eps") return some(v.adam_epsilon());
  if (path == "optimizer.params.weight_decay") return some(v.weight_decay());
  if (path == "scheduler.params.warmup_num_steps") return some(v.warmup_steps());
  if (path == "scheduler.params.total_num_steps") return some(v.num_training_steps());
  if (path == "fp16.enabled") return some(v.fp16());
  if (path == "bf16.enabled") return some(v.bf16());
  return std::nullopt;
}

}  // namespace

nlohmann::json fill_auto(nlohmann::json json, const AutoValues& values) {
  const auto is_auto = [&](const nlohmann::json::json_pointer& at) {
    return json.contains(at) && json.at(at) == "auto";
  };
  for (const auto& key : auto_keys()) {
    const auto at = pointer(key.path);
    if (!is_auto(at)) continue;
    if (auto value = value_for(key.path, values)) json.at(at) = *value;
  }
  // HF fills it with 0 whatever its arguments (fill_only("scheduler.params.warmup_min_lr", 0)).
  const auto min_lr = pointer("scheduler.params.warmup_min_lr");
  if (is_auto(min_lr)) json.at(min_lr) = 0;
  return json;
}

std::string auto_field(const std::string& path) {
  for (const auto& key : auto_keys()) {
    if (path == key.path) return key.field;
  }
  return "";
}

ConfigError unfilled_auto(const std::string& path, const std::string& why_not) {
  const std::string field = auto_field(path);
  return ConfigError(c10::str(path, " is \"auto\", HF Trainer's placeholder", why_not, ": ",
                              field.empty() ? "" : "fill it with AutoValues' " + field + ", or ",
                              "write the value"));
}

}  // namespace stepwise::detail
