// Config parsing: typed fields, defaults, and every ConfigError's text.
#include <stepwise/config.h>
#include <stepwise/errors.h>

#include <gtest/gtest.h>

#include "support/error_of.h"

#include <cstdio>
#include <fstream>

namespace stepwise {
namespace {

std::string error_of(const std::string& json) {
  return testing::error_of<ConfigError>([&] { Config::from_string(json); });
}

TEST(Config, AnOptionsErrorNamesItsOptionAndTheParserItsPath) {
  try {
    validate(ScheduleOptions(WarmupLROptions().warmup_max_lr(-1)));
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.option(), "warmup_max_lr");
    EXPECT_EQ(e.problem(), "must be a finite number in [0, 3.40282e+38], got -1");
  }
  EXPECT_EQ(error_of(R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_max_lr": -1}}})"),
            "scheduler.params.warmup_max_lr must be a finite number in [0, 3.40282e+38], got -1");
}

TEST(Config, ConfigKeysAreTheParsersOwnReads) {
  const auto& keys = config_keys();
  auto find = [&](const std::string& path) {
    for (const auto& k : keys) {
      if (k.path == path) return k;
    }
    return ConfigKey{path, "missing", "missing"};
  };
  EXPECT_EQ(keys.size(), 79u);
  EXPECT_EQ(find("csv_monitor.job_name").default_value, "\"DeepSpeedJobName\"");
  EXPECT_EQ(find("stepwise.check_params_changed").default_value, "true");
  EXPECT_EQ(find("optimizer.params.betas").type, "[number, number]");
  EXPECT_EQ(find("optimizer.params.betas").default_value, "[0.9,0.999]");
  EXPECT_EQ(find("optimizer.params.bias_correction").default_value, "true");
  EXPECT_EQ(find("scheduler.params.total_num_steps").default_value, "required");
  EXPECT_EQ(find("scheduler.params.warmup_type").default_value, "\"log\"");
  EXPECT_EQ(find("train_batch_size").default_value, "unset");
  EXPECT_EQ(find("fp16").type, "object");
  EXPECT_EQ(find("fp16").default_value, "none");
}

TEST(Config, ParsesADeepSpeedConfig) {
  auto c = Config::from_string(R"({
    "train_batch_size": 16, "gradient_accumulation_steps": 2, "gradient_clipping": 1.5,
    "steps_per_print": 5, "wall_clock_breakdown": true,
    "optimizer": {"type": "Adam", "params": {"lr": 0.01, "betas": [0.8, 0.9], "eps": 1e-6,
                  "weight_decay": 0.1, "adam_w_mode": false, "torch_adam": true}},
    "scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": 100,
                  "warmup_num_steps": 10, "warmup_max_lr": 0.01, "warmup_type": "linear"}},
    "fp16": {"enabled": false, "initial_scale_power": 8},
    "zero_optimization": {"stage": 0},
    "stepwise": {"strict_cadence": false, "scale_wrt_gas": false, "reduce_bucket_size": 1000}})");
  EXPECT_EQ(*c.train_batch_size, 16);
  EXPECT_FALSE(c.train_micro_batch_size_per_gpu.has_value());
  EXPECT_EQ(*c.gradient_accumulation_steps, 2);
  EXPECT_DOUBLE_EQ(c.gradient_clipping, 1.5);
  EXPECT_EQ(c.steps_per_print, 5);
  EXPECT_TRUE(c.wall_clock_breakdown);
  ASSERT_TRUE(c.optimizer.has_value());
  EXPECT_EQ(c.optimizer->type(), "Adam");
  EXPECT_DOUBLE_EQ(c.optimizer->lr(), 0.01);
  EXPECT_DOUBLE_EQ(c.optimizer->betas()[0], 0.8);
  EXPECT_DOUBLE_EQ(c.optimizer->eps(), 1e-6);
  EXPECT_FALSE(c.optimizer->adam_w_mode());
  ASSERT_TRUE(c.scheduler.has_value());
  const auto& decay = std::get<WarmupDecayLROptions>(*c.scheduler);
  EXPECT_EQ(decay.total_num_steps(), 100);
  EXPECT_EQ(decay.warmup().warmup_type(), WarmupType::kLinear);
  EXPECT_DOUBLE_EQ(decay.warmup().warmup_min_lr(), 0.0);
  EXPECT_EQ(c.precision.mode(), PrecisionMode::kFp32);
  EXPECT_EQ(c.precision.loss_scaler().init_scale(), 256);  // 2^initial_scale_power
  EXPECT_EQ(c.precision.loss_scaler().scale_window(), 1000);
  EXPECT_FALSE(c.accumulation.strict_cadence());
  EXPECT_FALSE(c.accumulation.scale_wrt_gas());
  EXPECT_EQ(c.reducer.bucket_size(), 1000);
}

