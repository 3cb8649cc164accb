// stepwise::fused and FusedAdamW: the ATen backend against LibTorch's own optimizers
// and plain formulas, the argument checks, and (with a CUDA build and a GPU) the CUDA
// kernels against the ATen backend on many shapes, dtypes and inf/nan placements.
#include "fused.h"
#include <stepwise/clip.h>
#include <stepwise/config.h>
#include <stepwise/engine.h>
#include <stepwise/fused_adamw.h>

#include <gtest/gtest.h>

#include "support/error_of.h"

#include <cmath>
#include <limits>

namespace stepwise {
namespace {

namespace F = stepwise::fused;

// Sizes that cross every edge of the kernels: empty, odd, one chunk (65536) +-1,
// several chunks.
const std::vector<int64_t> kSizes = {0, 1, 3, 7, 127, 1000, 4097, 65535, 65536, 65537, 196613};

std::vector<torch::Tensor> random_list(torch::ScalarType dtype, torch::Device device,
                                       uint64_t seed) {
  torch::manual_seed(seed);
  std::vector<torch::Tensor> out;
  for (int64_t n : kSizes) out.push_back(torch::randn({n}).to(device, dtype));
  return out;
}

std::vector<torch::Tensor> clones(const std::vector<torch::Tensor>& list) {
  std::vector<torch::Tensor> out;
  for (const auto& t : list) out.push_back(t.clone());
  return out;
}

std::string why_no_cuda() {
  if (!F::cuda_kernels_built()) return "stepwise was built without CUDA kernels (CPU LibTorch)";
  if (!torch::cuda::is_available()) return "no CUDA device is visible";
  return "";
}

// --- The ATen backend -------------------------------------------------------------

TEST(Fused, GlobalNormMatchesADoubleReference) {
  for (auto dtype : {torch::kFloat, torch::kBFloat16, torch::kHalf}) {
    const auto list = random_list(dtype, torch::kCPU, 1);
    double sum = 0.0;
    for (const auto& t : list) sum += t.to(torch::kDouble).pow(2).sum().item<double>();
    // fp32 accumulation over ~270k elements against double: relative 1e-5.
    EXPECT_NEAR(F::global_norm(list).item<double>(), std::sqrt(sum), 1e-5 * std::sqrt(sum))
        << dtype;
  }
  EXPECT_EQ(F::global_norm({}).item<float>(), 0.0f) << "an empty list has norm 0";
}

TEST(Fused, UnscaleFlagsInfAndNanAnywhereAndScalesEverything) {
  for (auto dtype : {torch::kFloat, torch::kBFloat16, torch::kHalf}) {
    for (double bad :
         {std::numeric_limits<double>::infinity(), std::numeric_limits<double>::quiet_NaN()}) {
      for (int64_t tensor : {0L, 5L, 10L}) {  // first, a middle and the last tensor (196613)
        for (int where = 0; where < 3; ++where) {
          auto list = random_list(dtype, torch::kCPU, 2);
          auto& t = list[tensor];
          if (t.numel() == 0) continue;
          const int64_t at = where == 0 ? 0 : where == 1 ? t.numel() / 2 : t.numel() - 1;
          t[at] = bad;
          const auto flag = F::unscale_and_check(list, 0.5);
          EXPECT_EQ(flag.item<float>(), 1.0f) << dtype << " tensor " << tensor << " at " << at;
        }
      }
    }
    auto list = random_list(dtype, torch::kCPU, 3);
    const auto before = clones(list);
    EXPECT_EQ(F::unscale_and_check(list, 0.25).item<float>(), 0.0f) << "finite: no flag";
    for (size_t i = 0; i < list.size(); ++i) {
      // Multiplying by a power of two is exact in every float type.
      EXPECT_TRUE(torch::equal(list[i], before[i] * 0.25)) << dtype << " tensor " << i;
    }
  }
}

// Runs `steps` steps of FusedAdamW and of LibTorch's optimizer from the same start;
// parameter 1 has no gradient on even steps (it must lag, as in LibTorch).
template <typename TorchOptimizer, typename Options>
void compare_with_libtorch(bool decoupled, Options torch_options) {
  torch::manual_seed(4);
  std::vector<torch::Tensor> a, b, start;
  for (int64_t n : {5L, 4L, 1000L, 3L, 0L}) {
    start.push_back(torch::randn({n}));
    a.push_back(start.back().clone().requires_grad_(true));
    b.push_back(a.back().detach().clone().requires_grad_(true));
  }
  FusedAdamW fused(a,
                   torch::optim::AdamWOptions(0.01).betas({0.8, 0.99}).eps(1e-6).weight_decay(0.1),
                   FusedAdamWMode().decoupled(decoupled));
  TorchOptimizer reference(b,
                           torch_options.lr(0.01).betas({0.8, 0.99}).eps(1e-6).weight_decay(0.1));
  for (int step = 0; step < 20; ++step) {
    for (size_t i = 0; i < a.size(); ++i) {
      const bool skip = i == 1 && step % 2 == 0;
      const auto g = torch::randn_like(a[i]);
      a[i].mutable_grad() = skip ? torch::Tensor() : g.clone();
      b[i].mutable_grad() = skip ? torch::Tensor() : g.clone();
    }
    fused.step();
    reference.step();
  }
  for (size_t i = 0; i < a.size(); ++i) {
    // The same ATen ops in the same order: equal to float rounding (20 steps).
    EXPECT_TRUE(torch::allclose(a[i], b[i], 1e-6, 1e-7)) << "param " << i << a[i] - b[i];
    if (a[i].numel() > 0) EXPECT_FALSE(torch::equal(a[i], start[i])) << "param " << i << " moved";
  }
}

TEST(FusedAdamW, MatchesLibTorchAdamW) {
  compare_with_libtorch<torch::optim::AdamW>(true, torch::optim::AdamWOptions());
}

TEST(FusedAdamW, AdamModeMatchesLibTorchAdam) {
  compare_with_libtorch<torch::optim::Adam>(false, torch::optim::AdamOptions());
}

// DeepSpeed's FusedAdam with bias_correction false (csrc/adam/multi_tensor_adam.cu: both
// corrections are 1), written out in double: m and v as they are, in both weight-decay
// modes. The same steps with the correction on end elsewhere: the flag acts.
TEST(FusedAdamW, WithoutBiasCorrectionMatchesDeepSpeedsFormula) {
  for (bool decoupled : {true, false}) {
    torch::manual_seed(5);
    auto p = torch::randn({257}).requires_grad_(true);
    auto q = p.detach().clone().requires_grad_(true);
    auto ref = p.detach().to(torch::kDouble);
    auto m = torch::zeros_like(ref), v = torch::zeros_like(ref);
    const double lr = 0.01, b1 = 0.8, b2 = 0.99, eps = 1e-6, wd = 0.1;
    const auto options = torch::optim::AdamWOptions(lr).betas({b1, b2}).eps(eps).weight_decay(wd);
    FusedAdamW uncorrected({p}, options,
                           FusedAdamWMode().decoupled(decoupled).bias_correction(false));
    FusedAdamW corrected({q}, options, FusedAdamWMode().decoupled(decoupled));
    for (int step = 0; step < 10; ++step) {
      const auto g = torch::randn({257});
      p.mutable_grad() = g.clone();
      q.mutable_grad() = g.clone();
      uncorrected.step();
      corrected.step();
      auto gd = g.to(torch::kDouble);
      if (!decoupled) gd = gd + wd * ref;  // ADAM_MODE_0: L2, added to the gradient
      m = b1 * m + (1 - b1) * gd;
      v = b2 * v + (1 - b2) * gd * gd;
      auto update = m / (v.sqrt() + eps);
      if (decoupled) update = update + wd * ref;  // ADAM_MODE_1: decay in the update
      ref = ref - lr * update;
    }
    const auto got = p.detach().to(torch::kDouble);
    EXPECT_TRUE(torch::allclose(got, ref, 1e-5, 1e-6))
        << "decoupled " << decoupled << ": largest difference "
        << (got - ref).abs().max().item<double>();
    EXPECT_GT((p - q).abs().max().item<double>(), 1e-2) << "decoupled " << decoupled;
  }
}

TEST(Fused, AdamWStepSkipsWhenFoundInfIsSetAndWritesModelCopies) {
  auto params = random_list(torch::kFloat, torch::kCPU, 5);
  auto grads = random_list(torch::kHalf, torch::kCPU, 6);
  F::AdamWTensors t{params, grads, {}, {}, {}};
  for (const auto& p : params) {
    t.exp_avg.push_back(torch::zeros_like(p));
    t.exp_avg_sq.push_back(torch::zeros_like(p));
    t.model_copies.push_back(torch::zeros_like(p, torch::kBFloat16));
  }
  const auto before = clones(params);
  F::adamw_step(t, F::AdamWStep().lr(0.1), torch::ones({}));
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_TRUE(torch::equal(params[i], before[i])) << "found_inf set: nothing written";
    EXPECT_EQ(t.model_copies[i].count_nonzero().item<int64_t>(), 0);
  }
  F::adamw_step(t, F::AdamWStep().lr(0.1).grad_scale(0.5), torch::zeros({}));
  for (size_t i = 1; i < params.size(); ++i) {
    EXPECT_FALSE(torch::equal(params[i], before[i])) << "param " << i << " moved";
    EXPECT_TRUE(torch::equal(t.model_copies[i], params[i].to(torch::kBFloat16)))
        << "the copy holds the rounded new weights";
  }
}

TEST(FusedAdamW, SaveAndLoadRoundTripTheState) {
  auto make = [] {
    torch::manual_seed(7);
    return std::vector<torch::Tensor>{torch::randn({4}, torch::requires_grad())};
  };
  auto a = make();
  FusedAdamW opt_a(a, torch::optim::AdamWOptions(0.01));
  a[0].mutable_grad() = torch::ones({4});
  opt_a.step();
  std::stringstream buffer;
  torch::serialize::OutputArchive out;
  opt_a.save(out);
  out.save_to(buffer);

  auto b = make();
  {
    torch::NoGradGuard no_grad;
    b[0].copy_(a[0]);
  }
  FusedAdamW opt_b(b, torch::optim::AdamWOptions(0.01));
  torch::serialize::InputArchive in;
  in.load_from(buffer);
  opt_b.load(in);
  a[0].mutable_grad() = torch::full({4}, -2.0);
  b[0].mutable_grad() = torch::full({4}, -2.0);
  opt_a.step();
  opt_b.step();
  EXPECT_TRUE(torch::equal(a[0], b[0])) << "step 2 after load equals step 2 without";
}

// --- Argument checks ----------------------------------------------------------------

using testing::error_of;

TEST(Fused, ErrorsNameTheBadArgumentAndTheFix) {
  auto p = std::vector<torch::Tensor>{torch::zeros({3}), torch::zeros({4})};
  auto g = std::vector<torch::Tensor>{torch::zeros({3}), torch::zeros({5})};
  F::AdamWTensors t{p, g, clones(p), clones(p), {}};
  EXPECT_NE(error_of([&] {
              F::adamw_step(t, F::AdamWStep());
            }).find("grads[1] has 5 elements but params[1] has 4"),
            std::string::npos);
  t.grads = clones(p);
  EXPECT_NE(error_of([&] {
              F::adamw_step(t, F::AdamWStep().step(0));
            }).find("step is 0; it counts updates and is 1 on the first"),
            std::string::npos);
  t.exp_avg.pop_back();
  EXPECT_NE(error_of([&] {
              F::adamw_step(t, F::AdamWStep());
            }).find("exp_avg has 1 tensors but params has 2"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              F::global_norm({torch::zeros({2}), torch::Tensor()});
            }).find("tensors[1] is an undefined tensor"),
            std::string::npos);
  if (!F::cuda_kernels_built()) {
    EXPECT_NE(error_of([] {
                F::backend_for(torch::Device("cuda:0"));
              }).find("built without CUDA kernels; configure against a CUDA LibTorch"),
              std::string::npos);
  }
  EXPECT_NE(error_of([] {
              FusedAdamW bad({torch::zeros({2}, torch::requires_grad())},
                             torch::optim::AdamWOptions().amsgrad(true));
            }).find("FusedAdamW does not implement amsgrad"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              auto strided = torch::zeros({4, 4}).t().requires_grad_(true);
              FusedAdamW bad({strided});
            }).find("FusedAdamW: parameter 0 is not contiguous"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              FusedAdamW ok({torch::zeros({2}, torch::requires_grad())});
              ok.set_model_copies({torch::zeros({2}), torch::zeros({2})});
            }).find("got 2 tensors for 1 parameters; pass one per parameter, in order"),
            std::string::npos);
  t = F::AdamWTensors{p, clones(p), clones(p), clones(p), {}};
  EXPECT_NE(error_of([&] {
              F::adamw_step(t, F::AdamWStep(), torch::zeros({2}));
            }).find("found_inf must be a one-element float tensor"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              F::global_norm({torch::zeros({2}, torch::kLong)});
            }).find("tensors[0] has dtype Long; use floating-point tensors"),
            std::string::npos);
}

