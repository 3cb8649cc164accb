#include <stepwise/errors.h>
#include <stepwise/fused_adamw.h>
#include <stepwise/optimizers.h>

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include "option_checks.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace stepwise {

const std::vector<std::string>& supported_optimizer_types() {
  static const std::vector<std::string> types = {"Adam", "AdamW", "SGD"};
  return types;
}

void validate(const OptimizerConfig& config) {
  const auto& types = supported_optimizer_types();
  STEPWISE_CHECK_OPTION(std::find(types.begin(), types.end(), config.type) != types.end(), "type",
                        "\"", config.type, "\" is not supported; use one of: ", detail::join(types),
                        " (names are case-sensitive)");
  using detail::check_in_range;
  check_in_range("lr", config.lr, 0.0, detail::kFloatMax);
  check_in_range("weight_decay", config.weight_decay, 0.0, detail::kFloatMax);
  check_in_range("momentum", config.momentum, 0.0, detail::kFloatMax);
  check_in_range("dampening", config.dampening, 0.0, 1.0);
  // eps is added in the parameters' dtype: below float's smallest normal it rounds away.
  check_in_range("eps", config.eps, std::numeric_limits<float>::min(), detail::kFloatMax);
  for (double beta : config.betas) {
    STEPWISE_CHECK_OPTION(std::isfinite(beta) && beta >= 0.0 && beta < 1.0, "betas",
                          "must be two numbers in [0, 1), got [", config.betas[0], ", ",
                          config.betas[1], "]");
  }
  STEPWISE_CHECK_OPTION(!config.nesterov || (config.momentum > 0.0 && config.dampening == 0.0),
                        "nesterov", "needs momentum > 0 and dampening 0, got momentum ",
                        config.momentum, " and dampening ", config.dampening);
  STEPWISE_CHECK_OPTION(!(config.amsgrad && config.torch_adam == false), "amsgrad",
                        "is true but torch_adam is false: the fused Adam has no AMSGrad; set "
                        "\"torch_adam\": true (or drop amsgrad)");
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const OptimizerConfig& config,
                                                        std::vector<torch::Tensor> params) {
  validate(config);
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
  TORCH_INTERNAL_ASSERT(false, "validate() let optimizer type \"", config.type, "\" through");
}

}  // namespace stepwise
