// stepwise::cuda::adamw against a float reference of torch 1.13's Adam/AdamW formulas.
#include <gtest/gtest.h>

#include <cmath>
#include <optional>
#include <random>

#include "kernels_test_support.h"

namespace {

using namespace kernels_test;
using stepwise::cuda::AdamHyper;
using stepwise::cuda::AdamLists;

// The same float operations in the same order as the kernel, with the scalars derived
// in double exactly as the library documents (bias corrections on the host).
void reference_adam(const AdamHyper& h, float& p, float grad, float& m, float& v) {
  const double bc1 = 1.0 - std::pow(static_cast<double>(h.beta1), static_cast<double>(h.step));
  const double bc2 = 1.0 - std::pow(static_cast<double>(h.beta2), static_cast<double>(h.step));
  float g = grad * h.grad_scale;
  if (h.decoupled) {
    p = p * static_cast<float>(1.0 - static_cast<double>(h.lr) * h.weight_decay);
  } else if (h.weight_decay != 0.0f) {
    g = g + h.weight_decay * p;
  }
  m = h.beta1 * m + static_cast<float>(1.0 - h.beta1) * g;
  v = h.beta2 * v + static_cast<float>(1.0 - h.beta2) * g * g;
  const float denom = std::sqrt(v) / static_cast<float>(std::sqrt(bc2)) + h.eps;
  p = p - static_cast<float>(h.lr / bc1) * (m / denom);
}

// The kernel may contract a*b+c into one fma (nvcc's default) where the host rounds
// twice: a few ulps on values of magnitude <= ~2, and the updates stay <= ~0.3 because
// v starts >= 1e-4. abs 1e-6 + rel 1e-5 is ~40 ulps at 2 yet catches any wrong term
// (lr * 1e-2 = 1e-4 is the smallest one a wrong formula would change).
constexpr double kAbsTol = 1e-6;
constexpr double kRelTol = 1e-5;

struct AdamCase {
  std::vector<int64_t> sizes;
  DType grad_type = DType::kFloat32;
  std::optional<DType> copy_type;  // none: no model copies
  bool mix_types = false;          // vary grad/copy types (and offsets) per tensor
  int64_t offset = 0;
  AdamHyper hyper;
  std::optional<float> found_inf;  // none: pass a null found_inf
};

void run_case(const AdamCase& c, uint32_t seed) {
  std::mt19937 rng(seed);
  const bool skip = c.found_inf.has_value() && *c.found_inf != 0.0f;
  TensorList params = random_list(rng, c.sizes, DType::kFloat32, c.offset);
  TensorList grads = random_list(rng, c.sizes, c.grad_type, c.offset, c.mix_types);
  TensorList exp_avg = random_list(rng, c.sizes, DType::kFloat32, c.offset, false, -0.1f, 0.1f);
  TensorList exp_avg_sq = random_list(rng, c.sizes, DType::kFloat32, c.offset, false, 1e-4f, 1e-2f);
  TensorList copies;
  if (c.copy_type) copies = random_list(rng, c.sizes, *c.copy_type, c.offset, c.mix_types);
  const AdamLists lists{params.views.data(), grads.views.data(), exp_avg.views.data(),
                        exp_avg_sq.views.data(), c.copy_type ? copies.views.data() : nullptr};
  std::optional<DeviceScalar> found;
  if (c.found_inf) found.emplace(*c.found_inf);
  stepwise::cuda::adamw(lists, c.sizes.size(), c.hyper, found ? found->get() : nullptr, nullptr);
  device_sync();

  for (size_t t = 0; t < c.sizes.size(); ++t) {
    SCOPED_TRACE("tensor " + std::to_string(t) + " of numel " + std::to_string(c.sizes[t]) +
                 ", grads " + dtype_name(grads.views[t].dtype));
    std::vector<float> p = params.host[t], m = exp_avg.host[t], v = exp_avg_sq.host[t];
    if (!skip) {
      for (size_t i = 0; i < p.size(); ++i)
        reference_adam(c.hyper, p[i], grads.host[t][i], m[i], v[i]);
    }
    const std::vector<float> got_p = params.device[t]->values();
    if (skip) {  // a skipped step writes nothing: every list is unchanged, bit for bit
      EXPECT_TRUE(same_bits(got_p, p));
      EXPECT_TRUE(same_bits(exp_avg.device[t]->values(), m));
      EXPECT_TRUE(same_bits(exp_avg_sq.device[t]->values(), v));
      if (c.copy_type) {
        EXPECT_TRUE(same_bits(copies.device[t]->values(), copies.host[t]));
      }
    } else {
      EXPECT_TRUE(all_near(got_p, p, kAbsTol, kRelTol)) << "params";
      EXPECT_TRUE(all_near(exp_avg.device[t]->values(), m, kAbsTol, kRelTol)) << "exp_avg";
      EXPECT_TRUE(all_near(exp_avg_sq.device[t]->values(), v, kAbsTol, kRelTol)) << "exp_avg_sq";
      if (c.copy_type) {
        // Exact: the copy is the kernel's own new weight, rounded to nearest even.
        const DType copy_type = copies.views[t].dtype;
        std::vector<float> want = got_p;
        for (float& x : want) x = round_to(copy_type, x);
        EXPECT_TRUE(same_bits(copies.device[t]->values(), want))
            << "copy " << dtype_name(copy_type);
      }
    }
    EXPECT_TRUE(same_bits(grads.device[t]->values(), grads.host[t])) << "grads are read only";
  }
}

TEST(Adamw, MatchesReferenceForEveryDtypeSizeAlignmentAndMode) {
  REQUIRE_DEVICE();
  const std::optional<DType> copy_types[] = {std::nullopt, DType::kFloat32, DType::kFloat16,
                                             DType::kBFloat16};
  uint32_t seed = 100;
  for (DType grad_type : kDtypes) {
    for (const auto& copy_type : copy_types) {
      for (int64_t offset : {0, 1}) {
        for (bool decoupled : {true, false}) {
          AdamCase c;
          c.sizes = kSizes;
          c.grad_type = grad_type;
          c.copy_type = copy_type;
          c.offset = offset;
          c.hyper.lr = 1e-2f;
          c.hyper.weight_decay = 0.1f;
          c.hyper.decoupled = decoupled;
          c.hyper.step = 1 + seed % 7;
          c.hyper.grad_scale = 0.25f;
          SCOPED_TRACE(std::string("grads ") + dtype_name(grad_type) + ", copies " +
                       (copy_type ? dtype_name(*copy_type) : "none") + ", offset " +
                       std::to_string(offset) + (decoupled ? ", AdamW" : ", Adam") + ", step " +
                       std::to_string(c.hyper.step));
          run_case(c, seed++);
        }
      }
    }
  }
}

TEST(Adamw, ManyTensorsOfMixedDtypesSpanSeveralLaunches) {
  REQUIRE_DEVICE();
  std::mt19937 rng(200);
  AdamCase c;
  c.sizes = many_sizes(rng);
  c.copy_type = DType::kFloat16;
  c.mix_types = true;
  c.hyper.weight_decay = 0.01f;
  c.hyper.step = 1000;
  run_case(c, 201);
  c.copy_type.reset();
  c.found_inf = 0.0f;  // present but clear: the step happens
  run_case(c, 202);
}

TEST(Adamw, TensorLongerThanALaunchContinuesInTheNext) {
  REQUIRE_DEVICE();
  AdamCase c;
  c.sizes = {100, kHuge, 5};
  c.grad_type = DType::kBFloat16;
  c.copy_type = DType::kFloat16;
  c.hyper.weight_decay = 0.05f;
  run_case(c, 300);
}

TEST(Adamw, SetFoundInfSkipsTheStepOnTheDevice) {
  REQUIRE_DEVICE();
  const std::optional<DType> copy_types[] = {std::nullopt, DType::kFloat16, DType::kBFloat16};
  for (const auto& copy_type : copy_types) {
    for (int64_t offset : {0, 1}) {
      AdamCase c;
      c.sizes = kSizes;
      c.grad_type = DType::kFloat16;
      c.copy_type = copy_type;
      c.offset = offset;
      c.found_inf = 1.0f;
      run_case(c, 400);
    }
  }
}

TEST(Adamw, EmptyListsAndEmptyTensorsAreNoOps) {
  REQUIRE_DEVICE();
  AdamCase c;
  c.sizes = {0, 0, 0};
  c.copy_type = DType::kBFloat16;
  run_case(c, 500);
  c.sizes = {};
  run_case(c, 501);
}

}  // namespace
