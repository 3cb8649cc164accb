// Config fuzz: 30,000 configs mutated from realistic ones (HF Trainer's "auto"
// template among them), each through Config, initialize and a few micro-steps.
// It passes when nothing crashes, the only exceptions are stepwise's own
// (ConfigError, UsageError, TrainingError), and every injected unknown key is
// refused by name. Deterministic: one seeded generator.
#include <stepwise/stepwise.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <iostream>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

namespace stepwise {
namespace {

using nlohmann::json;

// Element-wise, so fp16 runs on CPU too (LibTorch 1.13 has no half matmul there).
struct ScaleNet : torch::nn::Module {
  torch::Tensor w = register_parameter("w", torch::full({4}, 0.5));
  torch::Tensor b = register_parameter("b", torch::zeros({1}));
  torch::Tensor forward(const torch::Tensor& x) { return (x * w).sum(1) + b; }
};

json hf_auto_template() {
  return json::parse(R"({
    "fp16": {"enabled": "auto", "loss_scale": 0, "loss_scale_window": 1000,
             "initial_scale_power": 16, "hysteresis": 2, "min_loss_scale": 1},
    "bf16": {"enabled": "auto"},
    "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto",
                                             "weight_decay": "auto"}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": "auto",
                                                 "warmup_max_lr": "auto",
                                                 "warmup_num_steps": "auto"}},
    "zero_optimization": {"stage": 0},
    "gradient_accumulation_steps": "auto", "gradient_clipping": "auto",
    "steps_per_print": 2000, "train_batch_size": "auto",
    "train_micro_batch_size_per_gpu": "auto", "wall_clock_breakdown": false})");
}

// Realistic configs that parse: the fuzz's starting points for unknown keys.
std::vector<json> valid_seeds() {
  return {// HF Trainer's template as the Trainer fills in "auto".
          json::parse(R"({
        "fp16": {"enabled": false, "loss_scale": 0, "loss_scale_window": 1000,
                 "initial_scale_power": 16, "hysteresis": 2, "min_loss_scale": 1},
        "bf16": {"enabled": false},
        "optimizer": {"type": "AdamW", "params": {"lr": 5e-5, "betas": [0.9, 0.999],
                                                 "eps": 1e-8, "weight_decay": 0.0}},
        "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 5e-5,
                                                     "warmup_num_steps": 10}},
        "zero_optimization": {"stage": 0},
        "gradient_accumulation_steps": 2, "gradient_clipping": 1.0, "steps_per_print": 2000,
        "train_batch_size": 16, "train_micro_batch_size_per_gpu": 8,
        "wall_clock_breakdown": false})"),
          json::parse(R"({
        "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
        "fp16": {"enabled": true, "loss_scale": 0, "initial_scale_power": 8,
                 "loss_scale_window": 3, "hysteresis": 2, "consecutive_hysteresis": false,
                 "min_loss_scale": 1},
        "optimizer": {"type": "Adam", "params": {"lr": 0.01, "betas": [0.9, 0.999],
                      "eps": 1e-8, "weight_decay": 0, "adam_w_mode": true, "torch_adam": true}},
        "scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": 100,
                      "warmup_num_steps": 10, "warmup_type": "linear", "warmup_max_lr": 0.01}}})"),
          json::parse(R"({
        "train_batch_size": 4, "bf16": {"enabled": true},
        "optimizer": {"type": "SGD", "params": {"lr": 0.1, "momentum": 0.9, "dampening": 0,
                                               "nesterov": true, "weight_decay": 1e-4}},
        "scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 0.001,
                      "cycle_max_lr": 0.01, "cycle_first_step_size": 5,
                      "cycle_second_step_size": 5, "decay_step_size": 2, "decay_lr_rate": 0.1,
                      "cycle_momentum": true, "cycle_min_mom": 0.85, "cycle_max_mom": 0.95,
                      "decay_mom_rate": 0.0}}})"),
          json::parse(R"({
        "train_batch_size": 8, "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 4, "wall_clock_breakdown": false,
        "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "betas": [0.9, 0.95],
                      "eps": 1e-8, "weight_decay": 0.1, "amsgrad": false}},
        "scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 1000,
                      "warmup_num_steps": 100, "warmup_min_ratio": 0.0, "cos_min_ratio": 0.1,
                      "warmup_type": "log"}},
        "zero_optimization": {"stage": 0},
        "stepwise": {"strict_cadence": true, "scale_wrt_gas": true,
                     "reduce_bucket_size": 500000000}})"),
          json::parse(R"({
        "train_micro_batch_size_per_gpu": 2, "gradient_clipping": 0.5, "steps_per_print": 1,
        "optimizer": {"type": "SGD", "params": {"lr": 0.01}},
        "scheduler": {"type": "LRRangeTest", "params": {"lr_range_test_min_lr": 1e-4,
                      "lr_range_test_step_size": 2, "lr_range_test_step_rate": 5,
                      "lr_range_test_staircase": false}}})")};
}