TEST(Fused, ConfigPicksTheFusedOptimizerAndRefusesFusedAmsgrad) {
  const std::string base = R"({"train_batch_size": 2, "optimizer": {"type": "AdamW",
      "params": {"lr": 0.1)";
  auto model = torch::nn::Linear(2, 1);
  auto fused_engine = initialize(model, Config::from_string(base + R"(, "torch_adam": false}}})"));
  EXPECT_NE(dynamic_cast<FusedAdamW*>(&fused_engine.optimizer()), nullptr);
  auto model2 = torch::nn::Linear(2, 1);
  auto torch_engine = initialize(model2, Config::from_string(base + "}}}"));
  EXPECT_EQ(dynamic_cast<FusedAdamW*>(&torch_engine.optimizer()), nullptr)
      << "on CPU, unset torch_adam means LibTorch's AdamW";
  EXPECT_NE(error_of([&] {
              Config::from_string(base + R"(, "amsgrad": true, "torch_adam": false}}})");
            }).find("the fused Adam has no AMSGrad; set \"torch_adam\": true"),
            std::string::npos);
  // bias_correction false: FusedAdamW on CPU too (LibTorch's optimizers always correct).
  auto model3 = torch::nn::Linear(2, 1);
  auto uncorrected =
      initialize(model3, Config::from_string(base + R"(, "bias_correction": false}}})"));
  EXPECT_NE(dynamic_cast<FusedAdamW*>(&uncorrected.optimizer()), nullptr);
  EXPECT_NE(
      error_of([&] {
        Config::from_string(base + R"(, "bias_correction": false, "torch_adam": true}}})");
      })
          .find("optimizer.params.bias_correction is false but torch_adam is true: LibTorch's "
                "Adam and AdamW always correct the bias"),
      std::string::npos);
  EXPECT_NE(error_of([&] {
              Config::from_string(base + R"(, "bias_correction": false, "amsgrad": true}}})");
            }).find("optimizer.params.bias_correction is false with amsgrad"),
            std::string::npos);
}

