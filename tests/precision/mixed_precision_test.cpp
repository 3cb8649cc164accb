// fp16 and bf16 through the engine, on CPU (and on CUDA when a device exists).
//
// LibTorch 1.13 on CPU has no half matmul, so the fp16 model is built from
// element-wise ops and reductions, which do run in half on CPU.
#include <stepwise/engine.h>

#include <gtest/gtest.h>

#include <limits>

#include "support/reference_problem.h"

namespace stepwise {
namespace {

using testing::reference_linear;
using testing::reference_samples;

struct ElementwiseImpl : torch::nn::Module {
  torch::Tensor w, b;
  ElementwiseImpl() {
    w = register_parameter("w", torch::tensor({0.5f, -0.25f, 0.125f, 1.0f}));
    b = register_parameter("b", torch::tensor({0.05f}));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return (x.to(w.scalar_type()) * w).sum(1, true) + b;
  }
};
TORCH_MODULE(Elementwise);

torch::Tensor mse(const torch::Tensor& pred, const torch::Tensor& y) {
  return (pred - y.to(pred.scalar_type())).pow(2).mean();
}

const char* kFp16 = R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
    "steps_per_print": 1000, "gradient_clipping": 1.0,
    "fp16": {"enabled": true, "initial_scale_power": 4, "hysteresis": 1},
    "optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_max_lr": 0.01, "warmup_num_steps": 10,
                  "warmup_type": "linear"}}})";
const char* kFp16Fused = R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
    "steps_per_print": 1000, "gradient_clipping": 1.0,
    "fp16": {"enabled": true, "initial_scale_power": 4, "hysteresis": 1},
    "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "torch_adam": false}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_max_lr": 0.01, "warmup_num_steps": 10,
                  "warmup_type": "linear"}}})";

// Runs `windows` accumulation windows; in the windows listed in `poisoned` one
// gradient is made inf by a hook. Returns the engine for inspection.
struct Fp16Run {
  Elementwise model;
  Engine engine;
  bool poison = false;

  explicit Fp16Run(torch::Device device, const char* config = kFp16)
      : model(), engine(initialize((model->to(device), model), Config::from_string(config))) {
    model->w.register_hook([this](torch::Tensor g) {
      return poison ? g * std::numeric_limits<float>::infinity() : g;
    });
  }
  void window(int64_t first_sample, bool poisoned) {
    poison = poisoned;
    for (int m = 0; m < 2; ++m) {
      auto [x, y] = reference_samples(first_sample + 2 * m, 2);
      auto device = model->w.device();
      auto loss = mse(model->forward(x.to(device)), y.to(device));
      auto returned = engine.backward(loss);
      EXPECT_NEAR(returned.item<double>(), loss.item<double>() / 2, 1e-6 * loss.item<double>())
          << "backward() returns loss / GAS, never times the loss scale";
      engine.step();
    }
    poison = false;
  }
  torch::Tensor weights() const { return model->w.detach().to(torch::kFloat).cpu().clone(); }
};

void overflow_skips_optimizer_and_scheduler(torch::Device device, const char* config = kFp16) {
  Fp16Run a(device, config);
  EXPECT_EQ(a.model->w.scalar_type(), torch::kHalf) << "the model runs in half";
  EXPECT_EQ(a.engine.loss_scale(), 16.0);
  a.window(0, false);
  EXPECT_EQ(a.engine.global_steps(), 1);
  EXPECT_TRUE(a.engine.was_step_applied());
  const auto weights = a.weights();
  const auto lr = a.engine.get_lr()[0];
  const auto* schedule = dynamic_cast<const Schedule*>(a.engine.lr_scheduler());

  a.window(4, true);  // overflow
  EXPECT_FALSE(a.engine.was_step_applied());
  EXPECT_EQ(a.engine.global_steps(), 2) << "global_steps advances on a skipped step";
  EXPECT_EQ(a.engine.skipped_steps(), 1);
  EXPECT_EQ(a.engine.loss_scale(), 8.0) << "hysteresis 1: the scale halves";
  EXPECT_TRUE(torch::equal(a.weights(), weights)) << "weights unchanged";
  EXPECT_EQ(a.engine.get_lr()[0], lr) << "the scheduler did not step";
  EXPECT_EQ(schedule->step_count(), a.engine.global_steps() - a.engine.skipped_steps());
  EXPECT_FALSE(a.model->w.grad().defined()) << "gradients dropped";

  a.window(8, false);  // the next good step proceeds
  EXPECT_TRUE(a.engine.was_step_applied());
  EXPECT_EQ(schedule->step_count(), 2);

  // The same training without the poisoned window: identical, so the overflow
  // left no trace in the optimizer state (Adam's step count, moments) either.
  Fp16Run b(device, config);
  b.window(0, false);
  b.window(8, false);
  EXPECT_TRUE(torch::equal(a.weights(), b.weights())) << a.weights() << b.weights();
  EXPECT_EQ(a.engine.get_lr()[0], b.engine.get_lr()[0]);
}

