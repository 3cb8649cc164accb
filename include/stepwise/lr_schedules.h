// stepwise: DeepSpeed's learning-rate schedules as LibTorch LRSchedulers.
//
// Usage {.cpp .fragment context="engine"}:
//
//   torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(0.1));
//   stepwise::WarmupLR scheduler(optimizer, stepwise::WarmupLROptions()
//                                               .warmup_max_lr(0.01)
//                                               .warmup_num_steps(100));
//   // optimizer's lr is now schedule(0); after the k-th scheduler.step() it is
//   // schedule(k). Inside a stepwise::Engine, the ENGINE calls step() at each
//   // applied optimizer step: do not call it yourself.
//
// The formulas are DeepSpeed's (lr_schedules.py, v0.14) as functions of `lbi`
// (DeepSpeed's last_batch_iteration), exposed by `lr_at(lbi)`. A schedule is its
// options and the optimizer it drives: construction validates, then sets lr = schedule(0).
//
// NOTE: [step mapping] PyTorch's LRScheduler convention: the constructor sets
// lr = schedule(0); the k-th step() sets lr = schedule(k). So optimizer step k
// (k = 1, 2, ...) runs with schedule(k - 1). DeepSpeed v0.14 instead runs the
// first optimizer step with the optimizer's own lr.
#pragma once

#include <torch/arg.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/schedulers/lr_scheduler.h>

#include <cstdint>
#include <memory>
#include <string>
#include <variant>
#include <vector>

namespace stepwise {

/// How a warmup ramps from its minimum to its maximum.
enum class WarmupType { kLog, kLinear };

/// "log" or "linear".
std::string to_string(WarmupType type);

/// Options of WarmupLR (DeepSpeed's defaults). Lrs are finite, >= 0 and fit a float.
struct WarmupLROptions {
  /// Lr at the start of the warmup (lbi 0).
  TORCH_ARG(double, warmup_min_lr) = 0.0;
  /// Lr at the end of the warmup.
  TORCH_ARG(double, warmup_max_lr) = 1e-3;
  /// Warmup length in scheduler steps, >= 0; the schedule uses max(2, warmup_num_steps), as
  /// DeepSpeed does (0 and 1 run as 2, with a warning; see NOTE: [warmup clamp]).
  TORCH_ARG(int64_t, warmup_num_steps) = 1000;
  /// Shape of the warmup: log (DeepSpeed default) or linear.
  TORCH_ARG(WarmupType, warmup_type) = WarmupType::kLog;
};

/// Options of WarmupDecayLR: a WarmupLR warmup, then a linear decay to 0 at total_num_steps.
struct WarmupDecayLROptions {
  /// The warmup, as WarmupLR's options.
  TORCH_ARG(WarmupLROptions, warmup);
  /// Total scheduler steps T >= 0. After the warmup the lr decays linearly, reaching
  /// warmup_min_lr at T (right after the warmup when T is not beyond it, as in DeepSpeed).
  TORCH_ARG(int64_t, total_num_steps) = 0;
};

/// Options of WarmupCosineLR: ratios (in [0, 1]) of the optimizer's own lr.
struct WarmupCosineLROptions {
  /// Total scheduler steps T; must exceed max(2, warmup_num_steps).
  TORCH_ARG(int64_t, total_num_steps) = 0;
  /// Fraction of the optimizer lr at the start of the warmup.
  TORCH_ARG(double, warmup_min_ratio) = 0.0;
  /// Warmup length in scheduler steps, >= 0; the schedule uses max(2, warmup_num_steps), as
  /// DeepSpeed does (0 and 1 run as 2, with a warning; see NOTE: [warmup clamp]).
  TORCH_ARG(int64_t, warmup_num_steps) = 1000;
  /// Fraction of the optimizer lr at the end of the cosine.
  TORCH_ARG(double, cos_min_ratio) = 1e-4;
  /// Shape of the warmup: log (DeepSpeed default) or linear.
  TORCH_ARG(WarmupType, warmup_type) = WarmupType::kLog;
};

/// Options of OneCycle (1cycle policy, with momentum cycling for Adam-style betas).
struct OneCycleOptions {
  /// Lowest lr of the cycle, and the base of the decay.
  TORCH_ARG(double, cycle_min_lr) = 0.0;
  /// Highest lr of the cycle.
  TORCH_ARG(double, cycle_max_lr) = 0.0;
  /// Lr decay rate after the cycle (>= 0).
  TORCH_ARG(double, decay_lr_rate) = 0.0;
  /// Steps from cycle_min_lr up to cycle_max_lr.
  TORCH_ARG(int64_t, cycle_first_step_size) = 2000;
  /// Unset (<= 0) means equal to cycle_first_step_size.
  TORCH_ARG(int64_t, cycle_second_step_size) = 0;
  /// Steps per decay interval after the cycle; 0 = no decay.
  TORCH_ARG(int64_t, decay_step_size) = 0;
  /// Cycle beta1 inversely to the lr (Adam/AdamW only).
  TORCH_ARG(bool, cycle_momentum) = true;
  /// Lowest momentum (at the lr peak), in [0, 1).
  TORCH_ARG(double, cycle_min_mom) = 0.8;
  /// Highest momentum (at the cycle ends), in [0, 1).
  TORCH_ARG(double, cycle_max_mom) = 0.9;
  /// Momentum growth rate after the cycle (>= 0).
  TORCH_ARG(double, decay_mom_rate) = 0.0;
};

/// Options of LRRangeTest: lr grows from lr_range_test_min_lr by step_rate per step_size.
struct LRRangeTestOptions {
  /// Lr at the start of the test.
  TORCH_ARG(double, lr_range_test_min_lr) = 1e-3;
  /// Steps per interval of growth.
  TORCH_ARG(int64_t, lr_range_test_step_size) = 2000;
  /// Lr growth per interval, as a fraction of the min lr (>= 0).
  TORCH_ARG(double, lr_range_test_step_rate) = 1.0;
  /// Grow in whole intervals instead of continuously.
  TORCH_ARG(bool, lr_range_test_staircase) = false;
};

/// The options of any one schedule.
using ScheduleOptions = std::variant<WarmupLROptions, WarmupDecayLROptions, WarmupCosineLROptions,
                                     OneCycleOptions, LRRangeTestOptions>;

/// The name of the schedule `options` configure ("WarmupLR", ...), as in the config.
const std::string& schedule_type(const ScheduleOptions& options);
/// Throws ConfigError naming the option, its value and the valid range when an
/// option is invalid. Every schedule's constructor calls it.
void validate(const ScheduleOptions& options);

/// One of DeepSpeed's schedules driving an optimizer: a torch::optim::LRScheduler
/// whose lr is a pure function of `lbi`, with the step mapping of NOTE: [step mapping].
class Schedule : public torch::optim::LRScheduler {
 public:
  /// Validates `options`, records the optimizer's lrs, and sets every group's lr
  /// to lr_at(0) (for OneCycle, beta1 to its momentum at 0 too).
  Schedule(torch::optim::Optimizer& optimizer, ScheduleOptions options);
  /// The schedule's name as in DeepSpeed's config ("WarmupLR", ...).
  const std::string& name() const;
  /// The lr of every parameter group at last_batch_iteration `lbi` (>= 0).
  std::vector<double> lr_at(int64_t lbi) const;
  /// The options it was built with.
  const ScheduleOptions& options() const { return options_; }
  /// Whether beta1 is cycled (OneCycle with Adam/AdamW; false otherwise).
  bool cycles_momentum() const { return cycle_momentum_; }
  /// How many times step() was called since construction.
  int64_t step_count() const { return step_count_; }
  /// Puts the schedule where `steps` step() calls would have: the step count, every
  /// group's lr (lr_at(steps)) and, for OneCycle, beta1 (a checkpoint's position).
  void jump_to(int64_t steps);

