// LR schedules against DeepSpeed v0.14.5 (tests/data/deepspeed/lr_schedules.jsonl),
// and stepwise's step mapping (see NOTE: [step mapping]).
#include <stepwise/config.h>
#include <stepwise/errors.h>
#include <stepwise/lr_schedules.h>
#include <stepwise/optimizers.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <map>

#include "lr_schedules_detail.h"
#include "support/error_of.h"
#include "support/reference_problem.h"

namespace stepwise {
namespace {

std::vector<torch::Tensor> one_param() { return {torch::zeros({2}, torch::requires_grad())}; }

std::unique_ptr<torch::optim::Optimizer> optimizer_for(const std::string& type, double lr) {
  return make_optimizer(OptimizerOptions(type).lr(lr).momentum(0.9), one_param());
}

std::vector<nlohmann::json> reference_rows() {
  std::ifstream in(testing::data_path("deepspeed/lr_schedules.jsonl"));
  std::vector<nlohmann::json> rows;
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line[0] == '{') rows.push_back(nlohmann::json::parse(line));
  }
  return rows;
}

TEST(LRSchedules, EveryReferenceRowTo1e12) {
  const auto rows = reference_rows();
  ASSERT_GE(rows.size(), 100u);
  std::map<std::string, int> checked;
  for (const auto& row : rows) {
    const std::string type = row["type"];
    // The recording drove the schedules with SGD(momentum 0.9): no betas, so
    // OneCycle's momentum cycling was off there and momentum stayed 0.9.
    auto optimizer = optimizer_for("SGD", row["opt_lr"]);
    auto config = Config::from_json(
        {{"train_batch_size", 1}, {"scheduler", {{"type", type}, {"params", row["params"]}}}});
    auto schedule = make_scheduler(*config.scheduler, *optimizer);
    const int64_t lbi = row["lbi"];
    const double expected = row["lr"];
    const double actual = schedule->lr_at(lbi).at(0);
    EXPECT_NEAR(actual, expected, 1e-12 * std::fabs(expected) + 1e-300)
        << type << " lbi " << lbi << " params " << row["params"].dump();
    if (row.contains("momentum")) {
      auto* one_cycle = dynamic_cast<OneCycle*>(schedule.get());
      ASSERT_NE(one_cycle, nullptr);
      EXPECT_FALSE(one_cycle->cycles_momentum());
      auto& sgd = static_cast<torch::optim::SGDOptions&>(optimizer->param_groups()[0].options());
      EXPECT_DOUBLE_EQ(sgd.momentum(), row["momentum"].get<double>());
    }
    checked[type] += 1;
  }
  for (const char* type :
       {"WarmupLR", "WarmupDecayLR", "WarmupCosineLR", "OneCycle", "LRRangeTest"}) {
    EXPECT_GT(checked[type], 10) << type;
  }
}

TEST(LRSchedules, StepMappingCreationSetsScheduleZeroAndKthStepSetsScheduleK) {
  auto optimizer = optimizer_for("AdamW", 0.5);
  WarmupLR schedule(
      *optimizer,
      WarmupLROptions().warmup_min_lr(0.0).warmup_max_lr(1.0).warmup_num_steps(4).warmup_type(
          WarmupType::kLinear));
  EXPECT_DOUBLE_EQ(current_lrs(*optimizer).at(0), 0.0);  // schedule(0), not the optimizer's 0.5
  for (int64_t k = 1; k <= 6; ++k) {
    schedule.step();
    EXPECT_DOUBLE_EQ(current_lrs(*optimizer).at(0), schedule.lr_at(k).at(0)) << "step " << k;
    EXPECT_EQ(schedule.step_count(), k);
    EXPECT_EQ(scheduler_step_count(schedule), k);
  }
  EXPECT_DOUBLE_EQ(current_lrs(*optimizer).at(0), 1.0);
}

TEST(LRSchedules, WarmupCosineScalesTheOptimizersOwnLr) {
  auto optimizer = optimizer_for("AdamW", 0.2);
  WarmupCosineLR schedule(*optimizer, WarmupCosineLROptions()
                                          .total_num_steps(10)
                                          .warmup_num_steps(2)
                                          .warmup_min_ratio(0.5)
                                          .warmup_type(WarmupType::kLinear));
  EXPECT_DOUBLE_EQ(current_lrs(*optimizer).at(0), 0.1);
  EXPECT_DOUBLE_EQ(schedule.ratio_at(1), 0.75);
}

