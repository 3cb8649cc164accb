// ZeRO on one process: which rank owns which parameter, and stages 1 and 2 at W = 1 (as
// DeepSpeed allows) are stage 0. The W = 2 matrix is tests/distributed/zero_worker.cpp.
#include <stepwise/stepwise.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "zero.h"

namespace stepwise {
namespace {

using detail::owners_by_size;

TEST(ZeroShards, WholeTensorsInOrderNearestEachRanksShare) {
  EXPECT_EQ(owners_by_size({100, 100, 100, 100}, 2), (std::vector<int64_t>{0, 0, 1, 1}));
  EXPECT_EQ(owners_by_size({100, 100, 100, 100}, 4), (std::vector<int64_t>{0, 1, 2, 3}));
  // A tensor goes to the rank whose share holds its middle.
  EXPECT_EQ(owners_by_size({1000, 1, 1, 1}, 2), (std::vector<int64_t>{0, 1, 1, 1}));
  EXPECT_EQ(owners_by_size({1, 1000}, 2), (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(owners_by_size({128, 128, 128, 8, 8, 1}, 2), (std::vector<int64_t>{0, 0, 1, 1, 1, 1}));
  // More ranks than tensors: some ranks own none (and step nothing).
  EXPECT_EQ(owners_by_size({10, 10}, 4), (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(owners_by_size({7}, 1), (std::vector<int64_t>{0}));
}

TEST(ZeroShards, AnOptimizerOverNoParametersStepsNothing) {
  // A rank that owns no parameter builds its optimizer over none.
  for (const char* type : {"AdamW", "SGD"}) {
    auto optimizer = make_optimizer(OptimizerOptions(type), std::vector<torch::Tensor>{});
    EXPECT_NO_THROW(optimizer->step()) << type;
  }
  auto fused =
      make_optimizer(OptimizerOptions("AdamW").torch_adam(false), std::vector<torch::Tensor>{});
  EXPECT_NO_THROW(fused->step());
}

TEST(ZeroShards, StagesOneAndTwoOnOneRankAreStageZero) {
  const auto run = [](int64_t stage) {
    torch::manual_seed(3);
    auto model = std::make_shared<torch::nn::Linear>(4, 3);
    auto engine = initialize(
        *model,
        Config::from_json({{"train_micro_batch_size_per_gpu", 2},
                           {"gradient_accumulation_steps", 2},
                           {"gradient_clipping", 0.1},
                           {"bf16", {{"enabled", true}}},
                           {"zero_optimization", {{"stage", stage}}},
                           {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 0.01}}}}}}));
    for (int t = 0; t < 8; ++t) {
      auto x = torch::randn({2, 4}).to(torch::kBFloat16);
      engine.backward((*model)->forward(x).to(torch::kFloat).pow(2).mean());
      engine.step();
    }
    EXPECT_EQ(engine.master_params().size(), 2u) << "W = 1 keeps every master";
    return std::make_pair(engine.master_params()[0].clone(), engine.global_grad_norm());
  };
  const auto zero = run(0);
  for (int64_t stage : {1, 2}) {
    const auto sharded = run(stage);
    EXPECT_TRUE(torch::equal(zero.first, sharded.first)) << "stage " << stage;
    EXPECT_EQ(zero.second, sharded.second) << "stage " << stage;
  }
}

TEST(ZeroShards, AStageBuiltInCppIsCheckedToo) {
  // A Config built in C++ skips the JSON parser's check of the stage.
  Config config;
  config.train_micro_batch_size_per_gpu = 2;
  config.optimizer = OptimizerOptions("SGD").lr(0.1);
  config.zero = distributed::ZeroOptions().stage(3);
  auto model = std::make_shared<torch::nn::Linear>(4, 3);
  try {
    initialize(*model, config);
    FAIL() << "stage 3 was accepted";
  } catch (const ConfigError& e) {
    EXPECT_STREQ(e.what(),
                 "ZeroOptions().stage(3): stepwise runs ZeRO stages 0, 1 and 2 (3 partitions the "
                 "parameters themselves, which it does not implement)");
  }
}

// NOTE: [ZeRO-Offload]: with the parameters on the CPU, offload to the CPU changes nothing
// (the same weights bit for bit, and one note); an optimizer passed to initialize is refused
// as DeepSpeed refuses it, unless zero_force_ds_cpu_optimizer is false.
TEST(ZeroShards, OffloadToTheCpuOfCpuParametersChangesNothing) {
  const auto json = [](bool offload) {
    nlohmann::json j = {{"train_micro_batch_size_per_gpu", 2},
                        {"gradient_accumulation_steps", 2},
                        {"zero_optimization", {{"stage", 2}}},
                        {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 0.01}}}}}};
    if (offload) j["zero_optimization"]["offload_optimizer"] = {{"device", "cpu"}};
    return j;
  };
  const auto run = [](const Config& config) {
    torch::manual_seed(3);
    auto model = std::make_shared<torch::nn::Linear>(4, 3);
    auto engine = initialize(*model, config);
    for (int t = 0; t < 6; ++t) {
      engine.backward((*model)->forward(torch::randn({2, 4})).pow(2).mean());
      engine.step();
    }
    return (*model)->weight.detach().clone();
  };
  const auto offloaded = Config::from_json(json(true));
  EXPECT_TRUE(torch::equal(run(Config::from_json(json(false))), run(offloaded)));
  ::testing::internal::CaptureStderr();
  run(offloaded);
  EXPECT_NE(::testing::internal::GetCapturedStderr().find(
                "stepwise: note: zero_optimization.offload_optimizer \"cpu\": the parameters are "
                "on the CPU, so their optimizer state and fp32 masters are in host memory "
                "already; nothing moves"),
            std::string::npos);
  auto model = std::make_shared<torch::nn::Linear>(4, 3);
  auto client = [&] { return std::make_unique<torch::optim::SGD>((*model)->parameters(), 0.1); };
  auto without = json(true);
  without.erase("optimizer");
  try {
    initialize(*model, Config::from_json(without), client());
    FAIL() << "a client optimizer was taken with offload_optimizer";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("unless \"zero_force_ds_cpu_optimizer\": false"),
              std::string::npos)
        << e.what();
  }
  without["zero_force_ds_cpu_optimizer"] = false;
  EXPECT_NO_THROW(initialize(*model, Config::from_json(without), client()));
}

}  // namespace
}  // namespace stepwise
