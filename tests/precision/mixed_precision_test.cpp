// fp16 and bf16 through the engine, on CPU (and on CUDA when a device exists).
//
// LibTorch 1.13 on CPU has no half matmul, so the fp16 model is built from
// element-wise ops and reductions, which do run in half on CPU.
#include <stepwise/engine.h>

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "support/error_of.h"
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

// NOTE: [rounding tolerance] a run in half (bf16) differs from the same run in fp32 only
// by rounding: the inputs, the weights the forward reads and each op's result are rounded
// to the type's unit roundoff u (2^-11 for half, 2^-8 for bf16), so each gradient is off
// by a relative error of the order of u (the roundings have both signs and mostly cancel
// in these four-term models). Adam's update is invariant to the gradients' scale, so a
// relative error d in them moves an update of size lr by at most about 2 * d * lr. Summed
// over the steps taken, the masters stay within 2 * u * sum(lr) of the fp32 run (measured:
// about a tenth of that, in both types), a small fraction of the distance they travel,
// which a run that drops or rounds updates would exceed.
double rounding_tolerance(double unit_roundoff, const std::vector<double>& lrs) {
  double sum = 0.0;
  for (double lr : lrs) sum += lr;
  return 2 * unit_roundoff * sum;
}

TEST(Fp16, MasterWeightsAreFp32AndTrackAnFp32Run) {
  Fp16Run half(torch::kCPU);
  auto model32 = Elementwise();
  auto engine32 = initialize(model32, Config::from_string(R"({"train_micro_batch_size_per_gpu": 2,
      "gradient_accumulation_steps": 2, "steps_per_print": 1000, "gradient_clipping": 1.0,
      "optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
      "scheduler": {"type": "WarmupLR", "params": {"warmup_max_lr": 0.01,
                    "warmup_num_steps": 10, "warmup_type": "linear"}}})"));
  const auto start = model32->w.detach().clone();
  std::vector<double> lrs;  // the lr of every step taken
  for (int64_t s = 0; s < 30; ++s) {
    lrs.push_back(engine32.get_lr()[0]);
    half.window(4 * s, false);
    for (int m = 0; m < 2; ++m) {
      auto [x, y] = reference_samples(4 * s + 2 * m, 2);
      engine32.backward(mse(model32->forward(x), y));
      engine32.step();
    }
  }
  const auto& masters = half.engine.master_params();
  EXPECT_EQ(masters[0].scalar_type(), torch::kFloat);
  EXPECT_EQ(half.engine.skipped_steps(), 0);
  const double tolerance = rounding_tolerance(std::ldexp(1.0, -11), lrs);
  const double diff = (masters[0] - model32->w).abs().max().item<double>();
  const double travelled = (model32->w - start).abs().max().item<double>();
  EXPECT_LE(diff, tolerance) << masters[0] << model32->w;
  EXPECT_LE(tolerance, 0.1 * travelled) << "the bound is tight enough to mean something";
  EXPECT_FALSE(masters[0].equal(masters[0].to(torch::kHalf).to(torch::kFloat)))
      << "the masters keep what half cannot hold";
  EXPECT_TRUE(half.weights().equal(masters[0].to(torch::kHalf).to(torch::kFloat)))
      << "model = half(masters), rounded to nearest";
}