// NOTE: [folded unscale], at the level of the ops: the old fp16 boundary (fp32 copies of
// the half gradients, unscale, norm, clip multiply, AdamW) against the new one (norm of
// the half gradients, then AdamW with grad_scale = 1/S x clip). Bitwise with S = 2^k and
// a full window; to float rounding with an early-ended window's factor (4/3).
struct FoldedRun {
  double norm;
  std::vector<torch::Tensor> params, exp_avg, exp_avg_sq;
};

FoldedRun fp16_boundary(bool folded, double factor, double loss_scale, double max_norm) {
  torch::manual_seed(7);
  std::vector<torch::Tensor> half_grads, params, m, v;
  for (int64_t n : {1000, 7, 65537}) {
    half_grads.push_back((torch::randn({n}) * loss_scale * 1e-2).to(torch::kHalf));
    params.push_back(torch::randn({n}));
    m.push_back(torch::zeros({n}));
    v.push_back(torch::zeros({n}));
  }
  const double coef = factor / loss_scale;
  auto step = F::AdamWStep().lr(1e-2).weight_decay(0.01);
  double norm = 0.0;
  if (folded) {
    norm = F::global_norm(half_grads).item<double>() * coef;
    const double clip = clip_coefficient(norm, max_norm);
    F::adamw_step({params, half_grads, m, v}, step.grad_scale(coef * clip));
  } else {
    std::vector<torch::Tensor> grads;
    for (const auto& g : half_grads) grads.push_back(g.to(torch::kFloat));
    F::unscale_and_check(grads, coef);
    norm = F::global_norm(grads).item<double>();
    const double clip = clip_coefficient(norm, max_norm);
    if (clip < 1.0) F::unscale_and_check(grads, clip);
    F::adamw_step({params, grads, m, v}, step);
  }
  return {norm, params, m, v};
}

