// stepwise::fused on CPU: plain ATen ops, one tensor at a time. This is also the
// reference the CUDA kernels are tested against (tests/fused/fused_test.cpp), so it
// follows torch::optim::Adam/AdamW (1.13) operation for operation.
#include "fused_backends.h"

#include <torch/torch.h>

#include <cmath>

namespace stepwise::fused::detail::cpu {

torch::Tensor unscale_and_check(const std::vector<torch::Tensor>& tensors, double inv_scale) {
  torch::NoGradGuard no_grad;
  auto found = torch::zeros({}, tensors.front().options().dtype(torch::kBool));
  for (const auto& t : tensors) {
    if (t.numel() == 0) continue;
    found.logical_or_(torch::isfinite(t).logical_not().any());
    if (inv_scale != 1.0) t.mul_(inv_scale);
  }
  return found.to(torch::kFloat);
}

torch::Tensor global_norm(const std::vector<torch::Tensor>& tensors) {
  torch::NoGradGuard no_grad;
  // fp32 throughout, as the kernel: per-tensor norms, squared and summed.
  auto sum = torch::zeros({}, tensors.front().options().dtype(torch::kFloat));
  for (const auto& t : tensors) {
    if (t.numel() > 0) sum.add_(t.to(torch::kFloat).norm().square());
  }
  return sum.sqrt_();
}

void adamw_step(const AdamWTensors& tensors, const AdamWStep& step,
                const torch::Tensor& found_inf) {
  torch::NoGradGuard no_grad;
  if (found_inf.defined() && found_inf.item<float>() != 0.0f) return;
  const auto correction = [&](double beta) {
    return step.bias_correction() ? 1.0 - std::pow(beta, static_cast<double>(step.step())) : 1.0;
  };
  const double bias1 = correction(step.beta1());
  const double bias2 = correction(step.beta2());
  for (size_t i = 0; i < tensors.params.size(); ++i) {
    const auto& p = tensors.params[i];
    auto grad = tensors.grads[i].to(torch::kFloat);
    if (step.grad_scale() != 1.0) grad = grad.mul(step.grad_scale());
    if (step.weight_decay() != 0.0) {
      if (step.decoupled()) {
        p.mul_(1.0 - step.lr() * step.weight_decay());
      } else {
        grad = grad.add(p, step.weight_decay());
      }
    }
    auto& m = tensors.exp_avg[i];
    auto& v = tensors.exp_avg_sq[i];
    m.mul_(step.beta1()).add_(grad, 1.0 - step.beta1());
    v.mul_(step.beta2()).addcmul_(grad, grad, 1.0 - step.beta2());
    const auto denom = (v.sqrt() / std::sqrt(bias2)).add_(step.eps());
    p.addcdiv_(m, denom, -step.lr() / bias1);
    if (!tensors.model_copies.empty()) tensors.model_copies[i].copy_(p);
  }
}

}  // namespace stepwise::fused::detail::cpu