// see NOTE: [client optimizer masters]
TEST(Fp16, AClientOptimizerStepsTheMastersWithItsOwnGroups) {
  auto model = Elementwise();
  // Two groups: the bias's lr is 0, so only the weight may move.
  std::vector<torch::optim::OptimizerParamGroup> groups = {
      torch::optim::OptimizerParamGroup({model->w},
                                        std::make_unique<torch::optim::SGDOptions>(0.1)),
      torch::optim::OptimizerParamGroup({model->b},
                                        std::make_unique<torch::optim::SGDOptions>(0.0))};
  auto optimizer = std::make_unique<torch::optim::SGD>(groups, torch::optim::SGDOptions(0.1));
  auto* client = optimizer.get();
  auto engine = initialize(
      model,
      Config::from_string(
          R"({"train_batch_size": 2, "steps_per_print": 1000, "fp16": {"enabled": true, "initial_scale_power": 4}})"),
      std::move(optimizer));
  ASSERT_EQ(client->param_groups().size(), 2u);
  EXPECT_TRUE(client->param_groups()[0].params()[0].is_same(engine.master_params()[0]));
  EXPECT_TRUE(client->param_groups()[1].params()[0].is_same(engine.master_params()[1]));
  EXPECT_EQ(client->param_groups()[0].params()[0].scalar_type(), torch::kFloat);
  EXPECT_EQ(model->w.scalar_type(), torch::kHalf);
  const auto w0 = engine.master_params()[0].detach().clone();
  const auto b0 = engine.master_params()[1].detach().clone();
  for (int t = 0; t < 3; ++t) {
    auto x = torch::randn({2, 4});
    engine.backward(mse(model->forward(x), x.sum(1, true)));
    engine.step();
  }
  EXPECT_EQ(engine.global_steps(), 3);
  EXPECT_EQ(engine.skipped_steps(), 0);
  EXPECT_FALSE(torch::equal(engine.master_params()[0], w0)) << "the weight's group stepped";
  EXPECT_TRUE(torch::equal(engine.master_params()[1], b0)) << "the bias's group has lr 0";
  EXPECT_TRUE(torch::equal(model->w, engine.master_params()[0].to(torch::kHalf)))
      << "the model is the masters, rounded";
}

TEST(Bf16, AClientOptimizerTrainsAsTheConfigsOptimizerDoes) {
  auto run = [](bool client) {
    auto model = reference_linear();
    const std::string optimizer_section =
        client ? ""
               : R"(, "optimizer": {"type": "AdamW", "params": {"lr": 0.05, "torch_adam": true}})";
    auto config = Config::from_string(R"({"train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 2, "steps_per_print": 1000, "gradient_clipping": 0.5,
        "bf16": {"enabled": true})" + optimizer_section +
                                      "}");
    std::unique_ptr<torch::optim::Optimizer> optimizer;
    if (client) {
      optimizer = std::make_unique<torch::optim::AdamW>(
          model->parameters(), torch::optim::AdamWOptions(0.05).weight_decay(0.0));
    }
    auto engine = initialize(model, config, std::move(optimizer));
    for (int64_t t = 0; t < 12; ++t) {
      auto [x, y] = reference_samples(2 * t, 2);
      engine.backward(mse(model->forward(x.to(torch::kBFloat16)), y));
      engine.step();
    }
    return engine.master_params()[0].detach().clone();
  };
  const auto configured = run(false);
  EXPECT_TRUE(torch::equal(run(true), configured)) << "bit for bit";
  EXPECT_FALSE(torch::equal(configured, reference_linear()->weight)) << "it trained";
}

// A client optimizer under fp16 steps the masters exactly as the config's optimizer of the
// same kind does, overflow steps (skipped, the scale halved) included; under bf16 too, for
// SGD with momentum.
std::vector<torch::Tensor> masters_after(
    const std::string& precision, const std::string& optimizer_section,
    std::unique_ptr<torch::optim::Optimizer> (*client)(std::vector<torch::Tensor>),
    int64_t* skipped) {
  auto model = Elementwise();
  const bool use_client = optimizer_section.empty();
  auto config = Config::from_string(
      R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
          "steps_per_print": 1000, "gradient_clipping": 1.0, )" +
      precision + optimizer_section + "}");
  auto engine = initialize(
      model, config,
      use_client ? client(model->parameters()) : std::unique_ptr<torch::optim::Optimizer>());
  for (int64_t t = 0; t < 24; ++t) {
    torch::manual_seed(t);
    auto x = torch::randn({2, 4});
    engine.backward(mse(model->forward(x), x.sum(1, true)));
    engine.step();
  }
  if (skipped != nullptr) *skipped = engine.skipped_steps();
  std::vector<torch::Tensor> out;
  for (const auto& m : engine.master_params()) out.push_back(m.detach().clone());
  return out;
}