TEST(Fused, FoldedUnscaleAndClipEqualTheSeparatePasses) {
  for (double max_norm : {0.0, 1e-3}) {  // no clipping, and a clip that applies
    const auto old_full = fp16_boundary(false, 1.0, 4096.0, max_norm);
    const auto new_full = fp16_boundary(true, 1.0, 4096.0, max_norm);
    EXPECT_EQ(new_full.norm, old_full.norm) << "max_norm " << max_norm;
    for (size_t i = 0; i < old_full.params.size(); ++i) {
      EXPECT_TRUE(torch::equal(new_full.params[i], old_full.params[i])) << i << " " << max_norm;
      EXPECT_TRUE(torch::equal(new_full.exp_avg[i], old_full.exp_avg[i])) << i;
      EXPECT_TRUE(torch::equal(new_full.exp_avg_sq[i], old_full.exp_avg_sq[i])) << i;
    }
    const auto old_early = fp16_boundary(false, 4.0 / 3.0, 4096.0, max_norm);
    const auto new_early = fp16_boundary(true, 4.0 / 3.0, 4096.0, max_norm);
    EXPECT_NEAR(new_early.norm, old_early.norm, 1e-6 * old_early.norm);
    for (size_t i = 0; i < old_early.params.size(); ++i) {
      EXPECT_TRUE(torch::allclose(new_early.params[i], old_early.params[i], 1e-6, 1e-7)) << i;
    }
  }
}