// Values that break parsers: extremes of both number types, wrong types, DeepSpeed's "auto".
std::vector<json> nasty_values() {
  return {0,
          -1,
          1,
          2,
          64,
          65,
          0.5,
          1.0,
          1e-320,
          1e-8,
          1e38,
          3.5e38,
          1e308,
          -1e308,
          1e19,
          json(std::numeric_limits<int64_t>::max()),
          json(std::numeric_limits<int64_t>::min()),
          json(std::numeric_limits<uint64_t>::max()),
          json(9007199254740993LL),
          "auto",
          "",
          "log",
          "SGD",
          "WarmupLR",
          true,
          false,
          nullptr,
          json::array(),
          json::array({0.9}),
          json::array({1e308, -1}),
          json::array({0.9, 0.999}),
          json::object(),
          json::object({{"x", 1}})};
}

// Every node's JSON pointer, and whether it is an object.
void collect(const json& j, const json::json_pointer& at,
             std::vector<std::pair<json::json_pointer, bool>>& out) {
  out.push_back({at, j.is_object()});
  if (j.is_object()) {
    for (const auto& item : j.items()) collect(item.value(), at / item.key(), out);
  } else if (j.is_array()) {
    for (size_t i = 0; i < j.size(); ++i) collect(j[i], at / i, out);
  }
}

std::string dotted(const json::json_pointer& at, const std::string& key) {
  std::string path;
  for (auto p = at; !p.empty(); p = p.parent_pointer()) {
    path = p.back() + (path.empty() ? "" : "." + path);
  }
  return path.empty() ? key : path + "." + key;
}

class Fuzzer {
 public:
  explicit Fuzzer(uint32_t seed) : rng_(seed) {}

  size_t pick(size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(rng_); }

  // One to three value mutations: replace a node, delete a key, or change a
  // section's type or precision.
  void mutate(json& config) {
    const size_t count = 1 + pick(3);
    for (size_t m = 0; m < count; ++m) {
      std::vector<std::pair<json::json_pointer, bool>> nodes;
      collect(config, json::json_pointer(), nodes);
      if (nodes.size() < 2) return;
      const auto& [at, is_object] = nodes[1 + pick(nodes.size() - 1)];
      switch (pick(5)) {
        case 0:
        case 1:
          config[at] = values_[pick(values_.size())];
          break;
        case 2: {
          auto& parent = config[at.parent_pointer()];
          if (parent.is_object()) parent.erase(at.back());
          break;
        }
        case 3: {
          static const std::vector<std::string> types = {
              "Adam",           "AdamW",    "SGD",         "WarmupLR", "WarmupDecayLR",
              "WarmupCosineLR", "OneCycle", "LRRangeTest", "adamw"};
          const std::string section = pick(2) == 0 ? "optimizer" : "scheduler";
          if (config.contains(section) && config[section].is_object()) {
            config[section]["type"] = types[pick(types.size())];
          }
          break;
        }
        default: {
          auto& section = config[pick(2) == 0 ? "fp16" : "bf16"];
          if (section.is_null() || section.is_object()) section["enabled"] = pick(2) == 0;
        }
      }
    }
  }

  // Adds one unknown key to a random object; returns its dotted path.
  std::string inject_unknown_key(json& config, int serial) {
    std::vector<std::pair<json::json_pointer, bool>> nodes;
    collect(config, json::json_pointer(), nodes);
    std::vector<json::json_pointer> objects;
    for (const auto& [at, is_object] : nodes) {
      if (is_object) objects.push_back(at);
    }
    const auto& at = objects[pick(objects.size())];
    const std::string key = "fuzz_unknown_" + std::to_string(serial);
    config[at][key] = values_[pick(values_.size())];
    return dotted(at, key);
  }

 private:
  std::mt19937 rng_;
  std::vector<json> values_ = nasty_values();
};

