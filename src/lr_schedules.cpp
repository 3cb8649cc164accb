#include <stepwise/errors.h>
#include <stepwise/lr_schedules.h>

#include "check.h"
#include "lamb.h"
#include "lr_schedules_detail.h"
#include "option_checks.h"

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>

#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <tuple>
#include <type_traits>

namespace stepwise {

using detail::check_in_range;
using detail::check_positive;
using detail::kFloatMax;

namespace {

// ---- validation: see NOTE: [option errors] ----

// NOTE: [warmup clamp] DeepSpeed's warmups (WarmupLR, WarmupDecayLR, WarmupCosineLR) use
// max(2, warmup_num_steps) everywhere the length appears, so 0 and 1 run exactly as 2
// (for "log" that keeps 1 / ln(steps) finite). stepwise does the same, with one warning
// when the schedule is built. A negative length is refused (DeepSpeed >= 0.19.3 does too).
int64_t effective_warmup(int64_t steps) { return std::max<int64_t>(2, steps); }

void check_warmup_steps(int64_t steps) {
  STEPWISE_CHECK_OPTION(steps >= 0, "warmup_num_steps",
                        "must be >= 0 (DeepSpeed runs 0 and 1 as 2), got ", steps);
}

void check_total_steps(int64_t total, int64_t warmup) {
  STEPWISE_CHECK_OPTION(total > effective_warmup(warmup), "total_num_steps", "(", total,
                        ") must be greater than the warmup's length, max(2, warmup_num_steps) (",
                        effective_warmup(warmup), ")");
}

void check_momentum(const char* option, double value) {
  STEPWISE_CHECK_OPTION(std::isfinite(value) && value >= 0.0 && value < 1.0, option,
                        "must be a momentum (beta1) in [0, 1), got ", value);
}

void check(const WarmupLROptions& o) {
  check_in_range("warmup_min_lr", o.warmup_min_lr(), 0.0, kFloatMax);
  check_in_range("warmup_max_lr", o.warmup_max_lr(), 0.0, kFloatMax);
  check_warmup_steps(o.warmup_num_steps());
}

// Any total DeepSpeed runs: the decay divides by max(1, total - warmup), so a total at or
// below the warmup's length decays to warmup_min_lr right after it.
void check(const WarmupDecayLROptions& o) {
  check(o.warmup());
  STEPWISE_CHECK_OPTION(o.total_num_steps() >= 0, "total_num_steps", "must be >= 0, got ",
                        o.total_num_steps());
}

// DeepSpeed v0.14 divides by total - warmup (ZeroDivisionError when they are equal, a
// cosine that runs backwards below): the total must exceed the warmup's length.
void check(const WarmupCosineLROptions& o) {
  check_warmup_steps(o.warmup_num_steps());
  check_total_steps(o.total_num_steps(), o.warmup_num_steps());
  check_in_range("warmup_min_ratio", o.warmup_min_ratio(), 0.0, 1.0);
  check_in_range("cos_min_ratio", o.cos_min_ratio(), 0.0, 1.0);
}

void check(const OneCycleOptions& o) {
  check_in_range("cycle_min_lr", o.cycle_min_lr(), 0.0, kFloatMax);
  check_in_range("cycle_max_lr", o.cycle_max_lr(), 0.0, kFloatMax);
  check_in_range("decay_lr_rate", o.decay_lr_rate(), 0.0, kFloatMax);
  check_positive("cycle_first_step_size", o.cycle_first_step_size());
  STEPWISE_CHECK_OPTION(o.decay_step_size() >= 0, "decay_step_size",
                        "must be >= 0 (0 = no decay), got ", o.decay_step_size());
  check_momentum("cycle_min_mom", o.cycle_min_mom());
  check_momentum("cycle_max_mom", o.cycle_max_mom());
  check_in_range("decay_mom_rate", o.decay_mom_rate(), 0.0, kFloatMax);
}

void check(const LRRangeTestOptions& o) {
  check_in_range("lr_range_test_min_lr", o.lr_range_test_min_lr(), 0.0, kFloatMax);
  check_positive("lr_range_test_step_size", o.lr_range_test_step_size());
  check_in_range("lr_range_test_step_rate", o.lr_range_test_step_rate(), 0.0, kFloatMax);
}

// ---- the formulas, as functions of lbi ----

// The warmup fraction in [0, 1] (1 once lbi >= steps), shared by every warmup.
double warmup_fraction(int64_t lbi, int64_t num_steps, WarmupType type) {
  const int64_t steps = effective_warmup(num_steps);  // see NOTE: [warmup clamp]
  if (lbi >= steps) return 1.0;
  if (type == WarmupType::kLog) {
    return std::log(static_cast<double>(lbi + 1)) * (1.0 / std::log(static_cast<double>(steps)));
  }
  return static_cast<double>(lbi) / static_cast<double>(steps);
}

double lr_of(const WarmupLROptions& o, double gamma) {
  return o.warmup_min_lr() + (o.warmup_max_lr() - o.warmup_min_lr()) * gamma;
}

double cosine_ratio(const WarmupCosineLROptions& o, int64_t lbi) {
  const auto warmup = effective_warmup(o.warmup_num_steps());
  if (lbi < warmup) {
    return o.warmup_min_ratio() +
           warmup_fraction(lbi, warmup, o.warmup_type()) * (1.0 - o.warmup_min_ratio());
  }
  const double real_last_step = static_cast<double>(lbi - warmup + 1);
  const double real_total_steps = static_cast<double>(o.total_num_steps() - warmup);
  const double ratio = (1.0 + std::cos(M_PI * real_last_step / real_total_steps)) / 2.0;
  return std::max(0.0, o.cos_min_ratio() + (1.0 - o.cos_min_ratio()) * ratio);
}

// The cycle's length in steps (a double, as in DeepSpeed: two step sizes near
// INT64_MAX must not overflow).
double one_cycle_total(const OneCycleOptions& o) {
  const double first = static_cast<double>(o.cycle_first_step_size());
  return first +
         (o.cycle_second_step_size() > 0 ? static_cast<double>(o.cycle_second_step_size()) : first);
}

// OneCycle's position in the cycle: 0 at the ends, 1 at the peak.
double one_cycle_scale(const OneCycleOptions& o, int64_t lbi) {
  const double total = one_cycle_total(o);
  const double step_ratio = static_cast<double>(o.cycle_first_step_size()) / total;
  const double batch_iteration = static_cast<double>(lbi + 1);
  const double cycle = std::floor(1.0 + batch_iteration / total);
  const double x = 1.0 + batch_iteration / total - cycle;
  return x <= step_ratio ? x / step_ratio : (x - 1.0) / (step_ratio - 1.0);
}

// Intervals of `step_size` since the cycle ended (OneCycle's decay), or 0 without decay.
double decay_interval(const OneCycleOptions& o, int64_t lbi) {
  if (o.decay_step_size() <= 0) return 0.0;
  return (static_cast<double>(lbi) - one_cycle_total(o) + 1.0) /
         static_cast<double>(o.decay_step_size());
}

double one_cycle_momentum(const OneCycleOptions& o, int64_t lbi) {
  if (static_cast<double>(lbi) < one_cycle_total(o)) {
    return o.cycle_max_mom() - (o.cycle_max_mom() - o.cycle_min_mom()) * one_cycle_scale(o, lbi);
  }
  return o.cycle_max_mom() * (1.0 + o.decay_mom_rate() * decay_interval(o, lbi));
}

// Adam, AdamW and Lamb carry betas; other optimizers have no momentum OneCycle can cycle.
std::tuple<double, double>* betas_of(torch::optim::OptimizerOptions& options) {
  if (auto* adam = dynamic_cast<torch::optim::AdamOptions*>(&options)) return &adam->betas();
  if (auto* adamw = dynamic_cast<torch::optim::AdamWOptions*>(&options)) return &adamw->betas();
  if (auto* lamb = dynamic_cast<detail::LambOptions*>(&options)) return &lamb->betas();
  return nullptr;
}

bool should_cycle_momentum(const ScheduleOptions& options, torch::optim::Optimizer& optimizer) {
  const auto* o = std::get_if<OneCycleOptions>(&options);
  if (o == nullptr || !o->cycle_momentum()) return false;
  for (auto& group : optimizer.param_groups()) {
    if (betas_of(group.options()) == nullptr) {
      TORCH_WARN("OneCycle: cycle_momentum is disabled because the optimizer has no betas ",
                 "(only Adam, AdamW and Lamb do); its momentum stays as configured");
      return false;
    }
  }
  return true;
}

// Refuses an lr a float cannot hold (LRRangeTest grows without bound).
std::vector<double> checked(std::vector<double> lrs, const std::string& name, int64_t lbi) {
  for (double lr : lrs) {
    STEPWISE_CHECK(std::isfinite(lr) && lr <= kFloatMax, TrainingError, name,
                   ": the lr at last_batch_iteration ", lbi, " is ", lr,
                   ", beyond what a float holds; lower the schedule's rates or step sizes");
  }
  return lrs;
}

}  // namespace

void validate(const ScheduleOptions& options) {
  std::visit([](const auto& o) { check(o); }, options);
}

std::vector<double> current_lrs(torch::optim::Optimizer& optimizer) {
  std::vector<double> lrs;
  for (auto& group : optimizer.param_groups()) {
    lrs.push_back(group.options().get_lr());
  }
  return lrs;
}

namespace {
// NOTE: [scheduler step count] LRScheduler keeps its step count protected. A
// pointer to that member, taken inside a derived class, reads it on any
// scheduler, so the engine can tell whether a client scheduler was stepped by
// someone else (the user's leftover scheduler.step()).
struct StepCountAccess : torch::optim::LRScheduler {
  static auto member() { return &StepCountAccess::step_count_; }
};
}  // namespace

int64_t scheduler_step_count(const torch::optim::LRScheduler& scheduler) {
  return static_cast<int64_t>(scheduler.*StepCountAccess::member());
}

void set_scheduler_step_count(torch::optim::LRScheduler& scheduler, int64_t count) {
  using Count = std::remove_reference_t<decltype(scheduler.*StepCountAccess::member())>;
  scheduler.*StepCountAccess::member() = static_cast<Count>(count);
}

namespace {

// One warning per schedule for what DeepSpeed also only warns about: see NOTE: [warmup clamp].
void warn_about_clamps(const ScheduleOptions& options) {
  std::visit(
      [](const auto& o) {
        using T = std::decay_t<decltype(o)>;
        int64_t steps = 2;
        if constexpr (std::is_same_v<T, WarmupLROptions> ||
                      std::is_same_v<T, WarmupCosineLROptions>) {
          steps = o.warmup_num_steps();
        } else if constexpr (std::is_same_v<T, WarmupDecayLROptions>) {
          steps = o.warmup().warmup_num_steps();
          if (o.total_num_steps() < effective_warmup(steps)) {
            TORCH_WARN("WarmupDecayLR: total_num_steps (", o.total_num_steps(),
                       ") is below the warmup's length (", effective_warmup(steps),
                       "): the lr falls to warmup_min_lr right after the warmup, as in DeepSpeed");
          }
        }
        if (steps < 2) {
          TORCH_WARN("warmup_num_steps ", steps,
                     " runs as 2, as in DeepSpeed (its warmups use max(2, warmup_num_steps))");
        }
      },
      options);
}

}  // namespace

Schedule::Schedule(torch::optim::Optimizer& optimizer, ScheduleOptions options)
    : torch::optim::LRScheduler(optimizer),
      optimizer_(optimizer),
      base_lrs_(current_lrs(optimizer)),
      options_((validate(options), std::move(options))),
      cycle_momentum_(should_cycle_momentum(options_, optimizer)) {
  warn_about_clamps(options_);
  jump_to(0);  // lr = schedule(0), OneCycle's beta1 too
}

const std::string& Schedule::name() const { return schedule_type(options_); }

std::vector<double> Schedule::lr_at(int64_t lbi) const {
  const auto same = [&](double lr) { return std::vector<double>(base_lrs_.size(), lr); };
  return std::visit(
      [&](const auto& o) -> std::vector<double> {
        using T = std::decay_t<decltype(o)>;
        if constexpr (std::is_same_v<T, WarmupLROptions>) {
          return same(lr_of(o, warmup_fraction(lbi, o.warmup_num_steps(), o.warmup_type())));
        } else if constexpr (std::is_same_v<T, WarmupDecayLROptions>) {
          const auto& w = o.warmup();
          const auto warmup = effective_warmup(w.warmup_num_steps());
          const double total = static_cast<double>(o.total_num_steps());
          const double gamma =
              lbi < warmup ? warmup_fraction(lbi, warmup, w.warmup_type())
                           : std::max(0.0, (total - static_cast<double>(lbi)) /
                                               std::max(1.0, total - static_cast<double>(warmup)));
          return same(lr_of(w, gamma));
        } else if constexpr (std::is_same_v<T, WarmupCosineLROptions>) {
          std::vector<double> lrs;
          for (double base : base_lrs_) lrs.push_back(base * cosine_ratio(o, lbi));
          return lrs;
        } else if constexpr (std::is_same_v<T, OneCycleOptions>) {
          if (static_cast<double>(lbi) < one_cycle_total(o)) {
            return same(o.cycle_min_lr() +
                        (o.cycle_max_lr() - o.cycle_min_lr()) * one_cycle_scale(o, lbi));
          }
          return same(o.cycle_min_lr() / (1.0 + o.decay_lr_rate() * decay_interval(o, lbi)));
        } else {
          double interval =
              static_cast<double>(lbi + 1) / static_cast<double>(o.lr_range_test_step_size());
          if (o.lr_range_test_staircase()) interval = std::floor(interval);
          return same(o.lr_range_test_min_lr() * (1.0 + o.lr_range_test_step_rate() * interval));
        }
      },
      options_);
}

std::vector<double> Schedule::get_lrs() {
  // see NOTE: [step mapping]: the k-th step (step_count_ == k - 1 here) sets schedule(k).
  const int64_t lbi = static_cast<int64_t>(step_count_) + 1;
  set_momentum(lbi);
  return checked(lr_at(lbi), name(), lbi);
}

void Schedule::jump_to(int64_t steps) {
  const auto lrs = checked(lr_at(steps), name(), steps);
  auto& groups = optimizer_.param_groups();
  for (size_t i = 0; i < groups.size(); ++i) groups[i].options().set_lr(lrs[i]);
  set_momentum(steps);
  set_scheduler_step_count(*this, steps);
}

void Schedule::set_momentum(int64_t lbi) {
  if (!cycle_momentum_) return;
  const double momentum = one_cycle_momentum(std::get<OneCycleOptions>(options_), lbi);
  for (auto& group : optimizer_.param_groups()) {
    std::get<0>(*betas_of(group.options())) = momentum;
  }
}

WarmupLR::WarmupLR(torch::optim::Optimizer& optimizer, const WarmupLROptions& options)
    : Schedule(optimizer, options) {}

WarmupDecayLR::WarmupDecayLR(torch::optim::Optimizer& optimizer,
                             const WarmupDecayLROptions& options)
    : Schedule(optimizer, options) {}

WarmupCosineLR::WarmupCosineLR(torch::optim::Optimizer& optimizer,
                               const WarmupCosineLROptions& options)
    : Schedule(optimizer, options) {}

double WarmupCosineLR::ratio_at(int64_t lbi) const {
  return cosine_ratio(std::get<WarmupCosineLROptions>(options()), lbi);
}

OneCycle::OneCycle(torch::optim::Optimizer& optimizer, const OneCycleOptions& options)
    : Schedule(optimizer, options) {}

double OneCycle::momentum_at(int64_t lbi) const {
  return one_cycle_momentum(std::get<OneCycleOptions>(options()), lbi);
}

LRRangeTest::LRRangeTest(torch::optim::Optimizer& optimizer, const LRRangeTestOptions& options)
    : Schedule(optimizer, options) {}

std::unique_ptr<Schedule> make_scheduler(const ScheduleOptions& options,
                                         torch::optim::Optimizer& optimizer) {
  return std::visit(
      [&](const auto& o) -> std::unique_ptr<Schedule> {
        using T = std::decay_t<decltype(o)>;
        if constexpr (std::is_same_v<T, WarmupLROptions>) {
          return std::make_unique<WarmupLR>(optimizer, o);
        } else if constexpr (std::is_same_v<T, WarmupDecayLROptions>) {
          return std::make_unique<WarmupDecayLR>(optimizer, o);
        } else if constexpr (std::is_same_v<T, WarmupCosineLROptions>) {
          return std::make_unique<WarmupCosineLR>(optimizer, o);
        } else if constexpr (std::is_same_v<T, OneCycleOptions>) {
          return std::make_unique<OneCycle>(optimizer, o);
        } else {
          return std::make_unique<LRRangeTest>(optimizer, o);
        }
      },
      options);
}

}  // namespace stepwise
