#include "lamb.h"

#include <stepwise/errors.h>

#include <torch/optim/serialize.h>
#include <torch/torch.h>

#include "check.h"
#include "optimizers_detail.h"

#include <cmath>

namespace stepwise::detail {

void LambOptions::serialize(torch::serialize::OutputArchive& archive) const {
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(lr);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(betas);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(eps);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(weight_decay);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(bias_correction);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(eps_inside_sqrt);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(max_coeff);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(min_coeff);
}

void LambOptions::serialize(torch::serialize::InputArchive& archive) {
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, lr);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(Betas, betas);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, eps);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, weight_decay);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(bool, bias_correction);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(bool, eps_inside_sqrt);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, max_coeff);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, min_coeff);
}

Lamb::Lamb(std::vector<torch::optim::OptimizerParamGroup> groups, LambOptions defaults)
    : torch::optim::Optimizer(std::move(groups), std::make_unique<LambOptions>(defaults)) {}

torch::Tensor Lamb::step(LossClosure closure) {
  torch::NoGradGuard no_grad;
  torch::Tensor loss;
  if (closure) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  for (auto& group : param_groups_) {
    const auto& o = static_cast<const LambOptions&>(group.options());
    const auto [beta1, beta2] = o.betas();
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      const auto& grad = p.grad();
      STEPWISE_CHECK(!grad.is_sparse(), std::invalid_argument,
                     "Lamb does not support sparse gradients, as DeepSpeed's FusedLamb");
      auto& state = adam_state(*this, p);
      state.step(state.step() + 1);
      auto& m = state.exp_avg();
      auto& v = state.exp_avg_sq();
      m.mul_(beta1).add_(grad, 1.0 - beta1);
      v.mul_(beta2).addcmul_(grad, grad, 1.0 - beta2);
      const auto denom = o.eps_inside_sqrt() ? (v + o.eps()).sqrt_() : v.sqrt().add_(o.eps());
      auto update = m / denom;
      if (o.weight_decay() != 0.0) update.add_(p, o.weight_decay());
      // The trust ratio, on the device (no host sync): capped, then floored, as the kernel.
      const auto w_norm = p.norm();
      const auto u_norm = update.norm();
      const auto ratio = (w_norm / u_norm).clamp_max(o.max_coeff()).clamp_min(o.min_coeff());
      const auto coeff =
          torch::where((w_norm != 0) & (u_norm != 0), ratio, torch::ones_like(ratio));
      const double t = static_cast<double>(state.step());
      const double step_size = o.bias_correction() ? o.lr() * std::sqrt(1.0 - std::pow(beta2, t)) /
                                                         (1.0 - std::pow(beta1, t))
                                                   : o.lr();
      p.sub_(update.mul_(coeff), step_size);
    }
  }
  return loss;
}

void Lamb::save(torch::serialize::OutputArchive& archive) const {
  torch::optim::serialize<torch::optim::AdamWParamState, LambOptions>(archive, *this);
}

void Lamb::load(torch::serialize::InputArchive& archive) {
  torch::optim::serialize<torch::optim::AdamWParamState, LambOptions>(archive, *this);
}

}  // namespace stepwise::detail