TEST(Config, AdamAndAdamWInAnyCaseAsDeepSpeedReadsThem) {
  auto type_of = [](const std::string& name) {
    return Config::from_string(R"({"train_batch_size": 8, "optimizer": {"type": ")" + name +
                               R"("}})")
        .optimizer->type();
  };
  EXPECT_EQ(type_of("adam"), "Adam");
  EXPECT_EQ(type_of("ADAMW"), "AdamW");
  EXPECT_EQ(type_of("AdamW"), "AdamW");
}

TEST(Config, AnySgdDampeningTorchTakesIsAccepted) {  // torch.optim.SGD has no range for it
  auto c = Config::from_string(R"({"train_batch_size": 8, "optimizer": {"type": "SGD",
      "params": {"lr": 0.1, "momentum": 0.9, "dampening": 2}}})");
  EXPECT_EQ(c.optimizer->dampening(), 2.0);
}

TEST(Config, DefaultsAreDeepSpeeds) {
  auto c = Config::from_string(R"({"train_batch_size": 4})");
  EXPECT_DOUBLE_EQ(c.gradient_clipping, 0.0);
  EXPECT_EQ(c.steps_per_print, 10);
  EXPECT_FALSE(c.optimizer.has_value());
  EXPECT_FALSE(c.scheduler.has_value());
  EXPECT_EQ(c.precision.mode(), PrecisionMode::kFp32);
  EXPECT_EQ(c.precision.loss_scaler().init_scale(), 65536);  // 2^16
  EXPECT_TRUE(c.precision.loss_scaler().dynamic());
  EXPECT_EQ(c.precision.loss_scaler().hysteresis(), 2);
  EXPECT_TRUE(c.accumulation.strict_cadence());
  EXPECT_TRUE(c.accumulation.scale_wrt_gas());
  EXPECT_TRUE(c.guard_rails.check_grads_cleared());
  EXPECT_EQ(c.reducer.bucket_size(), 500000000);
  EXPECT_TRUE(c.reducer.overlap_comm());
  EXPECT_EQ(c.checkpoint.tag_validation(), TagValidation::kWarn);
}

TEST(Config, IntegralFloatsAreAcceptedAsIntegers) {
  EXPECT_EQ(*Config::from_string(R"({"train_batch_size": 8.0})").train_batch_size, 8);
}

TEST(Config, FromFileReadsAndNamesTheFileInErrors) {
  const std::string path = ::testing::TempDir() + "stepwise_config_test.json";
  std::ofstream(path) << R"({"train_batch_size": 8, "gradient_clipping": "big"})";
  try {
    Config::from_file(path);
    FAIL() << "expected a ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()),
              path + ": gradient_clipping must be a number, got string \"big\"");
  }
  std::ofstream(path) << R"({"train_batch_size": 8})";
  EXPECT_EQ(*Config::from_file(path).train_batch_size, 8);
  std::remove(path.c_str());
}

struct ErrorCase {
  const char* name;
  const char* json;
  const char* message;
};