void expect_equal(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i], b[i])) << "master " << i;
}

TEST(Fp16, AClientAdamWEqualsTheConfigsAdamWThroughOverflowSteps) {
  // 2^20: the first steps overflow in half and are skipped while the scale halves.
  const std::string fp16 = R"("fp16": {"enabled": true, "initial_scale_power": 20,
                                       "loss_scale_window": 4})";
  int64_t skipped = 0;
  const auto configured = masters_after(
      fp16, R"(, "optimizer": {"type": "AdamW", "params": {"lr": 0.05, "torch_adam": true}})",
      nullptr, &skipped);
  const auto client = masters_after(
      fp16, "",
      [](std::vector<torch::Tensor> params) -> std::unique_ptr<torch::optim::Optimizer> {
        return std::make_unique<torch::optim::AdamW>(
            params, torch::optim::AdamWOptions(0.05).weight_decay(0.0));
      },
      nullptr);
  EXPECT_GT(skipped, 0) << "the run must include overflow steps";
  expect_equal(client, configured);
  EXPECT_FALSE(torch::equal(configured[0], Elementwise()->w)) << "it trained";
}

TEST(Bf16, AClientSgdWithMomentumEqualsTheConfigsSgd) {
  const std::string bf16 = R"("bf16": {"enabled": true})";
  const auto configured = masters_after(
      bf16, R"(, "optimizer": {"type": "SGD", "params": {"lr": 0.05, "momentum": 0.9}})", nullptr,
      nullptr);
  const auto client = masters_after(
      bf16, "",
      [](std::vector<torch::Tensor> params) -> std::unique_ptr<torch::optim::Optimizer> {
        return std::make_unique<torch::optim::SGD>(params,
                                                   torch::optim::SGDOptions(0.05).momentum(0.9));
      },
      nullptr);
  expect_equal(client, configured);
  EXPECT_FALSE(torch::equal(configured[0], Elementwise()->w)) << "it trained";
}

TEST(Bf16, AClientOptimizerOverOtherTensorsOrWithStateIsRefusedByName) {
  const auto bf16 = R"({"train_batch_size": 2, "bf16": {"enabled": true}})";
  auto foreign = torch::zeros({3}, torch::requires_grad());
  EXPECT_EQ(testing::error_of<ConfigError>([&] {
              initialize(Elementwise(), Config::from_string(bf16),
                         std::make_unique<torch::optim::SGD>(std::vector<torch::Tensor>{foreign},
                                                             torch::optim::SGDOptions(0.1)));
            }),
            "the client optimizer holds a tensor of shape [3] that is not a trainable parameter "
            "of the model; with bf16 the engine replaces each of its parameters by that "
            "parameter's fp32 master weight, so build the optimizer over the model's parameters "
            "(model->parameters())");
  auto model = Elementwise();
  auto stepped =
      std::make_unique<torch::optim::Adam>(model->parameters(), torch::optim::AdamOptions(0.1));
  model->forward(torch::ones({1, 4})).sum().backward();
  stepped->step();
  EXPECT_EQ(testing::error_of<ConfigError>(
                [&] { initialize(model, Config::from_string(bf16), std::move(stepped)); }),
            "the client optimizer has state already; with bf16 the engine hands it the fp32 "
            "master weights, which that state does not belong to: pass an optimizer that has "
            "not stepped");
}

