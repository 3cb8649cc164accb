// stepwise: the fp16 loss scale, as a pure state machine (DeepSpeed's rule).
//
// Usage {.cpp .fragment context="basic"}:
//
//   auto scaler = stepwise::LossScaler(stepwise::LossScalerOptions().init_scale(65536));
//   // backward: backpropagate loss * scaler.scale(); step: unscale the gradients, then
//   bool found_inf_or_nan = false;
//   scaler.update(/*overflow=*/found_inf_or_nan);  // halves or grows the scale
//
// NOTE: [loss scale rule] Dynamic scaling (DeepSpeed's DynamicLossScaler): on an
// overflow, if the hysteresis budget is 1 or less the scale becomes
// max(scale / 2, min_scale) (and an overflow at min_scale is an error; min_scale 0 is
// no floor, and an overflow where halving would leave no scale is the error), else
// the budget shrinks by one. On a good step, when (iteration -
// last_overflow_iteration) % window == 0 the scale doubles and the budget is
// refilled; with consecutive_hysteresis the budget is refilled on every good
// step. A static scaler never changes. No logging, no communication.
#pragma once

#include <torch/arg.h>

#include <cstdint>
#include <string>

namespace stepwise {

/// Options of LossScaler (DeepSpeed's fp16 keys, as a scale instead of a power).
struct LossScalerOptions {
  /// The scale before the first step (2^initial_scale_power).
  TORCH_ARG(double, init_scale) = 65536.0;
  /// false: a static scale that never changes.
  TORCH_ARG(bool, dynamic) = true;
  /// Good steps between two doublings (fp16.loss_scale_window).
  TORCH_ARG(int64_t, scale_window) = 1000;
  /// Overflows tolerated before the scale shrinks (fp16.hysteresis).
  TORCH_ARG(int64_t, hysteresis) = 2;
  /// Refill the hysteresis budget on every good step.
  TORCH_ARG(bool, consecutive_hysteresis) = false;
  /// The scale never goes below this (fp16.min_loss_scale; 0: no floor, as DeepSpeed).
  TORCH_ARG(double, min_scale) = 1.0;
};

/// Where a LossScaler is in its rule (what a checkpoint saves of it).
struct LossScalerState {
  /// The scale S.
  double scale = 1.0;
  /// Boundaries recorded.
  int64_t iteration = 0;
  /// The iteration of the last overflow (-1: none).
  int64_t last_overflow_iteration = -1;
  /// The hysteresis budget left.
  int64_t hysteresis_left = 0;
};

/// The loss scale and its update rule. see NOTE: [loss scale rule]
class LossScaler {
 public:
  /// A scaler with `options`; throws ConfigError naming the option (scale_window,
  /// min_scale, ...) for an invalid value. Scales are finite, > 0 and fit a float.
  explicit LossScaler(const LossScalerOptions& options = {});

  /// The current scale S.
  double scale() const { return scale_; }
  /// Records one boundary: `overflow` whether any gradient was inf or nan.
  /// Throws TrainingError when a dynamic scale at min_scale overflows again.
  void update(bool overflow);

  /// Boundaries recorded so far.
  int64_t iteration() const { return iteration_; }
  /// The remaining hysteresis budget.
  int64_t hysteresis_left() const { return hysteresis_left_; }
  /// The options it was built with.
  const LossScalerOptions& options() const { return options_; }
  /// Its state, for a checkpoint.
  LossScalerState state() const {
    return {scale_, iteration_, last_overflow_iteration_, hysteresis_left_};
  }
  /// Continues from `state` (a checkpoint's).
  void restore(const LossScalerState& state) {
    scale_ = state.scale;
    iteration_ = state.iteration;
    last_overflow_iteration_ = state.last_overflow_iteration;
    hysteresis_left_ = state.hysteresis_left;
  }

 private:
  LossScalerOptions options_;
  double scale_;
  int64_t iteration_ = 0;
  int64_t last_overflow_iteration_ = -1;
  int64_t hysteresis_left_;
};

}  // namespace stepwise
