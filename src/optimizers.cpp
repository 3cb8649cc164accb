#include <stepwise/errors.h>
#include <stepwise/fused_adamw.h>
#include <stepwise/optimizers.h>

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include "check.h"
#include "optimizers_detail.h"
#include "option_checks.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace stepwise {

const std::vector<std::string>& supported_optimizer_types() {
  static const std::vector<std::string> types = {"Adam", "AdamW", "SGD"};
  return types;
}

void validate(const OptimizerOptions& options) {
  const auto& types = supported_optimizer_types();
  STEPWISE_CHECK_OPTION(std::find(types.begin(), types.end(), options.type()) != types.end(),
                        "type", "\"", options.type(),
                        "\" is not supported; use one of: ", detail::join(types),
                        " (Adam and AdamW in any case, as DeepSpeed reads them; SGD as written)");
  using detail::check_in_range;
  check_in_range("lr", options.lr(), 0.0, detail::kFloatMax);
  check_in_range("weight_decay", options.weight_decay(), 0.0, detail::kFloatMax);
  check_in_range("momentum", options.momentum(), 0.0, detail::kFloatMax);
  // torch.optim.SGD has no range for dampening: any finite value gives defined numbers.
  check_in_range("dampening", options.dampening(), -detail::kFloatMax, detail::kFloatMax);
  // eps is added in the parameters' dtype: below float's smallest normal it rounds away.
  check_in_range("eps", options.eps(), std::numeric_limits<float>::min(), detail::kFloatMax);
  for (double beta : options.betas()) {
    STEPWISE_CHECK_OPTION(std::isfinite(beta) && beta >= 0.0 && beta < 1.0, "betas",
                          "must be two numbers in [0, 1), got [", options.betas()[0], ", ",
                          options.betas()[1], "]");
  }
  STEPWISE_CHECK_OPTION(
      !options.nesterov() || (options.momentum() > 0.0 && options.dampening() == 0.0), "nesterov",
      "needs momentum > 0 and dampening 0, got momentum ", options.momentum(), " and dampening ",
      options.dampening());
  STEPWISE_CHECK_OPTION(!(options.amsgrad() && options.torch_adam() == false), "amsgrad",
                        "is true but torch_adam is false: the fused Adam has no AMSGrad; set "
                        "\"torch_adam\": true (or drop amsgrad)");
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const OptimizerOptions& options,
                                                        std::vector<torch::Tensor> params) {
  validate(options);
  const auto betas = std::make_tuple(options.betas()[0], options.betas()[1]);
  // NOTE: [fused by device] "Adam"/"AdamW" use FusedAdamW when asked (torch_adam false)
  // or, unset, when the parameters are on CUDA (one kernel for all parameters, as
  // DeepSpeed's FusedAdam); on CPU LibTorch's optimizers stay the default.
  const bool on_cuda = !params.empty() && params.front().is_cuda();
  const bool fused = !options.amsgrad() && !options.torch_adam().value_or(!on_cuda);
  if (fused && (options.type() == "Adam" || options.type() == "AdamW")) {
    const bool decoupled = options.type() == "AdamW" || options.adam_w_mode();
    return std::make_unique<FusedAdamW>(std::move(params),
                                        torch::optim::AdamWOptions(options.lr())
                                            .betas(betas)
                                            .eps(options.eps())
                                            .weight_decay(options.weight_decay()),
                                        decoupled);
  }
  // see NOTE: [Adam means AdamW]
  if (options.type() == "AdamW" || (options.type() == "Adam" && options.adam_w_mode())) {
    return std::make_unique<torch::optim::AdamW>(std::move(params),
                                                 torch::optim::AdamWOptions(options.lr())
                                                     .betas(betas)
                                                     .eps(options.eps())
                                                     .weight_decay(options.weight_decay())
                                                     .amsgrad(options.amsgrad()));
  }
  if (options.type() == "Adam") {
    return std::make_unique<torch::optim::Adam>(std::move(params),
                                                torch::optim::AdamOptions(options.lr())
                                                    .betas(betas)
                                                    .eps(options.eps())
                                                    .weight_decay(options.weight_decay())
                                                    .amsgrad(options.amsgrad()));
  }
  if (options.type() == "SGD") {
    return std::make_unique<torch::optim::SGD>(std::move(params),
                                               torch::optim::SGDOptions(options.lr())
                                                   .momentum(options.momentum())
                                                   .dampening(options.dampening())
                                                   .weight_decay(options.weight_decay())
                                                   .nesterov(options.nesterov()));
  }
  TORCH_INTERNAL_ASSERT(false, "validate() let optimizer type \"", options.type(), "\" through");
}

}  // namespace stepwise
