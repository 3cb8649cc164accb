// Engine behaviour: backward's return, GAS equivalence, flush, counters, clipping.
#include <stepwise/clip.h>
#include <stepwise/engine.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>
#include <map>
#include <string>

#include "support/reference_problem.h"

namespace stepwise {
namespace {

using testing::reference_linear;
using testing::reference_samples;

std::string config_json(int64_t mbs, int64_t gas, const std::string& extra = "") {
  return c10::str(R"({"train_micro_batch_size_per_gpu": )", mbs,
                  R"(, "gradient_accumulation_steps": )", gas, R"(, "gradient_clipping": 0.5,
      "steps_per_print": 1000000,
      "optimizer": {"type": "AdamW", "params": {"lr": 0.05, "weight_decay": 0.01}},
      "scheduler": {"type": "WarmupLR", "params": {"warmup_max_lr": 0.05,
                    "warmup_num_steps": 3, "warmup_type": "linear"}})",
                  extra, "}");
}

struct RunResult {
  torch::Tensor weight, bias;
  std::vector<double> window_losses;  // sum of backward() returns per optimizer step
};

// Trains on samples 0 .. samples-1 in order, mbs at a time.
// On testing::test_device() (CUDA in tools/gpu-check).
RunResult train(int64_t mbs, int64_t gas, int64_t samples) {
  const auto device = testing::test_device();
  auto model = reference_linear();
  model->to(device);
  auto engine = initialize(model, Config::from_string(config_json(mbs, gas)));
  RunResult out;
  double window = 0.0;
  for (int64_t first = 0; first < samples; first += mbs) {
    auto [x, y] = reference_samples(first, mbs);
    const auto loss = torch::mse_loss(model->forward(x.to(device)), y.to(device));
    window += engine.backward(loss).item<double>();
    const bool boundary = engine.is_gradient_accumulation_boundary();
    engine.step();
    if (boundary) {
      out.window_losses.push_back(window);
      window = 0.0;
    }
  }
  out.weight = model->weight.detach().cpu().clone();
  out.bias = model->bias.detach().cpu().clone();
  return out;
}

TEST(Engine, BackwardReturnsTheLossDividedByGasDetached) {
  auto model = reference_linear();
  auto engine = initialize(model, Config::from_string(config_json(2, 4)));
  auto [x, y] = reference_samples(0, 2);
  auto loss = torch::mse_loss(model->forward(x), y);
  auto returned = engine.backward(loss);
  EXPECT_DOUBLE_EQ(returned.item<double>(), loss.item<double>() / 4.0);
  EXPECT_FALSE(returned.requires_grad());
  // The gradient is that of loss / 4.
  auto manual = reference_linear();
  torch::mse_loss(manual->forward(x), y).backward();
  EXPECT_TRUE(torch::allclose(model->weight.grad(), manual->weight.grad() / 4.0));
}

TEST(Engine, ScaleWrtGasOffPerCallAndInConfig) {
  auto model = reference_linear();
  auto engine = initialize(model, Config::from_string(config_json(2, 4)));
  auto [x, y] = reference_samples(0, 2);
  auto loss = torch::mse_loss(model->forward(x), y);
  auto returned = engine.backward(loss, BackwardOptions().scale_wrt_gas(false));
  EXPECT_DOUBLE_EQ(returned.item<double>(), loss.item<double>());

  auto model2 = reference_linear();
  auto engine2 = initialize(
      model2, Config::from_string(config_json(2, 4, R"(, "stepwise": {"scale_wrt_gas": false})")));
  auto loss2 = torch::mse_loss(model2->forward(x), y);
  EXPECT_DOUBLE_EQ(engine2.backward(loss2).item<double>(), loss2.item<double>());
}

TEST(Engine, SameSamplesSameWeightsForAnyGasSplitOfTheBatch) {
  // bs=8/GAS=1, bs=4/GAS=2, bs=2/GAS=4: the report's claim, on 48 samples.
  const auto a = train(8, 1, 48);
  const auto b = train(4, 2, 48);
  const auto c = train(2, 4, 48);
  ASSERT_EQ(a.window_losses.size(), 6u);
  for (const auto* other : {&b, &c}) {
    EXPECT_TRUE(torch::allclose(a.weight, other->weight, 0, 1e-6)) << a.weight << other->weight;
    EXPECT_TRUE(torch::allclose(a.bias, other->bias, 0, 1e-6));
    ASSERT_EQ(other->window_losses.size(), a.window_losses.size());
    for (size_t i = 0; i < a.window_losses.size(); ++i) {
      EXPECT_NEAR(other->window_losses[i], a.window_losses[i], 1e-5 * a.window_losses[i]);
    }
  }
  // And it is not trivially equal: the weights moved.
  EXPECT_FALSE(torch::allclose(a.weight, reference_linear()->weight, 0, 1e-3));
}

TEST(Engine, CountersAndBoundary) {
  auto model = reference_linear();
  auto engine = initialize(model, Config::from_string(config_json(2, 3)));
  auto* schedule = dynamic_cast<Schedule*>(engine.lr_scheduler());
  ASSERT_NE(schedule, nullptr);
  for (int64_t t = 0; t < 9; ++t) {
    EXPECT_EQ(engine.is_gradient_accumulation_boundary(), (t + 1) % 3 == 0) << t;
    auto [x, y] = reference_samples(2 * t, 2);
    engine.backward(torch::mse_loss(model->forward(x), y));
    EXPECT_EQ(engine.micro_steps(), t) << "backward() does not count";
    engine.step();
    EXPECT_EQ(engine.micro_steps(), t + 1);
    EXPECT_EQ(engine.global_steps(), (t + 1) / 3);
    EXPECT_EQ(engine.global_samples(), (t + 1) / 3 * 6);
    EXPECT_EQ(engine.was_step_applied(), (t + 1) % 3 == 0);
    EXPECT_EQ(engine.skipped_steps(), 0);
    EXPECT_EQ(schedule->step_count(), engine.global_steps() - engine.skipped_steps());
    if ((t + 1) % 3 == 0) {
      EXPECT_FALSE(model->weight.grad().defined()) << "gradients are set to none";
      EXPECT_GT(engine.global_grad_norm(), 0.0);
    } else {
      EXPECT_TRUE(model->weight.grad().defined()) << "gradients accumulate";
    }
  }
}

// DeepSpeed's WarmupLR lr at each last_batch_iteration (lbi), from the reference table.
std::map<int64_t, double> reference_warmup_lrs(const nlohmann::json& params) {
  std::ifstream in(testing::data_path("deepspeed/lr_schedules.jsonl"));
  std::map<int64_t, double> lrs;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] != '{') continue;
    const auto row = nlohmann::json::parse(line);
    if (row["type"] == "WarmupLR" && row["params"] == params) lrs[row["lbi"]] = row["lr"];
  }
  return lrs;
}