void PrintTo(const ErrorCase& c, std::ostream* os) { *os << c.name; }

class ConfigErrors : public ::testing::TestWithParam<ErrorCase> {};

TEST_P(ConfigErrors, MessageNamesPathValueAndFix) {
  EXPECT_EQ(error_of(GetParam().json), GetParam().message);
}

INSTANTIATE_TEST_SUITE_P(
    Messages, ConfigErrors,
    ::testing::Values(
        ErrorCase{"NotJson", R"({"train_batch_size": )",
                  "the configuration is not valid JSON: [json.exception.parse_error.101] parse "
                  "error at line 1, column 22: syntax error while parsing value - unexpected "
                  "end of input; expected '[', '{', or a literal"},
        ErrorCase{"NotAnObject", "[1, 2]",
                  "the configuration must be a JSON object, got array [1,2]"},
        ErrorCase{"UnknownTopLevelKey", R"({"train_batch_size": 8, "train_batchsize": 8})",
                  "unknown key train_batchsize (value 8); valid keys here are: "
                  "train_batch_size, train_micro_batch_size_per_gpu, "
                  "gradient_accumulation_steps, gradient_clipping, steps_per_print, "
                  "wall_clock_breakdown, prescale_gradients, gradient_predivide_factor, "
                  "optimizer, scheduler, fp16, bf16, zero_optimization, "
                  "zero_force_ds_cpu_optimizer, stepwise, checkpoint, csv_monitor"},
        ErrorCase{"UnsupportedDeepSpeedFeature",
                  R"({"train_batch_size": 8, "pipeline": {"stages": 2}})",
                  "\"pipeline\" (value {\"stages\":2}) is a DeepSpeed feature stepwise does "
                  "not support: pipeline parallelism is not implemented"},
        ErrorCase{"WrongTypeInteger", R"({"train_batch_size": "8"})",
                  "train_batch_size must be an integer, got string \"8\""},
        ErrorCase{"WrongTypeFraction", R"({"train_batch_size": 8.5})",
                  "train_batch_size must be an integer, got number 8.5"},
        ErrorCase{"WrongTypeBool", R"({"train_batch_size": 8, "wall_clock_breakdown": 1})",
                  "wall_clock_breakdown must be true or false, got number 1"},
        ErrorCase{"NegativeClipping", R"({"train_batch_size": 8, "gradient_clipping": -1})",
                  "gradient_clipping must be a finite number in [0, 3.40282e+38], got -1"},
        ErrorCase{"ZeroStepsPerPrint", R"({"train_batch_size": 8, "steps_per_print": 0})",
                  "steps_per_print must be a positive integer, got 0"},
        ErrorCase{"ZeroStage", R"({"train_batch_size": 8, "zero_optimization": {"stage": 3}})",
                  "zero_optimization.stage 3 partitions the parameters themselves, which "
                  "stepwise does not implement; use stage 2 (the optimizer state, the fp32 "
                  "masters and the gradients sharded) or 1"},
        ErrorCase{"ZeroUnknownKey",
                  R"({"train_batch_size": 8, "zero_optimization": {"stage": 0,
                      "offload_optimiser": {"device": "cpu"}}})",
                  "unknown key zero_optimization.offload_optimiser (value "
                  "{\"device\":\"cpu\"}); valid keys here are: stage, reduce_bucket_size, "
                  "overlap_comm, allgather_bucket_size"},
        ErrorCase{"OptimizerTypeMissing", R"({"train_batch_size": 8, "optimizer": {}})",
                  "optimizer.type is missing; use one of: Adam, AdamW, Lamb, SGD"},
        ErrorCase{"OptimizerTypeUnknown",
                  R"({"train_batch_size": 8, "optimizer": {"type": "OneBitAdam"}})",
                  "optimizer.type \"OneBitAdam\" is not supported; use one of: Adam, AdamW, Lamb, "
                  "SGD (Adam, AdamW and Lamb in any case, as DeepSpeed reads them; SGD as "
                  "written)"},
        ErrorCase{"OptimizerSgdInLowerCase",
                  R"({"train_batch_size": 8, "optimizer": {"type": "sgd"}})",
                  "optimizer.type \"sgd\" is not supported; use one of: Adam, AdamW, Lamb, SGD "
                  "(Adam, AdamW and Lamb in any case, as DeepSpeed reads them; SGD as written)"},
        ErrorCase{"OptimizerParamUnknown",
                  R"({"train_batch_size": 8, "optimizer": {"type": "SGD",
                      "params": {"lr": 0.1, "betas": [0.9, 0.99]}}})",
                  "unknown key optimizer.params.betas (value [0.9,0.99]); valid keys here are: "
                  "lr, weight_decay, momentum, dampening, nesterov"},
        ErrorCase{"OptimizerNegativeLr",
                  R"({"train_batch_size": 8, "optimizer": {"type": "AdamW",
                      "params": {"lr": -0.1}}})",
                  "optimizer.params.lr must be a finite number in [0, 3.40282e+38], got -0.1"},
        ErrorCase{"OptimizerBadBetas",
                  R"({"train_batch_size": 8, "optimizer": {"type": "AdamW",
                      "params": {"betas": [0.9, 1.0]}}})",
                  "optimizer.params.betas must be two numbers in [0, 1), got [0.9, 1]"},
        ErrorCase{"OptimizerBetasShape",
                  R"({"train_batch_size": 8, "optimizer": {"type": "AdamW",
                      "params": {"betas": 0.9}}})",
                  "optimizer.params.betas must be a list of two numbers, got 0.9"},
        ErrorCase{
            "OptimizerZeroEps",
            R"({"train_batch_size": 8, "optimizer": {"type": "Adam",
                      "params": {"eps": 0}}})",
            "optimizer.params.eps must be a finite number in [1.17549e-38, 3.40282e+38], got 0"},
        ErrorCase{"SgdNesterovWithoutMomentum",
                  R"({"train_batch_size": 8, "optimizer": {"type": "SGD",
                      "params": {"nesterov": true}}})",
                  "optimizer.params.nesterov needs momentum > 0 and dampening 0, got momentum "
                  "0 and dampening 0"},
        ErrorCase{"SchedulerTypeUnknown",
                  R"({"train_batch_size": 8, "scheduler": {"type": "StepLR"}})",
                  "scheduler.type \"StepLR\" is not supported; use one of: WarmupLR, "
                  "WarmupDecayLR, WarmupCosineLR, OneCycle, LRRangeTest"},
        ErrorCase{"SchedulerTypeMissing", R"({"train_batch_size": 8, "scheduler": {}})",
                  "scheduler.type is missing; use one of: WarmupLR, WarmupDecayLR, "
                  "WarmupCosineLR, OneCycle, LRRangeTest"},
        ErrorCase{"SchedulerParamUnknown",
                  R"({"train_batch_size": 8, "scheduler": {"type": "WarmupLR",
                      "params": {"total_num_steps": 10}}})",
                  "unknown key scheduler.params.total_num_steps (value 10); valid keys here "
                  "are: warmup_min_lr, warmup_max_lr, warmup_num_steps, warmup_type"},
        ErrorCase{"WarmupTypeUnknown",
                  R"({"train_batch_size": 8, "scheduler": {"type": "WarmupLR",
                      "params": {"warmup_type": "cosine"}}})",
                  "scheduler.params.warmup_type \"cosine\" is not a warmup type; use \"log\" "
                  "or \"linear\""},
        ErrorCase{"WarmupNegativeSteps",
                  R"({"train_batch_size": 8, "scheduler": {"type": "WarmupLR",
                      "params": {"warmup_num_steps": -1}}})",
                  "scheduler.params.warmup_num_steps must be >= 0 (DeepSpeed runs 0 and 1 as 2), "
                  "got -1"},
        ErrorCase{"DecayTotalMissing",
                  R"({"train_batch_size": 8, "scheduler": {"type": "WarmupDecayLR"}})",
                  "scheduler.params.total_num_steps is required for WarmupDecayLR"},
        ErrorCase{"CosineTotalNotAboveWarmup",
                  R"({"train_batch_size": 8, "scheduler": {"type": "WarmupCosineLR",
                      "params": {"total_num_steps": 5, "warmup_num_steps": 10}}})",
                  "scheduler.params.total_num_steps (5) must be greater than the warmup's "
                  "length, max(2, warmup_num_steps) (10)"},
        ErrorCase{"CosineTotalEqualsWarmup",
                  R"({"train_batch_size": 8, "scheduler": {"type": "WarmupCosineLR",
                      "params": {"total_num_steps": 10, "warmup_num_steps": 10}}})",
                  "scheduler.params.total_num_steps (10) must be greater than the warmup's "
                  "length, max(2, warmup_num_steps) (10)"},
        ErrorCase{"CosineTotalMissing",
                  R"({"train_batch_size": 8, "scheduler": {"type": "WarmupCosineLR"}})",
                  "scheduler.params.total_num_steps is required for WarmupCosineLR"},
        ErrorCase{"OneCycleLrsMissing",
                  R"({"train_batch_size": 8, "scheduler": {"type": "OneCycle",
                      "params": {"cycle_max_lr": 0.1}}})",
                  "scheduler.params.cycle_min_lr and scheduler.params.cycle_max_lr are "
                  "required for OneCycle"},
        ErrorCase{"OneCycleStepSize",
                  R"({"train_batch_size": 8, "scheduler": {"type": "OneCycle",
                      "params": {"cycle_min_lr": 0.1, "cycle_max_lr": 0.2,
                                 "cycle_first_step_size": 0}}})",
                  "scheduler.params.cycle_first_step_size must be a positive integer, got 0"},
        ErrorCase{"RangeTestStepSize",
                  R"({"train_batch_size": 8, "scheduler": {"type": "LRRangeTest",
                      "params": {"lr_range_test_step_size": -1}}})",
                  "scheduler.params.lr_range_test_step_size must be a positive integer, got -1"},
        ErrorCase{"Fp16AndBf16",
                  R"({"train_batch_size": 8, "fp16": {"enabled": true},
                      "bf16": {"enabled": true}})",
                  "fp16.enabled and bf16.enabled are both true; enable at most one"},
        ErrorCase{"Fp16Window", R"({"train_batch_size": 8, "fp16": {"loss_scale_window": 0}})",
                  "fp16.loss_scale_window must be a positive integer, got 0"},
        ErrorCase{"Fp16MinAboveInitial",
                  R"({"train_batch_size": 8, "fp16": {"initial_scale_power": 2,
                      "min_loss_scale": 8}})",
                  "fp16.min_loss_scale (8) must not exceed the initial scale (4)"},
        ErrorCase{"Fp16UnknownKey",
                  R"({"train_batch_size": 8, "fp16": {"enabled": true, "autocast": true}})",
                  "unknown key fp16.autocast (value true); valid keys here are: enabled, "
                  "loss_scale, initial_scale_power, loss_scale_window, hysteresis, "
                  "consecutive_hysteresis, min_loss_scale"},
        ErrorCase{"StepwiseUnknownKey", R"({"train_batch_size": 8, "stepwise": {"strict": false}})",
                  "unknown key stepwise.strict (value false); valid keys here are: "
                  "strict_cadence, scale_wrt_gas, check_grads_cleared, check_grads_changed, "
                  "check_params_changed, reduce_bucket_size, overlap_comm"},
        ErrorCase{"ReduceBucketSizeZero",
                  R"({"train_batch_size": 8, "stepwise": {"reduce_bucket_size": 0}})",
                  "stepwise.reduce_bucket_size must be a positive integer, got 0"},
        // Values that fit JSON but not the float they are used in, or a range
        // (a config fuzz found each of these failing mid-training in LibTorch).
        ErrorCase{"WarmupMaxLrOverflowsFloat",
                  R"({"train_batch_size": 8, "scheduler": {"type": "WarmupLR",
                      "params": {"warmup_max_lr": 1e+308}}})",
                  "scheduler.params.warmup_max_lr must be a finite number in [0, 3.40282e+38], "
                  "got 1e+308"},
        ErrorCase{"WarmupMaxLrNegative",
                  R"({"train_batch_size": 8, "scheduler": {"type": "WarmupDecayLR",
                      "params": {"total_num_steps": 2000, "warmup_max_lr": -1e308}}})",
                  "scheduler.params.warmup_max_lr must be a finite number in [0, 3.40282e+38], "
                  "got -1e+308"},
        ErrorCase{"CycleMaxLrNegative",
                  R"({"train_batch_size": 8, "scheduler": {"type": "OneCycle",
                      "params": {"cycle_min_lr": 0, "cycle_max_lr": -1e308}}})",
                  "scheduler.params.cycle_max_lr must be a finite number in [0, 3.40282e+38], "
                  "got -1e+308"},
        ErrorCase{"WarmupMinRatioAboveOne",
                  R"({"train_batch_size": 8, "scheduler": {"type": "WarmupCosineLR",
                      "params": {"total_num_steps": 2000, "warmup_min_ratio": 1e308}}})",
                  "scheduler.params.warmup_min_ratio must be a finite number in [0, 1], got "
                  "1e+308"},
        ErrorCase{"CycleMomentumOne",
                  R"({"train_batch_size": 8, "scheduler": {"type": "OneCycle",
                      "params": {"cycle_min_lr": 0, "cycle_max_lr": 1, "cycle_max_mom": 1}}})",
                  "scheduler.params.cycle_max_mom must be a momentum (beta1) in [0, 1), got 1"},
        ErrorCase{"OptimizerLrOverflowsFloat",
                  R"({"train_batch_size": 8, "optimizer": {"type": "SGD",
                      "params": {"lr": 1e39}}})",
                  "optimizer.params.lr must be a finite number in [0, 3.40282e+38], got 1e+39"},
        ErrorCase{"OptimizerDampeningOverflowsFloat",
                  R"({"train_batch_size": 8, "optimizer": {"type": "SGD",
                      "params": {"dampening": 1e39}}})",
                  "optimizer.params.dampening must be a finite number in [-3.40282e+38, "
                  "3.40282e+38], got 1e+39"},
        ErrorCase{"Fp16StaticScaleOverflowsFloat",
                  R"({"train_batch_size": 8, "fp16": {"loss_scale": 1e39}})",
                  "fp16.loss_scale must be a finite number in [0, 3.40282e+38], got 1e+39"},
        ErrorCase{"Fp16NegativeMinScale",
                  R"({"train_batch_size": 8, "fp16": {"min_loss_scale": -1}})",
                  "fp16.min_loss_scale must be a finite number in [0, 3.40282e+38], got -1"},
        ErrorCase{"ClippingOverflowsFloat",
                  R"({"train_batch_size": 8, "gradient_clipping": 1e300})",
                  "gradient_clipping must be a finite number in [0, 3.40282e+38], got 1e+300"},
        ErrorCase{"SectionNotObject", R"({"train_batch_size": 8, "optimizer": "AdamW"})",
                  "optimizer must be a JSON object, got string \"AdamW\""}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(ConfigErrors, MissingFileSaysWhatToCheck) {
  try {
    Config::from_file("/nonexistent/ds_config.json");
    FAIL() << "expected a ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()),
              "cannot open the configuration file \"/nonexistent/ds_config.json\"; check the "
              "path (relative paths start at the working directory)");
  }
}

}  // namespace
}  // namespace stepwise