TEST(LRSchedules, OneCycleCyclesBeta1OfAdamInverselyToLr) {
  auto optimizer = optimizer_for("AdamW", 0.1);
  OneCycle schedule(*optimizer, OneCycleOptions()
                                    .cycle_min_lr(0.001)
                                    .cycle_max_lr(0.01)
                                    .cycle_first_step_size(5)
                                    .cycle_min_mom(0.85)
                                    .cycle_max_mom(0.95));
  ASSERT_TRUE(schedule.cycles_momentum());
  auto beta1 = [&] {
    auto& o = static_cast<torch::optim::AdamWOptions&>(optimizer->param_groups()[0].options());
    return std::get<0>(o.betas());
  };
  // lbi 0: scale 0.2 -> lr 0.0028, momentum 0.95 - 0.1 * 0.2 = 0.93.
  EXPECT_NEAR(current_lrs(*optimizer).at(0), 0.0028, 1e-15);
  EXPECT_NEAR(beta1(), 0.93, 1e-15);
  for (int64_t k = 1; k <= 12; ++k) {
    schedule.step();
    EXPECT_NEAR(beta1(), schedule.momentum_at(k), 1e-15) << "step " << k;
    const double scale = (schedule.lr_at(k).at(0) - 0.001) / 0.009;
    if (k < 10) EXPECT_NEAR(beta1(), 0.95 - 0.1 * scale, 1e-12) << "step " << k;
  }
  EXPECT_NEAR(schedule.momentum_at(4), 0.85, 1e-12);  // peak lr, lowest momentum
}

TEST(LRSchedules, OneCycleWithoutDecayStepSizeHoldsMinLr) {
  auto optimizer = optimizer_for("SGD", 0.1);
  OneCycle schedule(
      *optimizer,
      OneCycleOptions().cycle_min_lr(0.001).cycle_max_lr(0.01).cycle_first_step_size(2));
  EXPECT_DOUBLE_EQ(schedule.lr_at(10).at(0), 0.001);
}

TEST(LRSchedules, ConstructorErrorsNameTheParameter) {
  auto optimizer = optimizer_for("AdamW", 0.1);
  try {
    WarmupCosineLR(*optimizer, WarmupCosineLROptions().total_num_steps(2).warmup_num_steps(1));
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_STREQ(e.what(),
                 "total_num_steps (2) must be greater than the warmup's length, max(2, "
                 "warmup_num_steps) (2)");
  }
  try {
    WarmupLR(*optimizer, WarmupLROptions().warmup_num_steps(-1));
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_STREQ(e.what(), "warmup_num_steps must be >= 0 (DeepSpeed runs 0 and 1 as 2), got -1");
  }
}

// NOTE: [warmup clamp]: DeepSpeed's lr_schedules.py sets warmup_num_steps = max(2, W) before
// anything else, so W = 0, 1 and 2 give the same lrs. The expected values are DeepSpeed's
// formulas at lbi 0..5 (warmup_min_lr 0, warmup_max_lr 0.001; WarmupDecayLR with
// total_num_steps 10 decays as (10 - lbi) / (10 - 2)), worked out from its source.
TEST(LRSchedules, WarmupsRunZeroAndOneStepsAsTwoAsDeepSpeedDoes) {
  const std::vector<double> log_warmup = {0, 0.001, 0.001, 0.001, 0.001, 0.001};
  const std::vector<double> linear_warmup = {0, 0.0005, 0.001, 0.001, 0.001, 0.001};
  const std::vector<double> log_decay = {0, 0.001, 0.001, 0.000875, 0.00075, 0.000625};
  const std::vector<double> linear_decay = {0, 0.0005, 0.001, 0.000875, 0.00075, 0.000625};
  for (int64_t steps : {0, 1, 2}) {
    for (auto type : {WarmupType::kLog, WarmupType::kLinear}) {
      const bool log = type == WarmupType::kLog;
      auto optimizer = optimizer_for("AdamW", 0.1);
      const auto warmup =
          WarmupLROptions().warmup_max_lr(0.001).warmup_num_steps(steps).warmup_type(type);
      auto plain = make_scheduler(warmup, *optimizer);
      auto decay =
          make_scheduler(WarmupDecayLROptions().warmup(warmup).total_num_steps(10), *optimizer);
      for (int64_t lbi = 0; lbi < 6; ++lbi) {
        const auto at = c10::str(to_string(type), " warmup_num_steps ", steps, " lbi ", lbi);
        EXPECT_NEAR(plain->lr_at(lbi).at(0), (log ? log_warmup : linear_warmup)[lbi], 1e-15) << at;
        EXPECT_NEAR(decay->lr_at(lbi).at(0), (log ? log_decay : linear_decay)[lbi], 1e-15) << at;
      }
    }
  }
}