TEST(FusedAdamW, TheEngineFoldsTheUnscaleAndTheClipIntoTheUpdate) {
  // fp16, FusedAdamW (torch_adam false) against LibTorch's AdamW (separate passes): the
  // same norm at the first boundary, bit for bit, and the same weights to rounding.
  const std::string config = R"({"train_micro_batch_size_per_gpu": 2,
      "gradient_accumulation_steps": 2, "gradient_clipping": 0.01, "steps_per_print": 1000000,
      "fp16": {"enabled": true, "initial_scale_power": 10},
      "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "torch_adam": )";
  struct Scale : torch::nn::Module {
    torch::Tensor w = register_parameter("w", torch::linspace(0.2, 0.8, 4));
  };
  auto fused_model = std::make_shared<Scale>();
  auto torch_model = std::make_shared<Scale>();
  auto fused_engine = initialize(fused_model, Config::from_string(config + "false}}}"));
  auto torch_engine = initialize(torch_model, Config::from_string(config + "true}}}"));
  ASSERT_NE(dynamic_cast<FusedAdamW*>(&fused_engine.optimizer()), nullptr);
  for (int t = 0; t < 6; ++t) {
    for (auto [model, engine] : {std::pair{fused_model.get(), &fused_engine},
                                 std::pair{torch_model.get(), &torch_engine}}) {
      torch::manual_seed(t);
      const auto x = torch::randn({2, 4}).to(torch::kHalf);
      engine->backward((x * model->w).sum(1).pow(2).mean());
      engine->step();
    }
    if (t == 1) EXPECT_EQ(fused_engine.global_grad_norm(), torch_engine.global_grad_norm());
  }
  EXPECT_EQ(fused_engine.global_steps(), 3);
  EXPECT_TRUE(torch::allclose(fused_engine.master_params()[0], torch_engine.master_params()[0],
                              1e-5, 1e-6));
  EXPECT_FALSE(fused_model->w.grad().defined()) << "the step still sets the gradients to none";
}

