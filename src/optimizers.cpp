#include <stepwise/errors.h>
#include <stepwise/fused_adamw.h>
#include <stepwise/optimizers.h>

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

namespace stepwise {

const std::vector<std::string>& supported_optimizer_types() {
  static const std::vector<std::string> types = {"Adam", "AdamW", "SGD"};
  return types;
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const OptimizerConfig& config,
                                                        std::vector<torch::Tensor> params) {
  const auto betas = std::make_tuple(config.betas[0], config.betas[1]);
  // NOTE: [fused by device] "Adam"/"AdamW" use FusedAdamW when asked (torch_adam false)
  // or, unset, when the parameters are on CUDA (one kernel for all parameters, as
  // DeepSpeed's FusedAdam); on CPU LibTorch's optimizers stay the default.
  const bool on_cuda = !params.empty() && params.front().is_cuda();
  const bool fused = !config.amsgrad && !config.torch_adam.value_or(!on_cuda);
  if (fused && (config.type == "Adam" || config.type == "AdamW")) {
    const bool decoupled = config.type == "AdamW" || config.adam_w_mode;
    return std::make_unique<FusedAdamW>(std::move(params),
                                        torch::optim::AdamWOptions(config.lr)
                                            .betas(betas)
                                            .eps(config.eps)
                                            .weight_decay(config.weight_decay),
                                        decoupled);
  }
  // see NOTE: [Adam means AdamW]
  if (config.type == "AdamW" || (config.type == "Adam" && config.adam_w_mode)) {
    return std::make_unique<torch::optim::AdamW>(std::move(params),
                                                 torch::optim::AdamWOptions(config.lr)
                                                     .betas(betas)
                                                     .eps(config.eps)
                                                     .weight_decay(config.weight_decay)
                                                     .amsgrad(config.amsgrad));
  }
  if (config.type == "Adam") {
    return std::make_unique<torch::optim::Adam>(std::move(params),
                                                torch::optim::AdamOptions(config.lr)
                                                    .betas(betas)
                                                    .eps(config.eps)
                                                    .weight_decay(config.weight_decay)
                                                    .amsgrad(config.amsgrad));
  }
  if (config.type == "SGD") {
    return std::make_unique<torch::optim::SGD>(std::move(params),
                                               torch::optim::SGDOptions(config.lr)
                                                   .momentum(config.momentum)
                                                   .dampening(config.dampening)
                                                   .weight_decay(config.weight_decay)
                                                   .nesterov(config.nesterov));
  }
  throw ConfigError(c10::str("optimizer.type \"", config.type,
                             "\" is not supported; use one of: Adam, AdamW, SGD"));
}

std::unique_ptr<Schedule> make_scheduler(const SchedulerConfig& config,
                                         torch::optim::Optimizer& optimizer) {
  return std::visit(
      [&](const auto& options) -> std::unique_ptr<Schedule> {
        using T = std::decay_t<decltype(options)>;
        if constexpr (std::is_same_v<T, WarmupLROptions>) {
          return std::make_unique<WarmupLR>(optimizer, options);
        } else if constexpr (std::is_same_v<T, WarmupDecayLROptions>) {
          return std::make_unique<WarmupDecayLR>(optimizer, options);
        } else if constexpr (std::is_same_v<T, WarmupCosineLROptions>) {
          return std::make_unique<WarmupCosineLR>(optimizer, options);
        } else if constexpr (std::is_same_v<T, OneCycleOptions>) {
          return std::make_unique<OneCycle>(optimizer, options);
        } else {
          return std::make_unique<LRRangeTest>(optimizer, options);
        }
      },
      config.params);
}

}  // namespace stepwise