// The engine's lr after g optimizer steps is DeepSpeed's at lbi = g (docs/lr-schedules.md,
// "Step mapping"), unchanged off the boundary.
TEST(Engine, LrFollowsTheStepMapping) {
  const nlohmann::json params = {{"warmup_min_lr", 0.001},
                                 {"warmup_max_lr", 0.01},
                                 {"warmup_num_steps", 8},
                                 {"warmup_type", "linear"}};
  const auto expected = reference_warmup_lrs(params);
  ASSERT_EQ(expected.size(), 12u) << "lbi 0..11 in tests/data/deepspeed/lr_schedules.jsonl";
  auto model = reference_linear();
  auto engine = initialize(
      model, Config::from_json({{"train_micro_batch_size_per_gpu", 2},
                                {"gradient_accumulation_steps", 2},
                                {"steps_per_print", 1000000},
                                {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 0.05}}}}},
                                {"scheduler", {{"type", "WarmupLR"}, {"params", params}}}}));
  auto near = [](double actual, double reference) {
    return std::fabs(actual - reference) <= 1e-12 * std::fabs(reference);
  };
  EXPECT_PRED2(near, engine.get_lr()[0], expected.at(0));
  for (int64_t t = 0; t < 22; ++t) {  // 11 optimizer steps: lbi 1..11
    auto [x, y] = reference_samples(2 * t, 2);
    engine.backward(torch::mse_loss(model->forward(x), y));
    engine.step();
    EXPECT_EQ(engine.global_steps(), (t + 1) / 2);
    EXPECT_PRED2(near, engine.get_lr()[0], expected.at(engine.global_steps()))
        << "micro-step " << t;
  }
}

TEST(Engine, ClippingUsesTheGlobalNormAndDeepSpeedsCoefficient) {
  auto params = std::vector<torch::Tensor>{torch::zeros({2}, torch::requires_grad()),
                                           torch::zeros({1}, torch::requires_grad())};
  params[0].mutable_grad() = torch::tensor({3.0f, 0.0f});
  params[1].mutable_grad() = torch::tensor({4.0f});
  EXPECT_DOUBLE_EQ(clip_grad_norm(params, 1.0), 5.0);
  EXPECT_NEAR(params[0].grad()[0].item<double>(), 3.0 / (5.0 + 1e-6), 1e-7);
  EXPECT_NEAR(params[1].grad()[0].item<double>(), 4.0 / (5.0 + 1e-6), 1e-7);
  EXPECT_NEAR(clip_grad_norm(params, 10.0), 1.0, 1e-6);  // below: untouched
  EXPECT_NEAR(params[1].grad()[0].item<double>(), 4.0 / (5.0 + 1e-6), 1e-7);
}

