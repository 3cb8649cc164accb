#include <stepwise/config.h>
#include <stepwise/errors.h>
#include <stepwise/loss_scaler.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace stepwise {

LossScaler::LossScaler(const LossScalerOptions& options)
    : options_(options), scale_(options.init_scale()), hysteresis_left_(options.hysteresis()) {
  STEPWISE_CHECK(options.init_scale() > 0.0, ConfigError,
                 "the initial loss scale must be > 0, got ", options.init_scale());
  STEPWISE_CHECK(options.scale_window() > 0, ConfigError,
                 "fp16.loss_scale_window must be a positive integer, got ", options.scale_window());
  STEPWISE_CHECK(options.hysteresis() > 0, ConfigError,
                 "fp16.hysteresis must be a positive integer, got ", options.hysteresis());
  STEPWISE_CHECK(!options.dynamic() || options.min_scale() <= options.init_scale(), ConfigError,
                 "fp16.min_loss_scale (", options.min_scale(),
                 ") must not exceed the initial scale (", options.init_scale(), ")");
}

LossScaler LossScaler::from_config(const Fp16Config& config) {
  const bool dynamic = config.loss_scale <= 0.0;
  return LossScaler(
      LossScalerOptions()
          .init_scale(dynamic ? std::ldexp(1.0, static_cast<int>(config.initial_scale_power))
                              : config.loss_scale)
          .dynamic(dynamic)
          .scale_window(config.loss_scale_window)
          .hysteresis(config.hysteresis)
          .consecutive_hysteresis(config.consecutive_hysteresis)
          .min_scale(config.min_loss_scale));
}

void LossScaler::update(bool overflow) {
  if (!options_.dynamic()) {
    iteration_ += 1;
    return;
  }
  if (overflow) {
    if (hysteresis_left_ <= 1) {
      if (scale_ <= options_.min_scale()) {
        throw std::runtime_error(c10::str(
            "fp16 loss scale is already at fp16.min_loss_scale (", options_.min_scale(),
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