// --- CUDA kernels against the ATen backend ------------------------------------------

class FusedCuda : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto why = why_no_cuda();
    if (!why.empty()) GTEST_SKIP() << "CUDA kernels not testable: " << why;
  }
};

std::vector<torch::Tensor> to_cuda(const std::vector<torch::Tensor>& list) {
  std::vector<torch::Tensor> out;
  for (const auto& t : list) out.push_back(t.to(torch::kCUDA));
  return out;
}

TEST_F(FusedCuda, KernelOnlyChecksNameTheTensorAndTheFix) {
  EXPECT_NE(error_of([] {
              F::global_norm({torch::zeros({2}, torch::kDouble).cuda()});
            }).find("tensors[0] has dtype Double; the CUDA kernels take float, half or bfloat16"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              F::global_norm({torch::zeros({4, 4}).cuda().t()});
            }).find("tensors[0] is not contiguous; pass t.contiguous()"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              F::global_norm({torch::zeros({2}).cuda(), torch::zeros({2})});
            }).find("tensors[1] is on cpu but the first tensor is on cuda:0"),
            std::string::npos);
}

TEST_F(FusedCuda, NormAndUnscaleMatchTheCpuBackend) {
  for (auto dtype : {torch::kFloat, torch::kBFloat16, torch::kHalf}) {
    auto cpu = random_list(dtype, torch::kCPU, 8);
    auto gpu = to_cuda(cpu);
    // Both accumulate in fp32 but in different orders: relative 1e-5.
    const double ref = F::global_norm(cpu).item<double>();
    EXPECT_NEAR(F::global_norm(gpu).item<double>(), ref, 1e-5 * ref) << dtype;
    EXPECT_EQ(F::unscale_and_check(gpu, 0.5).item<float>(), 0.0f);
    F::unscale_and_check(cpu, 0.5);
    for (size_t i = 0; i < cpu.size(); ++i) {
      EXPECT_TRUE(torch::equal(gpu[i].cpu(), cpu[i])) << "x0.5 is exact: " << dtype << " " << i;
    }
    for (double bad :
         {std::numeric_limits<double>::infinity(), std::numeric_limits<double>::quiet_NaN()}) {
      for (size_t tensor : {1UL, 5UL, 10UL}) {
        for (int where = 0; where < 3; ++where) {
          auto list = to_cuda(random_list(dtype, torch::kCPU, 9));
          const int64_t n = list[tensor].numel();
          const int64_t at = where == 0 ? 0 : where == 1 ? n / 2 : n - 1;
          list[tensor][at] = bad;
          EXPECT_EQ(F::unscale_and_check(list, 1.0).item<float>(), 1.0f)
              << dtype << " tensor " << tensor << " at " << at;
          EXPECT_FALSE(std::isfinite(F::global_norm(list).item<double>()));
        }
      }
    }
  }
}