TEST(Bf16, LinearTrainsInBf16WithFp32MastersCloseToFp32) {
  constexpr int64_t kSteps = 30;  // optimizer steps (GAS 2)
  auto run = [](bool bf16) {
    auto model = reference_linear();
    auto engine =
        initialize(model, Config::from_string(std::string(R"({"train_micro_batch_size_per_gpu": 2,
          "gradient_accumulation_steps": 2, "steps_per_print": 1000, "gradient_clipping": 0.5,
          "optimizer": {"type": "AdamW", "params": {"lr": 0.05}}, "bf16": {"enabled": )") +
                                              (bf16 ? "true" : "false") + "}}"));
    EXPECT_EQ(model->weight.scalar_type(), bf16 ? torch::kBFloat16 : torch::kFloat);
    for (int64_t t = 0; t < 2 * kSteps; ++t) {
      auto [x, y] = reference_samples(2 * t, 2);
      auto dtype = model->weight.scalar_type();
      // (LibTorch 1.13 has no bf16 mse_loss on CPU; the same formula by hand.)
      auto loss = mse(model->forward(x.to(dtype)), y);
      engine.backward(loss);
      engine.step();
    }
    EXPECT_EQ(engine.skipped_steps(), 0) << "bf16 never skips";
    EXPECT_EQ(engine.loss_scale(), 1.0);
    return engine.master_params()[0].detach().clone();
  };
  const auto fp32 = run(false);
  const auto bf16 = run(true);
  EXPECT_EQ(bf16.scalar_type(), torch::kFloat) << "masters are fp32";
  // see NOTE: [rounding tolerance]: kSteps Adam steps of lr 0.05, bf16's u = 2^-8.
  const double tolerance =
      rounding_tolerance(std::ldexp(1.0, -8), std::vector<double>(kSteps, 0.05));
  const double diff = (bf16 - fp32).abs().max().item<double>();
  const double travelled = (fp32 - reference_linear()->weight).abs().max().item<double>();
  EXPECT_LE(diff, tolerance) << bf16 << fp32;
  EXPECT_LE(tolerance, 0.1 * travelled) << "the bound is tight enough to mean something";
  EXPECT_FALSE(torch::allclose(bf16, reference_linear()->weight, 0, 0.1)) << "it trained";
}

TEST(Fp16, OnTheCpuWarnsOnceNamingTheHalfKernelsThisLibTorchLacksAndBf16) {
  // What this LibTorch cannot run in half on the CPU, found here apart from the engine.
  const auto x = torch::ones({2, 2}, torch::kHalf);
  std::vector<std::string> lacks;
  try {
    torch::matmul(x, x);
  } catch (const c10::Error&) {
    lacks.push_back("matmul");
  }
  try {
    torch::layer_norm(x, {2});
  } catch (const c10::Error&) {
    lacks.push_back("LayerNorm");
  }
  // TORCH_WARN goes to stderr through c10's default handler (in every LibTorch version).
  ::testing::internal::CaptureStderr();
  {
    Elementwise model;
    auto engine = initialize(model, Config::from_string(kFp16));
  }
  const std::string printed = ::testing::internal::GetCapturedStderr();
  std::vector<std::string> about_half;  // the lines of the warning
  for (size_t at = printed.find("fp16 with parameters on the CPU"); at != std::string::npos;
       at = printed.find("fp16 with parameters on the CPU", at + 1)) {
    about_half.push_back(printed.substr(at, printed.find('\n', at) - at));
  }
  if (lacks.empty()) {  // a LibTorch with these kernels may still lack softmax or GELU
    EXPECT_LE(about_half.size(), 1u);
    return;
  }
  ASSERT_EQ(about_half.size(), 1u) << "one warning at initialize";
  for (const auto& op : lacks) EXPECT_NE(about_half[0].find(op), std::string::npos) << op;
  EXPECT_NE(about_half[0].find("\"bf16\": {\"enabled\": true}"), std::string::npos);
  EXPECT_NE(about_half[0].find("CUDA"), std::string::npos);

  ::testing::internal::CaptureStderr();  // bf16 on the CPU: nothing to warn about
  {
    Elementwise model;
    auto engine = initialize(model, Config::from_string(R"({"train_batch_size": 2,
        "bf16": {"enabled": true}, "optimizer": {"type": "AdamW", "params": {"lr": 0.01}}})"));
  }
  const std::string bf16_printed = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(bf16_printed.find("Half"), std::string::npos) << bf16_printed;
}

}  // namespace
}  // namespace stepwise
