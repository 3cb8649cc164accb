#include <stepwise/errors.h>
#include <stepwise/fused_adamw.h>
#include <stepwise/optimizers.h>

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include "check.h"
#include "lamb.h"
#include "optimizers_detail.h"
#include "option_checks.h"
#include "torch_compat.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace stepwise {

const std::vector<std::string>& supported_optimizer_types() {
  static const std::vector<std::string> types = {"Adam", "AdamW", "Lamb", "SGD"};
  return types;
}

void validate(const OptimizerOptions& options) {
  const auto& types = supported_optimizer_types();
  STEPWISE_CHECK_OPTION(std::find(types.begin(), types.end(), options.type()) != types.end(),
                        "type", "\"", options.type(),
                        "\" is not supported; use one of: ", detail::join(types),
                        " (Adam, AdamW and Lamb in any case, as DeepSpeed reads them; SGD as "
                        "written)");
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
  check_in_range("max_coeff", options.max_coeff(), -detail::kFloatMax, detail::kFloatMax);
  check_in_range("min_coeff", options.min_coeff(), -detail::kFloatMax, detail::kFloatMax);
  if (options.type() == "Lamb") {  // DeepSpeed's FusedLamb takes neither of Adam's switches
    STEPWISE_CHECK_OPTION(!options.amsgrad(), "amsgrad",
                          "is true: DeepSpeed's FusedLamb does not support the AMSGrad variant; "
                          "drop amsgrad");
    STEPWISE_CHECK_OPTION(!options.torch_adam() && options.adam_w_mode(),
                          options.torch_adam() ? "torch_adam" : "adam_w_mode",
                          "is set, but it is Adam's: DeepSpeed's FusedLamb has no such "
                          "argument; drop it");
    return;
  }
  STEPWISE_CHECK_OPTION(!(options.amsgrad() && options.torch_adam() == false), "amsgrad",
                        "is true but torch_adam is false: the fused Adam has no AMSGrad; set "
                        "\"torch_adam\": true (or drop amsgrad)");
  // DeepSpeed passes bias_correction on to the optimizer it builds: FusedAdam takes it,
  // torch.optim.Adam/AdamW (torch_adam) and its AMSGrad path do not.
  STEPWISE_CHECK_OPTION(options.bias_correction() || !options.torch_adam().value_or(false),
                        "bias_correction",
                        "is false but torch_adam is true: LibTorch's Adam and AdamW always "
                        "correct the bias (DeepSpeed's torch.optim.Adam refuses the key); drop "
                        "\"torch_adam\" or bias_correction");
  STEPWISE_CHECK_OPTION(options.bias_correction() || !options.amsgrad(), "bias_correction",
                        "is false with amsgrad: the fused Adam, the only one without bias "
                        "correction, has no AMSGrad; drop amsgrad or bias_correction");
}

namespace detail {

torch::optim::AdamWParamState& adam_state(torch::optim::Optimizer& optimizer,
                                          const torch::Tensor& p) {
  auto& slot = optimizer.state()[compat::state_key(optimizer, p)];
  if (!slot) {
    auto fresh = std::make_unique<torch::optim::AdamWParamState>();
    fresh->exp_avg(torch::zeros_like(p, torch::MemoryFormat::Contiguous));
    fresh->exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Contiguous));
    slot = std::move(fresh);
  }
  return static_cast<torch::optim::AdamWParamState&>(*slot);
}

}  // namespace detail