 protected:
  /// LRScheduler hook: the lrs after this step (see NOTE: [step mapping]).
  std::vector<double> get_lrs() override;

 private:
  void set_momentum(int64_t lbi);
  torch::optim::Optimizer& optimizer_;
  std::vector<double> base_lrs_;
  ScheduleOptions options_;
  bool cycle_momentum_;
};

/// lr = min + (max - min) * gamma, gamma rising to 1 over warmup_num_steps.
class WarmupLR : public Schedule {
 public:
  /// Validates, then sets the optimizer's lr to schedule(0).
  WarmupLR(torch::optim::Optimizer& optimizer, const WarmupLROptions& options);
};

/// WarmupLR, then gamma = max(0, (T - lbi) / max(1, T - warmup_num_steps)).
class WarmupDecayLR : public Schedule {
 public:
  /// Sets the optimizer's lr to schedule(0).
  WarmupDecayLR(torch::optim::Optimizer& optimizer, const WarmupDecayLROptions& options);
};

/// Warmup from warmup_min_ratio to 1, then cosine to cos_min_ratio, times the
/// optimizer's own lr.
class WarmupCosineLR : public Schedule {
 public:
  /// Sets the optimizer's lr to schedule(0).
  WarmupCosineLR(torch::optim::Optimizer& optimizer, const WarmupCosineLROptions& options);
  /// The multiplier of the optimizer's own lr at `lbi`.
  double ratio_at(int64_t lbi) const;
};

/// The 1cycle policy: lr up then down over one cycle, then decay; momentum
/// (beta1 of Adam, AdamW or Lamb) cycles inversely. Optimizers without betas (SGD) keep
/// their momentum, as in DeepSpeed, with a warning.
class OneCycle : public Schedule {
 public:
  /// Sets the optimizer's lr to schedule(0) and, for Adam, AdamW or Lamb, beta1 to
  /// momentum_at(0).
  OneCycle(torch::optim::Optimizer& optimizer, const OneCycleOptions& options);
  /// The momentum (beta1) at `lbi`.
  double momentum_at(int64_t lbi) const;
};

/// lr = min_lr * (1 + step_rate * interval), interval = (lbi + 1) / step_size
/// (floored when staircase).
class LRRangeTest : public Schedule {
 public:
  /// Sets the optimizer's lr to schedule(0).
  LRRangeTest(torch::optim::Optimizer& optimizer, const LRRangeTestOptions& options);
};

/// Builds the schedule `options` describe (a WarmupLR, ...), driving `optimizer`.
std::unique_ptr<Schedule> make_scheduler(const ScheduleOptions& options,
                                         torch::optim::Optimizer& optimizer);
/// The lr of every parameter group of `optimizer`.
std::vector<double> current_lrs(torch::optim::Optimizer& optimizer);
/// How many times step() was called on any torch::optim::LRScheduler.
int64_t scheduler_step_count(const torch::optim::LRScheduler& scheduler);

}  // namespace stepwise