enum class Outcome { kTrained, kConfigError, kUsageError, kTrainingError };

// Config, initialize, six micro-steps. Anything but stepwise's own errors escapes.
Outcome run(const json& j, std::string* message) {
  try {
    auto config = Config::from_json(j);
    auto model = std::make_shared<ScaleNet>();
    auto engine = initialize(model, config);
    for (int i = 0; i < 6; ++i) {
      auto x = torch::randn({2, 4}).to(model->w.scalar_type());
      auto y = torch::randn({2}).to(model->w.scalar_type());
      engine.backward((model->forward(x) - y).pow(2).mean());
      engine.step();
    }
    return Outcome::kTrained;
  } catch (const ConfigError& e) {
    *message = e.what();
    return Outcome::kConfigError;
  } catch (const UsageError& e) {
    *message = e.what();
    return Outcome::kUsageError;
  } catch (const TrainingError& e) {
    *message = e.what();
    return Outcome::kTrainingError;
  }
}

// Sends stderr (progress lines, LibTorch warnings) to /dev/null while alive.
class QuietStderr {
 public:
  QuietStderr() : saved_(dup(2)) {
    std::cerr.flush();
    const int null = open("/dev/null", O_WRONLY);
    dup2(null, 2);
    close(null);
  }
  ~QuietStderr() {
    std::cerr.flush();
    dup2(saved_, 2);
    close(saved_);
  }

 private:
  int saved_;
};

TEST(ConfigFuzz, ThirtyThousandMutatedConfigsOnlyStepwiseErrorsAndUnknownKeysRefusedByName) {
  torch::manual_seed(0);
  const auto seeds = valid_seeds();
  for (const auto& seed : seeds) {
    QuietStderr quiet;
    std::string message;
    ASSERT_EQ(run(seed, &message), Outcome::kTrained) << message << "\n" << seed.dump();
  }
  std::vector<json> all_seeds = seeds;
  all_seeds.push_back(hf_auto_template());

  constexpr int kConfigs = 30000;  // about 3 s here
  Fuzzer fuzzer(20261203);
  std::map<Outcome, int> outcomes;
  int injected = 0;
  int refused_by_name = 0;
  std::vector<std::string> failures;
  {
    QuietStderr quiet;
    for (int i = 0; i < kConfigs; ++i) {
      std::string unknown;
      json config;
      if (i % 5 == 0) {  // an unknown key alone, in a config that is otherwise valid
        config = seeds[fuzzer.pick(seeds.size())];
        unknown = fuzzer.inject_unknown_key(config, i);
      } else {
        config = all_seeds[fuzzer.pick(all_seeds.size())];
        fuzzer.mutate(config);
      }
      std::string message;
      Outcome outcome;
      try {
        outcome = run(config, &message);
      } catch (const std::exception& e) {
        failures.push_back(std::string("not a stepwise error: ") + e.what() + "\n  config " +
                           config.dump());
        continue;
      }
      outcomes[outcome] += 1;
      if (!unknown.empty()) {
        injected += 1;
        if (outcome == Outcome::kConfigError &&
            message.rfind("unknown key " + unknown + " ", 0) == 0) {
          refused_by_name += 1;
        } else {
          failures.push_back("unknown key " + unknown + " not refused by name: " + message +
                             "\n  config " + config.dump());
        }
      }
    }
  }
  for (size_t i = 0; i < failures.size() && i < 20; ++i) ADD_FAILURE() << failures[i];
  EXPECT_TRUE(failures.empty()) << failures.size() << " failures";
  EXPECT_EQ(injected, kConfigs / 5);
  EXPECT_EQ(refused_by_name, injected);
  // Each outcome happens: the mutations reach training, not only the parser.
  EXPECT_GT(outcomes[Outcome::kTrained], kConfigs / 20);
  EXPECT_GT(outcomes[Outcome::kConfigError], kConfigs / 5);
  std::cout << kConfigs << " configs: " << outcomes[Outcome::kTrained] << " trained, "
            << outcomes[Outcome::kConfigError] << " ConfigError, " << outcomes[Outcome::kUsageError]
            << " UsageError, " << outcomes[Outcome::kTrainingError] << " TrainingError; "
            << injected << " unknown keys injected, " << refused_by_name << " refused by name; "
            << failures.size() << " other exceptions\n";
}

}  // namespace
}  // namespace stepwise
