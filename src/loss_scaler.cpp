#include <stepwise/errors.h>
#include <stepwise/loss_scaler.h>

#include "check.h"
#include "option_checks.h"

#include <algorithm>
#include <cmath>

namespace stepwise {

LossScaler::LossScaler(const LossScalerOptions& options)
    : options_(options), scale_(options.init_scale()), hysteresis_left_(options.hysteresis()) {
  // see NOTE: [option errors]: the config parser names these by their fp16.* keys.
  using detail::LowerBound;
  detail::check_in_range("init_scale", options.init_scale(), 0.0, detail::kFloatMax,
                         LowerBound::kOpen);
  // 0 is DeepSpeed's "no floor" (it accepts fp16.min_loss_scale 0); update() then stops
  // where halving would leave no scale at all.
  detail::check_in_range("min_scale", options.min_scale(), 0.0, detail::kFloatMax);
  detail::check_positive("scale_window", options.scale_window());
  detail::check_positive("hysteresis", options.hysteresis());
  STEPWISE_CHECK_OPTION(!options.dynamic() || options.min_scale() <= options.init_scale(),
                        "min_scale", "(", options.min_scale(),
                        ") must not exceed the initial scale (", options.init_scale(), ")");
}

void LossScaler::update(bool overflow) {
  if (!options_.dynamic()) {
    iteration_ += 1;
    return;
  }
  if (overflow) {
    if (hysteresis_left_ <= 1) {
      if (scale_ <= options_.min_scale() || scale_ / 2.0 == 0.0) {
        throw TrainingError(c10::str(
            "fp16 loss scale is already at its minimum (", options_.min_scale(),
            ") and the gradients overflowed again at boundary ", iteration_,
            ": the model produces inf/nan gradients even unscaled. Lower the learning rate, "
            "check the data for inf/nan, or train in bf16 or fp32"));
      }
      scale_ = std::max(scale_ / 2.0, options_.min_scale());
    } else {
      hysteresis_left_ -= 1;
    }
    last_overflow_iteration_ = iteration_;
  } else {
    if (options_.consecutive_hysteresis()) hysteresis_left_ = options_.hysteresis();
    if ((iteration_ - last_overflow_iteration_) % options_.scale_window() == 0) {
      if (!options_.consecutive_hysteresis()) hysteresis_left_ = options_.hysteresis();
      scale_ *= 2.0;
    }
  }
  iteration_ += 1;
}

}  // namespace stepwise