TEST(LRSchedules, AWarmupDecayShorterThanItsWarmupFallsToTheMinimumAsDeepSpeedDoes) {
  auto optimizer = optimizer_for("AdamW", 0.1);
  auto decay =
      make_scheduler(WarmupDecayLROptions().total_num_steps(5).warmup(
                         WarmupLROptions().warmup_num_steps(10).warmup_type(WarmupType::kLinear)),
                     *optimizer);
  EXPECT_NEAR(decay->lr_at(5).at(0), 0.0005, 1e-15);  // still warming up: 5 / 10
  EXPECT_EQ(decay->lr_at(10).at(0), 0.0);             // max(0, (5 - 10) / max(1, 5 - 10))
}

TEST(LRSchedules, OptionsOutOfRangeAreConfigErrorsNamingTheOption) {
  auto optimizer = optimizer_for("AdamW", 0.1);
  auto error = [&](const ScheduleOptions& options) {
    return testing::error_of<ConfigError>([&] { make_scheduler(options, *optimizer); });
  };
  EXPECT_EQ(error(WarmupLROptions().warmup_max_lr(1e308)),
            "warmup_max_lr must be a finite number in [0, 3.40282e+38], got 1e+308");
  EXPECT_EQ(error(WarmupLROptions().warmup_min_lr(std::nan(""))),
            "warmup_min_lr must be a finite number in [0, 3.40282e+38], got nan");
  EXPECT_EQ(error(WarmupCosineLROptions().total_num_steps(2000).cos_min_ratio(-0.5)),
            "cos_min_ratio must be a finite number in [0, 1], got -0.5");
  EXPECT_EQ(error(OneCycleOptions().cycle_max_lr(1).decay_lr_rate(-1)),
            "decay_lr_rate must be a finite number in [0, 3.40282e+38], got -1");
  EXPECT_EQ(error(OneCycleOptions().cycle_max_lr(1).cycle_min_mom(-0.1)),
            "cycle_min_mom must be a momentum (beta1) in [0, 1), got -0.1");
  EXPECT_EQ(error(LRRangeTestOptions().lr_range_test_step_rate(-2)),
            "lr_range_test_step_rate must be a finite number in [0, 3.40282e+38], got -2");
  // The optimizer's lr is untouched by a schedule that was refused.
  EXPECT_DOUBLE_EQ(current_lrs(*optimizer).at(0), 0.1);
}

TEST(LRSchedules, AnLrBeyondFloatIsATrainingErrorNotALibTorchOne) {
  // LRRangeTest grows without bound: lbi 0 gives 3e38, lbi 1 gives 6e38.
  auto optimizer = optimizer_for("SGD", 0.1);
  LRRangeTest schedule(*optimizer, LRRangeTestOptions()
                                       .lr_range_test_min_lr(1.5e38)
                                       .lr_range_test_step_size(1)
                                       .lr_range_test_step_rate(1.0)
                                       .lr_range_test_staircase(true));
  EXPECT_DOUBLE_EQ(current_lrs(*optimizer).at(0), 3e38);
  try {
    schedule.step();
    FAIL() << "expected TrainingError";
  } catch (const TrainingError& e) {
    EXPECT_STREQ(e.what(),
                 "LRRangeTest: the lr at last_batch_iteration 1 is 4.5e+38, beyond what a float "
                 "holds; lower the schedule's rates or step sizes");
  }
}

TEST(LRSchedules, NamesComeFromOneListInTheVariantsOrder) {
  const auto& names = supported_scheduler_types();
  ASSERT_EQ(names.size(), std::variant_size_v<ScheduleOptions>);
  auto optimizer = optimizer_for("AdamW", 0.1);
  for (size_t i = 0; i < names.size(); ++i) {
    auto options = default_schedule_options(names[i], "scheduler.type");
    EXPECT_EQ(options.index(), i);
    // Defaults that need no more than a total to be valid.
    if (auto* decay = std::get_if<WarmupDecayLROptions>(&options)) decay->total_num_steps(2000);
    if (auto* cosine = std::get_if<WarmupCosineLROptions>(&options)) cosine->total_num_steps(2000);
    if (auto* cycle = std::get_if<OneCycleOptions>(&options)) cycle->cycle_max_lr(0.01);
    EXPECT_EQ(make_scheduler(options, *optimizer)->name(), names[i]);
  }
  EXPECT_EQ(warmup_type_names(), (std::vector<std::string>{"log", "linear"}));
  EXPECT_EQ(to_string(parse_warmup_type("linear", "p")), "linear");
}

}  // namespace
}  // namespace stepwise