TEST(Engine, FlushAfterKMicroBatchesEqualsAGasKStep) {
  // GAS = 4, but the epoch ends after k = 3 micro-batches; compare with GAS = 3.
  auto model_a = reference_linear();
  auto a = initialize(model_a, Config::from_string(config_json(2, 4)));
  auto model_b = reference_linear();
  auto b = initialize(model_b, Config::from_string(config_json(2, 3)));
  for (int64_t t = 0; t < 3; ++t) {
    auto [x, y] = reference_samples(2 * t, 2);
    a.backward(torch::mse_loss(model_a->forward(x), y));
    a.step();
    b.backward(torch::mse_loss(model_b->forward(x), y));
    b.step();
  }
  EXPECT_EQ(a.global_steps(), 0);
  EXPECT_TRUE(a.flush());
  EXPECT_EQ(b.global_steps(), 1);
  EXPECT_NEAR(a.global_grad_norm(), b.global_grad_norm(), 1e-6 * b.global_grad_norm());
  EXPECT_TRUE(torch::allclose(model_a->weight, model_b->weight, 0, 1e-7));
  EXPECT_TRUE(torch::allclose(model_a->bias, model_b->bias, 0, 1e-7));
  EXPECT_EQ(a.global_steps(), 1);
  EXPECT_EQ(a.global_samples(), 6);
  EXPECT_TRUE(a.was_step_applied());
  EXPECT_EQ(a.micro_steps(), 4) << "the next window starts whole";
  EXPECT_FALSE(a.flush()) << "nothing pending";
  EXPECT_DOUBLE_EQ(a.get_lr()[0], b.get_lr()[0]) << "the scheduler stepped once";
}

TEST(Engine, ClientOptimizerAndSchedulerAreSteppedByTheEngine) {
  auto model = reference_linear();
  auto optimizer =
      std::make_unique<torch::optim::SGD>(model->parameters(), torch::optim::SGDOptions(0.1));
  auto scheduler = std::make_unique<torch::optim::StepLR>(*optimizer, 1, 0.5);
  auto engine = initialize(model, Config::from_string(R"({"train_batch_size": 4,
      "gradient_accumulation_steps": 2, "steps_per_print": 1000})"),
                           std::move(optimizer), std::move(scheduler));
  for (int64_t t = 0; t < 4; ++t) {
    auto [x, y] = reference_samples(2 * t, 2);
    engine.backward(torch::mse_loss(model->forward(x), y));
    engine.step();
  }
  EXPECT_EQ(engine.global_steps(), 2);
  // LibTorch's StepLR keeps the lr on its first step and halves it on the second.
  EXPECT_DOUBLE_EQ(engine.get_lr()[0], 0.05);
  EXPECT_EQ(scheduler_step_count(*engine.lr_scheduler()), 2);
}

TEST(Engine, AdamMeansAdamWUnlessAdamWModeIsOff) {
  auto make = [](const std::string& params) {
    return initialize(
        reference_linear(), Config::from_string(R"({"train_batch_size": 2, "optimizer": {"type":
                          "Adam", "params": )" + params +
                                                "}}"));
  };
  auto decoupled = make(R"({"weight_decay": 0.1})");
  EXPECT_NE(dynamic_cast<torch::optim::AdamW*>(&decoupled.optimizer()), nullptr);
  auto coupled = make(R"({"weight_decay": 0.1, "adam_w_mode": false})");
  EXPECT_NE(dynamic_cast<torch::optim::Adam*>(&coupled.optimizer()), nullptr);
  EXPECT_EQ(dynamic_cast<torch::optim::AdamW*>(&coupled.optimizer()), nullptr);
}

std::string init_error(const std::string& json, bool client_optimizer = false,
                       bool client_scheduler = false) {
  auto model = reference_linear();
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  std::unique_ptr<torch::optim::LRScheduler> scheduler;
  if (client_optimizer || client_scheduler) {
    optimizer =
        std::make_unique<torch::optim::SGD>(model->parameters(), torch::optim::SGDOptions(0.1));
  }
  if (client_scheduler) scheduler = std::make_unique<torch::optim::StepLR>(*optimizer, 1);
  try {
    initialize(model, Config::from_string(json), std::move(optimizer), std::move(scheduler));
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "no error";
}

TEST(Engine, InitializeErrors) {
  EXPECT_EQ(init_error(R"({"train_batch_size": 2})"),
            "no optimizer: add an \"optimizer\" section to the config (for example {\"type\": "
            "\"AdamW\", \"params\": {\"lr\": 0.001}}) or pass one to stepwise::initialize");
  EXPECT_EQ(init_error(R"({"train_batch_size": 2, "optimizer": {"type": "SGD"}})", true),
            "both a client optimizer and an \"optimizer\" config section (type \"SGD\") were "
            "given; remove one of them");
  EXPECT_EQ(init_error(R"({"train_batch_size": 2, "scheduler": {"type": "WarmupLR"}})", true, true),
            "both a client LR scheduler and a \"scheduler\" config section (type \"WarmupLR\") "
            "were given; stepwise refuses to guess which wins: remove one of them");
}

TEST(Engine, NullOrFrozenModelIsAConfigError) {
  const auto config =
      Config::from_string(R"({"train_batch_size": 2, "optimizer": {"type": "SGD"}})");
  try {
    initialize(std::shared_ptr<torch::nn::Module>(), config);
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_STREQ(e.what(), "stepwise::initialize got a null model");
  }
  auto frozen = reference_linear();
  for (auto& p : frozen->parameters()) p.requires_grad_(false);
  try {
    initialize(frozen, config);
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_STREQ(e.what(), "the model has no parameters that require grad; nothing to train");
  }
}

}  // namespace
}  // namespace stepwise
