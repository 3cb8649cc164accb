// The engine against traces recorded from DeepSpeed v0.14.5 (tests/data/deepspeed).
#include <stepwise/engine.h>
#include <stepwise/fused_adamw.h>

#include <gtest/gtest.h>

#include "support/reference_problem.h"

namespace stepwise {
namespace {

using testing::read_trace;
using testing::reference_linear;
using testing::reference_samples;
using testing::reference_start;

void expect_rel(double actual, double expected, double rel, const std::string& what) {
  EXPECT_NEAR(actual, expected, rel * std::max(1.0, std::fabs(expected))) << what;
}

// A trace file, and the optimizer: the config's default for the test device (LibTorch's
// on CPU, FusedAdamW's kernels on CUDA), or FusedAdamW forced ("torch_adam": false).
struct TraceCase {
  std::string file;
  bool force_fused = false;
};

class DeepSpeedTrace : public ::testing::TestWithParam<TraceCase> {};

TEST_P(DeepSpeedTrace, SameEveryMicroStepAndSameFinalWeights) {
  const auto trace = read_trace(GetParam().file);
  ASSERT_FALSE(trace.micro.empty());
  ASSERT_EQ(trace.setup["world_size"], 1) << "multi-rank traces need the distributed engine";
  // The recorded DeepSpeed config is used unchanged: a user's ds_config.json works as is.
  auto config = trace.setup["config"];
  if (GetParam().force_fused) config["optimizer"]["params"]["torch_adam"] = false;
  const auto device = testing::test_device();
  auto model = reference_linear();
  model->to(device);
  auto engine = initialize(model, Config::from_json(config));
  // The traces were recorded with "torch_adam": true (LibTorch's Adam on every device);
  // without the key the default is fused on CUDA only. see NOTE: [fused by device]
  const auto& params = config["optimizer"]["params"];
  const bool fused =
      params.contains("torch_adam") ? !params["torch_adam"].get<bool>() : device.is_cuda();
  EXPECT_EQ(dynamic_cast<FusedAdamW*>(&engine.optimizer()) != nullptr, fused)
      << "see NOTE: [fused by device]";
  const int64_t gas = engine.gradient_accumulation_steps();
  const int64_t mbs = engine.train_micro_batch_size_per_gpu();
  EXPECT_EQ(gas, trace.setup["gas"]);
  EXPECT_EQ(mbs, trace.setup["micro_bs"]);
  EXPECT_EQ(engine.train_batch_size(), trace.setup["train_batch_size"]);

  for (const auto& rec : trace.micro) {
    const int64_t t = rec["micro_step"];
    const std::string at = "micro_step " + std::to_string(t);
    auto [x_cpu, y_cpu] = reference_samples(reference_start(t, gas, mbs, 1, 0), mbs);
    const auto x = x_cpu.to(device);
    const auto y = y_cpu.to(device);
    EXPECT_EQ(x.size(0), static_cast<int64_t>(rec["sample_indices"].size()));
    auto loss = torch::mse_loss(model->forward(x), y);
    expect_rel(loss.item<double>(), rec["forward_loss"], 1e-5, at + " forward_loss");
    EXPECT_EQ(engine.is_gradient_accumulation_boundary(), rec["is_gas_boundary"]) << at;
    const double lr_before = engine.get_lr().at(0);
    expect_rel(lr_before, rec["lr_before_step"], 1e-12, at + " lr_before_step");
    auto returned = engine.backward(loss);
    expect_rel(returned.item<double>(), rec["backward_return"], 1e-5, at + " backward_return");
    EXPECT_FALSE(returned.requires_grad()) << at;
    const int64_t steps_before = engine.global_steps();
    engine.step();
    EXPECT_EQ(engine.global_steps() > steps_before, rec["optimizer_step_happened"]) << at;
    EXPECT_EQ(engine.was_step_applied(), rec["was_step_applied"]) << at;
    EXPECT_EQ(engine.global_steps(), rec["global_steps"]) << at;
    EXPECT_EQ(engine.global_samples(), rec["global_samples"]) << at;
    EXPECT_EQ(engine.micro_steps(), rec["micro_steps"]) << at;
    if (!rec["grad_norm_pre_clip"].is_null()) {
      expect_rel(engine.global_grad_norm(), rec["grad_norm_pre_clip"], 1e-5, at + " grad norm");
    }
    expect_rel(engine.get_lr().at(0), rec["lr_after_step"], 1e-12, at + " lr_after_step");
  }
  const auto& w = trace.final_weights;
  for (int64_t b = 0; b < 4; ++b) {
    EXPECT_NEAR(model->weight[0][b].item<double>(), w["weight"][b].get<double>(), 1e-5)
        << "weight " << b;
  }
  EXPECT_NEAR(model->bias[0].item<double>(), w["bias"][0].get<double>(), 1e-5) << "bias";
}

INSTANTIATE_TEST_SUITE_P(Ws1, DeepSpeedTrace,
                         ::testing::Values(TraceCase{"linear_adam_none_ws1_mbs2_gas4.txt"},
                                           TraceCase{"linear_adam_none_ws1_mbs8_gas1.txt"},
                                           TraceCase{"linear_adam_none_ws1_mbs2_gas4.txt", true},
                                           TraceCase{"linear_adam_none_ws1_mbs8_gas1.txt", true}),
                         [](const auto& info) {
                           const bool gas4 = info.param.file.find("gas4") != std::string::npos;
                           return std::string(gas4 ? "Mbs2Gas4" : "Mbs8Gas1") +
                                  (info.param.force_fused ? "FusedAdamW" : "");
                         });

}  // namespace
}  // namespace stepwise