namespace {

// Which optimizer a section builds. NOTE: [fused by device] "Adam"/"AdamW" use FusedAdamW
// when asked (torch_adam false), when bias_correction is false (LibTorch's always corrects),
// or, torch_adam unset, when the parameters are on CUDA (one kernel for all parameters, as
// DeepSpeed's FusedAdam); on CPU LibTorch's optimizers stay the default.
enum class Kind { kFused, kAdamW, kAdam, kLamb, kSGD };

Kind kind_of(const OptimizerOptions& options, bool on_cuda) {
  if (options.type() == "Lamb") return Kind::kLamb;
  const bool adam = options.type() == "Adam" || options.type() == "AdamW";
  if (adam && !options.amsgrad() &&
      !options.torch_adam().value_or(!on_cuda && options.bias_correction())) {
    return Kind::kFused;
  }
  // see NOTE: [Adam means AdamW]
  if (options.type() == "AdamW" || (options.type() == "Adam" && options.adam_w_mode())) {
    return Kind::kAdamW;
  }
  if (options.type() == "Adam") return Kind::kAdam;
  TORCH_INTERNAL_ASSERT(options.type() == "SGD", "validate() let optimizer type \"", options.type(),
                        "\" through");
  return Kind::kSGD;
}

// LibTorch's options of that optimizer, from a section's (a group's, merged).
template <typename AdamOrAdamW>
AdamOrAdamW adam_options(const OptimizerOptions& o) {
  return AdamOrAdamW(o.lr())
      .betas(std::make_tuple(o.betas()[0], o.betas()[1]))
      .eps(o.eps())
      .weight_decay(o.weight_decay())
      .amsgrad(o.amsgrad());
}

detail::LambOptions lamb_options(const OptimizerOptions& o) {
  return detail::LambOptions(o.lr())
      .betas(std::make_tuple(o.betas()[0], o.betas()[1]))
      .eps(o.eps())
      .weight_decay(o.weight_decay())
      .bias_correction(o.bias_correction())
      .eps_inside_sqrt(o.eps_inside_sqrt())
      .max_coeff(o.max_coeff())
      .min_coeff(o.min_coeff());
}

torch::optim::SGDOptions sgd_options(const OptimizerOptions& o) {
  return torch::optim::SGDOptions(o.lr())
      .momentum(o.momentum())
      .dampening(o.dampening())
      .weight_decay(o.weight_decay())
      .nesterov(o.nesterov());
}

std::unique_ptr<torch::optim::OptimizerOptions> torch_options(Kind kind,
                                                              const OptimizerOptions& o) {
  switch (kind) {
    case Kind::kFused:
    case Kind::kAdamW:
      return std::make_unique<torch::optim::AdamWOptions>(
          adam_options<torch::optim::AdamWOptions>(o));
    case Kind::kAdam:
      return std::make_unique<torch::optim::AdamOptions>(
          adam_options<torch::optim::AdamOptions>(o));
    case Kind::kLamb:
      return std::make_unique<detail::LambOptions>(lamb_options(o));
    case Kind::kSGD:
      return std::make_unique<torch::optim::SGDOptions>(sgd_options(o));
  }
  TORCH_INTERNAL_ASSERT(false, "unknown optimizer kind");
}

// A group's options: the section's, with the group's own set over them.
OptimizerOptions merged(const OptimizerOptions& section, const ParamGroup& group) {
  OptimizerOptions o = section;
  if (group.lr()) o.lr(*group.lr());
  if (group.weight_decay()) o.weight_decay(*group.weight_decay());
  if (group.betas()) o.betas(*group.betas());
  if (group.eps()) o.eps(*group.eps());
  if (group.momentum()) o.momentum(*group.momentum());
  return o;
}

}  // namespace

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const OptimizerOptions& options,
                                                        std::vector<torch::Tensor> params) {
  return make_optimizer(options, {ParamGroup(std::move(params))});
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const OptimizerOptions& options,
                                                        const std::vector<ParamGroup>& groups) {
  validate(options);
  bool on_cuda = false;
  for (const auto& group : groups) {
    if (!group.params.empty()) {
      on_cuda = group.params.front().is_cuda();
      break;
    }
  }
  const Kind kind = kind_of(options, on_cuda);
  std::vector<torch::optim::OptimizerParamGroup> torch_groups;
  for (size_t g = 0; g < groups.size(); ++g) {
    const OptimizerOptions group_options = merged(options, groups[g]);
    try {
      validate(group_options);
    } catch (const ConfigError& e) {
      throw ConfigError(c10::str("parameter group ", g, ": ", e.what()));
    }
    torch_groups.emplace_back(groups[g].params, torch_options(kind, group_options));
  }
  switch (kind) {
    case Kind::kFused:
      return std::make_unique<FusedAdamW>(
          std::move(torch_groups), adam_options<torch::optim::AdamWOptions>(options),
          FusedAdamWMode()
              .decoupled(options.type() == "AdamW" || options.adam_w_mode())
              .bias_correction(options.bias_correction()));
    case Kind::kAdamW:
      return std::make_unique<torch::optim::AdamW>(
          std::move(torch_groups), adam_options<torch::optim::AdamWOptions>(options));
    case Kind::kAdam:
      return std::make_unique<torch::optim::Adam>(std::move(torch_groups),
                                                  adam_options<torch::optim::AdamOptions>(options));
    case Kind::kLamb:
      return std::make_unique<detail::Lamb>(std::move(torch_groups), lamb_options(options));
    case Kind::kSGD:
      return std::make_unique<torch::optim::SGD>(std::move(torch_groups), sgd_options(options));
  }
  TORCH_INTERNAL_ASSERT(false, "unknown optimizer kind");
}

}  // namespace stepwise
