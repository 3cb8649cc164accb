#include <stepwise/errors.h>
#include <stepwise/lr_schedules.h>

#include "schedule_checks.h"

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>

#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <tuple>

namespace stepwise {

WarmupType parse_warmup_type(const std::string& value, const std::string& path) {
  if (value == "log") return WarmupType::kLog;
  if (value == "linear") return WarmupType::kLinear;
  throw ConfigError(
      c10::str(path, " \"", value, "\" is not a warmup type; use \"log\" or \"linear\""));
}

namespace detail {

void check_warmup_steps(int64_t steps, WarmupType type, const std::string& prefix) {
  STEPWISE_CHECK(steps > 0, ConfigError, prefix,
                 "warmup_num_steps must be a positive integer, got ", steps);
  STEPWISE_CHECK(type != WarmupType::kLog || steps >= 2, ConfigError, prefix,
                 "warmup_num_steps must be >= 2 with warmup_type \"log\" (ln(1) = 0), got ", steps,
                 "; use warmup_type \"linear\" or more steps");
}

void check_total_steps(int64_t total, int64_t warmup, const std::string& prefix) {
  STEPWISE_CHECK(total > warmup, ConfigError, prefix, "total_num_steps (", total,
                 ") must be greater than ", prefix, "warmup_num_steps (", warmup, ")");
}

}  // namespace detail

std::string to_string(WarmupType type) { return type == WarmupType::kLog ? "log" : "linear"; }

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

Schedule::Schedule(torch::optim::Optimizer& optimizer)
    : torch::optim::LRScheduler(optimizer),
      optimizer_(optimizer),
      base_lrs_(current_lrs(optimizer)) {}

void Schedule::start() {
  auto lrs = lr_at(0);
  auto& groups = optimizer_.param_groups();
  for (size_t i = 0; i < groups.size(); ++i) {
    groups[i].options().set_lr(lrs[i]);
  }
  on_lbi(0);
}

std::vector<double> Schedule::get_lrs() {
  // see NOTE: [step mapping]: the k-th step (step_count_ == k - 1 here) sets schedule(k).
  const int64_t lbi = static_cast<int64_t>(step_count_) + 1;
  on_lbi(lbi);
  return lr_at(lbi);
}

// ---- WarmupLR / WarmupDecayLR ----

WarmupLR::WarmupLR(torch::optim::Optimizer& optimizer, const WarmupLROptions& options)
    : WarmupLR(optimizer, options, true) {
  start();
}

WarmupLR::WarmupLR(torch::optim::Optimizer& optimizer, const WarmupLROptions& options, bool)
    : Schedule(optimizer), options_(options) {
  detail::check_warmup_steps(options.warmup_num_steps(), options.warmup_type(), "");
}

double WarmupLR::warmup_gamma(int64_t lbi) const {
  const auto steps = options_.warmup_num_steps();
  if (lbi >= steps) return 1.0;
  if (options_.warmup_type() == WarmupType::kLog) {
    return std::log(static_cast<double>(lbi + 1)) * (1.0 / std::log(static_cast<double>(steps)));
  }
  return static_cast<double>(lbi) / static_cast<double>(steps);
}

double WarmupLR::gamma(int64_t lbi) const { return warmup_gamma(lbi); }

std::vector<double> WarmupLR::lr_at(int64_t lbi) const {
  const double g = gamma(lbi);
  const double lr =
      options_.warmup_min_lr() + (options_.warmup_max_lr() - options_.warmup_min_lr()) * g;
  return std::vector<double>(base_lrs_.size(), lr);
}

WarmupDecayLR::WarmupDecayLR(torch::optim::Optimizer& optimizer,
                             const WarmupDecayLROptions& options)
    : WarmupLR(optimizer,
               WarmupLROptions()
                   .warmup_min_lr(options.warmup_min_lr())
                   .warmup_max_lr(options.warmup_max_lr())
                   .warmup_num_steps(options.warmup_num_steps())
                   .warmup_type(options.warmup_type()),
               true),
      total_num_steps_(options.total_num_steps()) {
  detail::check_total_steps(total_num_steps_, options.warmup_num_steps(), "");
  start();
}

double WarmupDecayLR::gamma(int64_t lbi) const {
  const auto warmup = options_.warmup_num_steps();
  if (lbi < warmup) return warmup_gamma(lbi);
  return std::max(0.0, static_cast<double>(total_num_steps_ - lbi) /
                           std::max(1.0, static_cast<double>(total_num_steps_ - warmup)));
}

// ---- WarmupCosineLR ----

WarmupCosineLR::WarmupCosineLR(torch::optim::Optimizer& optimizer,
                               const WarmupCosineLROptions& options)
    : Schedule(optimizer), options_(options) {
  detail::check_warmup_steps(options.warmup_num_steps(), options.warmup_type(), "");
  detail::check_total_steps(options.total_num_steps(), options.warmup_num_steps(), "");
  start();
}

double WarmupCosineLR::ratio_at(int64_t lbi) const {
  const auto warmup = options_.warmup_num_steps();
  if (lbi < warmup) {
    double ratio =
        options_.warmup_type() == WarmupType::kLog
            ? std::log(static_cast<double>(lbi + 1)) / std::log(static_cast<double>(warmup))
            : static_cast<double>(lbi) / static_cast<double>(warmup);
    return options_.warmup_min_ratio() + ratio * (1.0 - options_.warmup_min_ratio());
  }
  const double real_last_step = static_cast<double>(lbi - warmup + 1);
  const double real_total_steps = static_cast<double>(options_.total_num_steps() - warmup);
  const double ratio = (1.0 + std::cos(M_PI * real_last_step / real_total_steps)) / 2.0;
  return std::max(0.0, options_.cos_min_ratio() + (1.0 - options_.cos_min_ratio()) * ratio);
}

std::vector<double> WarmupCosineLR::lr_at(int64_t lbi) const {
  const double ratio = ratio_at(lbi);
  std::vector<double> lrs;
  for (double base : base_lrs_) {
    lrs.push_back(base * ratio);
  }
  return lrs;
}

// ---- OneCycle ----

namespace {
// Adam and AdamW carry betas; other optimizers have no momentum OneCycle can cycle.
std::tuple<double, double>* betas_of(torch::optim::OptimizerOptions& options) {
  if (auto* adam = dynamic_cast<torch::optim::AdamOptions*>(&options)) return &adam->betas();
  if (auto* adamw = dynamic_cast<torch::optim::AdamWOptions*>(&options)) return &adamw->betas();
  return nullptr;
}
}  // namespace

OneCycle::OneCycle(torch::optim::Optimizer& optimizer, const OneCycleOptions& options)
    : Schedule(optimizer), options_(options) {
  STEPWISE_CHECK(options.cycle_first_step_size() > 0, ConfigError,
                 "cycle_first_step_size must be a positive integer, got ",
                 options.cycle_first_step_size());
  const double first = static_cast<double>(options.cycle_first_step_size());
  const double second = options.cycle_second_step_size() > 0
                            ? static_cast<double>(options.cycle_second_step_size())
                            : first;
  total_size_ = first + second;
  step_ratio_ = first / total_size_;
  cycle_momentum_ = options.cycle_momentum();
  if (cycle_momentum_) {
    for (auto& group : optimizer.param_groups()) {
      if (betas_of(group.options()) == nullptr) {
        TORCH_WARN("OneCycle: cycle_momentum is disabled because the optimizer has no betas ",
                   "(only Adam and AdamW do); its momentum stays as configured");
        cycle_momentum_ = false;
        break;
      }
    }
  }
  start();
}

double OneCycle::scale_factor(int64_t lbi) const {
  const double batch_iteration = static_cast<double>(lbi + 1);
  const double cycle = std::floor(1.0 + batch_iteration / total_size_);
  const double x = 1.0 + batch_iteration / total_size_ - cycle;
  return x <= step_ratio_ ? x / step_ratio_ : (x - 1.0) / (step_ratio_ - 1.0);
}

std::vector<double> OneCycle::lr_at(int64_t lbi) const {
  double lr;
  if (static_cast<double>(lbi) < total_size_) {
    lr = options_.cycle_min_lr() +
         (options_.cycle_max_lr() - options_.cycle_min_lr()) * scale_factor(lbi);
  } else if (options_.decay_step_size() > 0) {
    const double interval = static_cast<double>(lbi - static_cast<int64_t>(total_size_) + 1) /
                            static_cast<double>(options_.decay_step_size());
    lr = options_.cycle_min_lr() / (1.0 + options_.decay_lr_rate() * interval);
  } else {
    lr = options_.cycle_min_lr();
  }
  return std::vector<double>(base_lrs_.size(), lr);
}

double OneCycle::momentum_at(int64_t lbi) const {
  if (static_cast<double>(lbi) < total_size_) {
    return options_.cycle_max_mom() -
           (options_.cycle_max_mom() - options_.cycle_min_mom()) * scale_factor(lbi);
  }
  if (options_.decay_step_size() > 0) {
    const double interval = static_cast<double>(lbi - static_cast<int64_t>(total_size_) + 1) /
                            static_cast<double>(options_.decay_step_size());
    return options_.cycle_max_mom() * (1.0 + options_.decay_mom_rate() * interval);
  }
  return options_.cycle_max_mom();
}

void OneCycle::on_lbi(int64_t lbi) {
  if (!cycle_momentum_) return;
  const double momentum = momentum_at(lbi);
  for (auto& group : optimizer_.param_groups()) {
    auto* betas = betas_of(group.options());
    std::get<0>(*betas) = momentum;
  }
}

// ---- LRRangeTest ----

LRRangeTest::LRRangeTest(torch::optim::Optimizer& optimizer, const LRRangeTestOptions& options)
    : Schedule(optimizer), options_(options) {
  STEPWISE_CHECK(options.lr_range_test_step_size() > 0, ConfigError,
                 "lr_range_test_step_size must be a positive integer, got ",
                 options.lr_range_test_step_size());
  start();
}

std::vector<double> LRRangeTest::lr_at(int64_t lbi) const {
  double interval =
      static_cast<double>(lbi + 1) / static_cast<double>(options_.lr_range_test_step_size());
  if (options_.lr_range_test_staircase()) interval = std::floor(interval);
  const double lr =
      options_.lr_range_test_min_lr() * (1.0 + options_.lr_range_test_step_rate() * interval);
  return std::vector<double>(base_lrs_.size(), lr);
}

}  // namespace stepwise
