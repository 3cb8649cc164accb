// The CUDA kernels of src/cuda/kernels.h against plain C++ references.
// Tests that need a device skip without one; the argument checks at the end run anywhere.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

#include "kernels_test_support.h"

namespace {

using namespace kernels_test;
using stepwise::cuda::AdamHyper;
using stepwise::cuda::AdamLists;

// ---------------------------------------------------------------- unscale_and_check

void expect_unscaled(const TensorList& list, float inv_scale) {
  for (size_t t = 0; t < list.views.size(); ++t) {
    std::vector<float> want = list.host[t];
    for (float& x : want) x = round_to(list.views[t].dtype, x * inv_scale);
    // Exact: one IEEE fp32 multiply, then round-to-nearest-even, on both sides.
    EXPECT_TRUE(same_bits(list.device[t]->values(), want))
        << "tensor " << t << " (" << dtype_name(list.views[t].dtype) << ")";
  }
}

TEST(UnscaleAndCheck, MatchesReferenceForEveryDtypeSizeAndAlignment) {
  REQUIRE_DEVICE();
  std::mt19937 rng(1);
  cudaStream_t stream = nullptr;
  cuda_ok(cudaStreamCreate(&stream), "cudaStreamCreate");
  for (DType d : kDtypes) {
    for (int64_t offset : {0, 1}) {
      SCOPED_TRACE(std::string(dtype_name(d)) + " offset " + std::to_string(offset));
      TensorList list = random_list(rng, kSizes, d, offset);
      DeviceScalar found(0.0f);
      stepwise::cuda::unscale_and_check(list.views.data(), list.views.size(), 0.37f, found.get(),
                                        stream);
      cuda_ok(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
      EXPECT_EQ(found.value(), 0.0f);
      expect_unscaled(list, 0.37f);
    }
  }
  cudaStreamDestroy(stream);
}

TEST(UnscaleAndCheck, ManyTensorsOfMixedDtypesSpanSeveralLaunches) {
  REQUIRE_DEVICE();
  std::mt19937 rng(2);
  TensorList list = random_list(rng, many_sizes(rng), DType::kFloat32, 0, /*mix_dtypes=*/true);
  DeviceScalar found(0.0f);
  stepwise::cuda::unscale_and_check(list.views.data(), list.views.size(), 1.0f / 1024, found.get(),
                                    nullptr);
  device_sync();
  EXPECT_EQ(found.value(), 0.0f);
  expect_unscaled(list, 1.0f / 1024);
}

TEST(UnscaleAndCheck, TensorLongerThanALaunchContinuesInTheNext) {
  REQUIRE_DEVICE();
  std::mt19937 rng(3);
  TensorList list = random_list(rng, {100, kHuge, 5}, DType::kFloat16, 0);
  DeviceScalar found(0.0f);
  stepwise::cuda::unscale_and_check(list.views.data(), list.views.size(), 0.37f, found.get(),
                                    nullptr);
  device_sync();
  EXPECT_EQ(found.value(), 0.0f);
  expect_unscaled(list, 0.37f);
}

TEST(UnscaleAndCheck, FindsInfAndNanAnywhere) {
  REQUIRE_DEVICE();
  std::mt19937 rng(4);
  const std::vector<int64_t> sizes = {kChunkSize + 1, 1001, 3 * kChunkSize + 5};
  const float specials[] = {std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN()};
  for (DType d : kDtypes) {
    for (int64_t offset : {0, 1}) {
      TensorList list = random_list(rng, sizes, d, offset);
      for (float special : specials) {
        for (auto [t, e] : special_positions(sizes)) {
          SCOPED_TRACE(std::string(dtype_name(d)) + " offset " + std::to_string(offset) +
                       " value " + std::to_string(special) + " at tensor " + std::to_string(t) +
                       " element " + std::to_string(e));
          std::vector<float> values = list.host[t];
          values[e] = special;
          list.device[t]->upload(values);
          DeviceScalar found(0.0f);
          stepwise::cuda::unscale_and_check(list.views.data(), list.views.size(), 0.5f, found.get(),
                                            nullptr);
          device_sync();
          EXPECT_EQ(found.value(), 1.0f);
          EXPECT_FALSE(std::isfinite(list.device[t]->values()[e]));
          list.device[t]->upload(list.host[t]);
        }
      }
    }
  }
}

TEST(UnscaleAndCheck, NeverClearsFoundInfAndAcceptsEmptyLists) {
  REQUIRE_DEVICE();
  std::mt19937 rng(5);
  TensorList list = random_list(rng, {7, 1000}, DType::kFloat32, 0);
  DeviceScalar found(1.0f);
  stepwise::cuda::unscale_and_check(list.views.data(), list.views.size(), 2.0f, found.get(),
                                    nullptr);
  device_sync();
  EXPECT_EQ(found.value(), 1.0f);  // finite data, but a set flag stays set

  DeviceScalar clear(0.0f);
  stepwise::cuda::unscale_and_check(nullptr, 0, 2.0f, clear.get(), nullptr);
  TensorList empties = random_list(rng, {0, 0, 0}, DType::kFloat16, 0);
  stepwise::cuda::unscale_and_check(empties.views.data(), empties.views.size(), 2.0f, clear.get(),
                                    nullptr);
  device_sync();
  EXPECT_EQ(clear.value(), 0.0f);
}

// ---------------------------------------------------------------- global_norm

double reference_norm(const TensorList& list) {
  double sum = 0.0;
  for (const auto& values : list.host) {
    for (float x : values) sum += static_cast<double>(x) * x;
  }
  return std::sqrt(sum);
}

float device_norm(const TensorList& list, void* stream = nullptr) {
  const int64_t chunks =
      stepwise::cuda::global_norm_workspace(list.views.data(), list.views.size());
  DeviceTensor workspace(DType::kFloat32, std::vector<float>(static_cast<size_t>(chunks), -1.0f));
  DeviceScalar norm(123.0f);
  stepwise::cuda::global_norm(list.views.data(), list.views.size(),
                              static_cast<float*>(workspace.view().data), norm.get(), stream);
  device_sync();
  return norm.value();
}

// fp32 accumulation against a double reference: each thread adds <= 128 squares in
// order, then two 32-wide shuffle trees and the cleanup's short sums: a relative error
// bound of about 160 * 2^-24 ~ 1e-5 on the (non-negative) sum, half that on its sqrt.
constexpr double kNormRelTol = 1e-5;

TEST(GlobalNorm, MatchesDoubleReferenceForEveryDtypeSizeAndAlignment) {
  REQUIRE_DEVICE();
  std::mt19937 rng(11);
  for (DType d : kDtypes) {
    for (int64_t offset : {0, 1}) {
      SCOPED_TRACE(std::string(dtype_name(d)) + " offset " + std::to_string(offset));
      TensorList list = random_list(rng, kSizes, d, offset);
      const double want = reference_norm(list);
      EXPECT_NEAR(device_norm(list), want, kNormRelTol * want);
      for (size_t t = 0; t < kSizes.size(); ++t) {  // and each tensor on its own
        TensorList one;
        one.add(d, list.host[t], offset);
        const double want_one = reference_norm(one);
        EXPECT_NEAR(device_norm(one), want_one, kNormRelTol * want_one) << "size " << kSizes[t];
      }
    }
  }
}

TEST(GlobalNorm, ManyTensorsAndTensorsLongerThanALaunch) {
  REQUIRE_DEVICE();
  std::mt19937 rng(12);
  TensorList many = random_list(rng, many_sizes(rng), DType::kFloat32, 0, /*mix_dtypes=*/true);
  double want = reference_norm(many);
  EXPECT_NEAR(device_norm(many), want, kNormRelTol * want);
  TensorList huge = random_list(rng, {100, kHuge, 5}, DType::kBFloat16, 1);
  want = reference_norm(huge);
  EXPECT_NEAR(device_norm(huge), want, kNormRelTol * want);
}

TEST(GlobalNorm, IsBitwiseDeterministic) {
  REQUIRE_DEVICE();
  std::mt19937 rng(13);
  TensorList list = random_list(rng, kSizes, DType::kFloat16, 0);
  cudaStream_t stream = nullptr;
  cuda_ok(cudaStreamCreate(&stream), "cudaStreamCreate");
  const float first = device_norm(list);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(float_bits(device_norm(list, stream)), float_bits(first));
  cudaStreamDestroy(stream);
}

TEST(GlobalNorm, InfAndNanPropagate) {
  REQUIRE_DEVICE();
  std::mt19937 rng(14);
  const std::vector<int64_t> sizes = {kChunkSize + 1, 1001, 3 * kChunkSize + 5};
  for (DType d : kDtypes) {
    TensorList list = random_list(rng, sizes, d, 1);
    for (auto [t, e] : special_positions(sizes)) {
      SCOPED_TRACE(std::string(dtype_name(d)) + " tensor " + std::to_string(t) + " element " +
                   std::to_string(e));
      std::vector<float> values = list.host[t];
      values[e] = -std::numeric_limits<float>::infinity();
      list.device[t]->upload(values);
      EXPECT_EQ(device_norm(list), std::numeric_limits<float>::infinity());
      values[e] = std::numeric_limits<float>::quiet_NaN();
      list.device[t]->upload(values);
      EXPECT_TRUE(std::isnan(device_norm(list)));
      list.device[t]->upload(list.host[t]);
    }
  }
}

TEST(GlobalNorm, EmptyListsGiveZero) {
  REQUIRE_DEVICE();
  EXPECT_EQ(device_norm(TensorList{}), 0.0f);  // the norm starts at 123 in device_norm
  std::mt19937 rng(15);
  EXPECT_EQ(device_norm(random_list(rng, {0, 0}, DType::kFloat16, 0)), 0.0f);
}

// ---------------------------------------------------------------- host-side checks
// These throw before anything touches the device, so they run without one; the
// pointers are never dereferenced.

void* fake_pointer() { return reinterpret_cast<void*>(uintptr_t{0x1000}); }

template <typename F>
void expect_throw_containing(F&& f, const std::string& a, const std::string& b) {
  try {
    f();
    ADD_FAILURE() << "no exception, expected one naming " << a << " and " << b;
  } catch (const std::runtime_error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find(a), std::string::npos) << message;
    EXPECT_NE(message.find(b), std::string::npos) << message;
  }
}

TEST(ArgumentChecks, GlobalNormWorkspaceCountsChunks) {
  EXPECT_EQ(stepwise::cuda::global_norm_workspace(nullptr, 0), 1);
  std::vector<TensorView> views;
  int64_t chunks = 0;
  for (int64_t n : kSizes) {
    views.push_back(TensorView{n > 0 ? fake_pointer() : nullptr, n, DType::kFloat16});
    chunks += (n + kChunkSize - 1) / kChunkSize;
  }
  EXPECT_EQ(stepwise::cuda::global_norm_workspace(views.data(), views.size()), chunks);
}

TEST(ArgumentChecks, BadListsThrowBeforeLaunching) {
  TensorView bad{fake_pointer(), -5, DType::kFloat32};
  float* f = static_cast<float*>(fake_pointer());
  expect_throw_containing([&] { stepwise::cuda::unscale_and_check(&bad, 1, 1.0f, f, nullptr); },
                          "unscale_and_check", "-5");
  expect_throw_containing([&] { stepwise::cuda::unscale_and_check(nullptr, 2, 1.0f, f, nullptr); },
                          "unscale_and_check", "null");
  expect_throw_containing([&] { stepwise::cuda::global_norm(&bad, 1, f, f, nullptr); },
                          "global_norm", "-5");
  TensorView good{fake_pointer(), 10, DType::kFloat32};
  expect_throw_containing([&] { stepwise::cuda::global_norm(&good, 1, nullptr, f, nullptr); },
                          "global_norm", "workspace");
  TensorView null_data{nullptr, 10, DType::kFloat32};
  expect_throw_containing([&] { stepwise::cuda::global_norm_workspace(&null_data, 1); },
                          "global_norm_workspace", "null");
}

TEST(ArgumentChecks, AdamwRejectsMismatchedOrWronglyTypedLists) {
  TensorView p{fake_pointer(), 10, DType::kFloat32};
  TensorView g{fake_pointer(), 10, DType::kFloat16};
  TensorView short_m{fake_pointer(), 9, DType::kFloat32};
  TensorView half_v{fake_pointer(), 10, DType::kFloat16};
  AdamHyper hyper;
  expect_throw_containing(
      [&] {
        stepwise::cuda::adamw(AdamLists{&p, &g, &short_m, &p}, 1, hyper, nullptr, nullptr);
      },
      "adamw", "exp_avg[0] has numel 9");
  expect_throw_containing(
      [&] {
        stepwise::cuda::adamw(AdamLists{&p, &g, &p, &half_v}, 1, hyper, nullptr, nullptr);
      },
      "adamw", "exp_avg_sq[0] must be fp32");
  expect_throw_containing(
      [&] {
        stepwise::cuda::adamw(AdamLists{&g, &g, &p, &p}, 1, hyper, nullptr, nullptr);
      },
      "adamw", "params[0] must be fp32");
  expect_throw_containing(
      [&] {
        stepwise::cuda::adamw(AdamLists{&p, nullptr, &p, &p}, 1, hyper, nullptr, nullptr);
      },
      "adamw", "grads is null");
  expect_throw_containing(
      [&] {
        stepwise::cuda::adamw(AdamLists{&p, &g, &p, &p, &short_m}, 1, hyper, nullptr, nullptr);
      },
      "adamw", "model_copies[0]");
  hyper.step = 0;
  expect_throw_containing(
      [&] {
        stepwise::cuda::adamw(AdamLists{&p, &g, &p, &p}, 1, hyper, nullptr, nullptr);
      },
      "adamw", "step");
}

TEST(ArgumentChecks, EmptyListsEnqueueNothing) {
  // No tensors: nothing to launch, so these succeed even without a device.
  float* f = static_cast<float*>(fake_pointer());
  EXPECT_NO_THROW(stepwise::cuda::unscale_and_check(nullptr, 0, 1.0f, f, nullptr));
  EXPECT_NO_THROW(stepwise::cuda::adamw(AdamLists{}, 0, AdamHyper{}, nullptr, nullptr));
  TensorView empty{nullptr, 0, DType::kFloat32};
  EXPECT_NO_THROW(
      stepwise::cuda::adamw(AdamLists{&empty, &empty, &empty, &empty}, 1, AdamHyper{}, f, nullptr));
}

}  // namespace
