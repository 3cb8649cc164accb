// LossScaler's state sequence against DeepSpeed's rule (see NOTE: [loss scale rule]).
#include <stepwise/config.h>
#include <stepwise/errors.h>
#include <stepwise/loss_scaler.h>

#include <gtest/gtest.h>

#include "support/error_of.h"

#include <vector>

namespace stepwise {
namespace {

constexpr bool G = false;  // a good step
constexpr bool O = true;   // an overflow

struct Expected {
  std::vector<double> scales;
  std::vector<int64_t> hysteresis;
};

Expected run(LossScaler scaler, const std::vector<bool>& pattern) {
  Expected out;
  for (bool overflow : pattern) {
    scaler.update(overflow);
    out.scales.push_back(scaler.scale());
    out.hysteresis.push_back(scaler.hysteresis_left());
  }
  return out;
}

LossScalerOptions base() { return LossScalerOptions().init_scale(16).scale_window(3).min_scale(1); }

TEST(LossScaler, Hysteresis1HalvesOnEveryOverflowAndDoublesAfterAWindow) {
  auto got = run(LossScaler(base().hysteresis(1)), {G, O, O, G, G, G, G, G, G});
  EXPECT_EQ(got.scales, (std::vector<double>{16, 8, 4, 4, 4, 8, 8, 8, 16}));
}

TEST(LossScaler, Hysteresis2ToleratesOneOverflowAndRefillsOnlyWhenGrowing) {
  auto got = run(LossScaler(base().hysteresis(2)), {G, O, O, G, O, G, G, G, O});
  EXPECT_EQ(got.scales, (std::vector<double>{16, 16, 8, 8, 4, 4, 4, 8, 8}));
  EXPECT_EQ(got.hysteresis, (std::vector<int64_t>{2, 1, 1, 1, 1, 1, 1, 2, 1}));
}

TEST(LossScaler, ConsecutiveHysteresisRefillsOnEveryGoodStep) {
  auto got = run(LossScaler(base().hysteresis(2).consecutive_hysteresis(true)),
                 {G, O, O, G, O, G, G, G, O});
  EXPECT_EQ(got.scales, (std::vector<double>{16, 16, 8, 8, 8, 8, 8, 16, 16}));
  EXPECT_EQ(got.hysteresis, (std::vector<int64_t>{2, 1, 1, 2, 1, 2, 2, 2, 1}));
}

TEST(LossScaler, NeverBelowMinScale) {
  auto got = run(LossScaler(base().init_scale(4).min_scale(3).hysteresis(1)), {O, G});
  EXPECT_EQ(got.scales, (std::vector<double>{3, 3}));
}

TEST(LossScaler, OverflowAtMinScaleIsAnError) {
  LossScaler scaler(LossScalerOptions().init_scale(2).min_scale(1).hysteresis(1));
  scaler.update(O);
  EXPECT_EQ(scaler.scale(), 1);
  try {
    scaler.update(O);
    FAIL() << "expected an error";
  } catch (const TrainingError& e) {
    EXPECT_STREQ(e.what(),
                 "fp16 loss scale is already at its minimum (1) and the gradients "
                 "overflowed again at boundary 1: the model produces inf/nan gradients even "
                 "unscaled. Lower the learning rate, check the data for inf/nan, or train in "
                 "bf16 or fp32");
  }
}

TEST(LossScaler, StaticScaleNeverChanges) {
  auto got = run(LossScaler(base().dynamic(false)), {O, O, G, G, G, G});
  EXPECT_EQ(got.scales, (std::vector<double>(6, 16)));
}

TEST(LossScaler, TheFp16SectionMapsOntoItsOptions) {
  auto scaler_of = [](const std::string& fp16) {
    auto c = Config::from_string(R"({"train_batch_size": 1, "fp16": )" + fp16 + "}");
    EXPECT_EQ(c.precision.mode(), PrecisionMode::kFp16);
    return LossScaler(c.precision.loss_scaler());
  };
  EXPECT_EQ(scaler_of(R"({"enabled": true})").scale(), 65536);  // 2^16
  auto dynamic = scaler_of(R"({"enabled": true, "initial_scale_power": 8, "hysteresis": 3})");
  EXPECT_EQ(dynamic.scale(), 256);
  EXPECT_EQ(dynamic.hysteresis_left(), 3);
  EXPECT_TRUE(dynamic.options().dynamic());
  auto fixed = scaler_of(R"({"enabled": true, "initial_scale_power": 8, "loss_scale": 128})");
  EXPECT_EQ(fixed.scale(), 128);
  EXPECT_FALSE(fixed.options().dynamic());
}

TEST(LossScaler, InvalidOptionsAreConfigErrors) {
  auto error = [](const LossScalerOptions& o) {
    return testing::error_of<ConfigError>([&] { LossScaler s(o); });
  };
  // A C++-built scaler names its own options, not the fp16.* keys of a config.
  EXPECT_EQ(error(LossScalerOptions().scale_window(0)),
            "scale_window must be a positive integer, got 0");
  EXPECT_EQ(error(LossScalerOptions().hysteresis(0)),
            "hysteresis must be a positive integer, got 0");
  EXPECT_EQ(error(LossScalerOptions().init_scale(4).min_scale(8)),
            "min_scale (8) must not exceed the initial scale (4)");
  EXPECT_EQ(error(LossScalerOptions().init_scale(0)),
            "init_scale must be a finite number in (0, 3.40282e+38], got 0");
  EXPECT_EQ(error(LossScalerOptions().init_scale(1e39)),
            "init_scale must be a finite number in (0, 3.40282e+38], got 1e+39");
  EXPECT_EQ(error(LossScalerOptions().min_scale(-1)),
            "min_scale must be a finite number in [0, 3.40282e+38], got -1");
}

}  // namespace
}  // namespace stepwise