TEST(Fp16, OverflowSkipsOptimizerAndSchedulerButCountsTheStep) {
  overflow_skips_optimizer_and_scheduler(torch::kCPU);
}

TEST(Fp16, OverflowSemanticsOnCuda) {
  if (!torch::cuda::is_available()) {
    GTEST_SKIP() << "needs a CUDA LibTorch and a GPU; this build/machine has none";
  }
  overflow_skips_optimizer_and_scheduler(torch::kCUDA);  // FusedAdamW with write-back
}

TEST(Fp16, OverflowSemanticsWithTheFusedOptimizerOnCpu) {
  // The CUDA path's optimizer (FusedAdamW writing the half model) through its ATen
  // backend: the same skip semantics.
  overflow_skips_optimizer_and_scheduler(torch::kCPU, kFp16Fused);
}

TEST(Fp16, MasterWeightsAreFp32AndTrackAnFp32Run) {
  Fp16Run half(torch::kCPU);
  auto model32 = Elementwise();
  auto engine32 = initialize(model32, Config::from_string(R"({"train_micro_batch_size_per_gpu": 2,
      "gradient_accumulation_steps": 2, "steps_per_print": 1000, "gradient_clipping": 1.0,
      "optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
      "scheduler": {"type": "WarmupLR", "params": {"warmup_max_lr": 0.01,
                    "warmup_num_steps": 10, "warmup_type": "linear"}}})"));
  for (int64_t s = 0; s < 6; ++s) {
    half.window(4 * s, false);
    for (int m = 0; m < 2; ++m) {
      auto [x, y] = reference_samples(4 * s + 2 * m, 2);
      engine32.backward(mse(model32->forward(x), y));
      engine32.step();
    }
  }
  const auto& masters = half.engine.precision().optimizer_params();
  EXPECT_EQ(masters[0].scalar_type(), torch::kFloat);
  EXPECT_EQ(half.engine.skipped_steps(), 0);
  EXPECT_TRUE(torch::allclose(masters[0], model32->w, 0, 5e-3)) << masters[0] << model32->w;
  EXPECT_TRUE(torch::allclose(half.weights(), masters[0], 0, 1e-3)) << "model = half(masters)";
}

TEST(Fp16, ClientOptimizerIsRefused) {
  auto model = Elementwise();
  auto optimizer =
      std::make_unique<torch::optim::SGD>(model->parameters(), torch::optim::SGDOptions(0.1));
  try {
    initialize(model, Config::from_string(R"({"train_batch_size": 2, "fp16": {"enabled": true}})"),
               std::move(optimizer));
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_STREQ(e.what(),
                 "a client optimizer cannot be combined with fp16.enabled: the engine must build "
                 "the optimizer over its fp32 master weights; use the config's \"optimizer\" "
                 "section instead");
  }
}

TEST(Bf16, LinearTrainsInBf16WithFp32MastersCloseToFp32) {
  auto run = [](bool bf16) {
    auto model = reference_linear();
    auto engine =
        initialize(model, Config::from_string(std::string(R"({"train_micro_batch_size_per_gpu": 2,
          "gradient_accumulation_steps": 2, "steps_per_print": 1000, "gradient_clipping": 0.5,
          "optimizer": {"type": "AdamW", "params": {"lr": 0.05}}, "bf16": {"enabled": )") +
                                              (bf16 ? "true" : "false") + "}}"));
    EXPECT_EQ(model->weight.scalar_type(), bf16 ? torch::kBFloat16 : torch::kFloat);
    for (int64_t t = 0; t < 16; ++t) {
      auto [x, y] = reference_samples(2 * t, 2);
      auto dtype = model->weight.scalar_type();
      // (LibTorch 1.13 has no bf16 mse_loss on CPU; the same formula by hand.)
      auto loss = mse(model->forward(x.to(dtype)), y);
      engine.backward(loss);
      engine.step();
    }
    EXPECT_EQ(engine.skipped_steps(), 0) << "bf16 never skips";
    EXPECT_EQ(engine.loss_scale(), 1.0);
    return engine.precision().optimizer_params()[0].detach().clone();
  };
  const auto fp32 = run(false);
  const auto bf16 = run(true);
  EXPECT_EQ(bf16.scalar_type(), torch::kFloat) << "masters are fp32";
  // Stated tolerance: bf16 keeps 8 bits of mantissa; after 8 Adam steps of lr 0.05
  // the masters stay within 0.02 of the fp32 run.
  EXPECT_TRUE(torch::allclose(bf16, fp32, 0, 0.02)) << bf16 << fp32;
  EXPECT_FALSE(torch::allclose(bf16, reference_linear()->weight, 0, 0.1)) << "it trained";
}

}  // namespace
}  // namespace stepwise