TEST_F(FusedCuda, AdamWMatchesTheCpuBackendForEveryGradientTypeOverSeveralSteps) {
  for (auto dtype : {torch::kFloat, torch::kBFloat16, torch::kHalf}) {
    for (auto [decoupled, corrected] : {std::pair{true, true}, {false, true}, {true, false}}) {
      auto params = random_list(torch::kFloat, torch::kCPU, 10);
      F::AdamWTensors cpu{params, {}, {}, {}, {}};
      for (const auto& p : params) {
        cpu.exp_avg.push_back(torch::rand_like(p));
        cpu.exp_avg_sq.push_back(torch::rand_like(p));
        cpu.model_copies.push_back(torch::zeros_like(p, dtype));
      }
      F::AdamWTensors gpu{to_cuda(cpu.params),
                          {},
                          to_cuda(cpu.exp_avg),
                          to_cuda(cpu.exp_avg_sq),
                          to_cuda(cpu.model_copies)};
      for (int64_t step = 1; step <= 5; ++step) {
        cpu.grads = random_list(dtype, torch::kCPU, 10 + step);  // new gradients each step
        gpu.grads = to_cuda(cpu.grads);
        const auto hyper = F::AdamWStep()
                               .lr(1e-2)
                               .weight_decay(0.05)
                               .decoupled(decoupled)
                               .step(step)
                               .grad_scale(0.125)
                               .bias_correction(corrected);
        const auto p_old = clones(cpu.params);
        const auto m_old = clones(cpu.exp_avg);
        F::adamw_step(cpu, hyper);
        F::adamw_step(gpu, hyper, torch::zeros({}, torch::kCUDA));
        for (size_t i = 0; i < params.size(); ++i) {
          const auto at = c10::str(dtype, " decoupled ", decoupled, " bias_correction ", corrected,
                                   " step ", step, " tensor ", i);
          // Same fp32 formula in another order (the kernel contracts to FMAs), so each
          // weight agrees to a few ulps of the terms it is made of, not of the result:
          // m = beta1 m + (1 - beta1) g can cancel, and the update divides m by denom, which
          // is small where exp_avg_sq is. Terms: |p| and step_size (beta1 |m_old| +
          // (1 - beta1) |g|) / denom; within 1e-5 of them (about 80 ulps), plus 1e-6.
          auto g = cpu.grads[i].to(torch::kFloat) * 0.125;
          if (!decoupled) g = g + 0.05 * p_old[i];
          const double bc1 = corrected ? 1.0 - std::pow(0.9, step) : 1.0;
          const double bc2 = corrected ? 1.0 - std::pow(0.999, step) : 1.0;
          const auto denom = cpu.exp_avg_sq[i].sqrt() / std::sqrt(bc2) + 1e-8;
          const auto terms =
              p_old[i].abs() + (1e-2 / bc1) * (0.9 * m_old[i].abs() + 0.1 * g.abs()) / denom;
          const auto diff = (gpu.params[i].cpu() - cpu.params[i]).abs();
          EXPECT_TRUE((diff <= 1e-5 * terms + 1e-6).all().item<bool>())
              << at << ": largest |gpu - cpu| / bound "
              << (diff / (1e-5 * terms + 1e-6)).max().item<double>();
          EXPECT_TRUE(torch::allclose(gpu.exp_avg[i].cpu(), cpu.exp_avg[i], 1e-5, 1e-7)) << at;
          EXPECT_TRUE(torch::allclose(gpu.exp_avg_sq[i].cpu(), cpu.exp_avg_sq[i], 1e-5, 1e-7))
              << at;
          // The copy is the rounded fp32 result: at most one ulp of the copy's type apart.
          EXPECT_TRUE(torch::allclose(gpu.model_copies[i].cpu().to(torch::kFloat),
                                      cpu.model_copies[i].to(torch::kFloat), 1e-2, 1e-3))
              << at << " copy";
        }
      }
      const auto before = clones(gpu.params);
      const auto exp_avg_before = clones(gpu.exp_avg);
      const auto hyper = F::AdamWStep().lr(1e-2).decoupled(decoupled).step(6);
      F::adamw_step(gpu, hyper, torch::ones({}, torch::kCUDA));
      for (size_t i = 0; i < params.size(); ++i) {
        EXPECT_TRUE(torch::equal(gpu.params[i], before[i])) << "skipped on the device";
        EXPECT_TRUE(torch::equal(gpu.exp_avg[i], exp_avg_before[i])) << "moments untouched";
      }
    }
  }
}

}  // namespace
}  // namespace stepwise
