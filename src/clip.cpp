#include <stepwise/clip.h>

#include <torch/torch.h>

namespace stepwise {

double global_grad_norm(const std::vector<torch::Tensor>& params) {
  torch::NoGradGuard no_grad;
  // Per-tensor norms stay on the device; one host sync for their norm (as
  // torch::nn::utils::clip_grad_norm_). An inf or nan anywhere makes it inf or nan.
  std::vector<torch::Tensor> norms;
  for (const auto& p : params) {
    if (p.grad().defined()) norms.push_back(p.grad().norm(2).to(torch::kDouble));
  }
  return norms.empty() ? 0.0 : torch::stack(norms).norm(2).item<double>();
}

void clip_grads_with_norm(const std::vector<torch::Tensor>& params, double norm, double max_norm) {
  torch::NoGradGuard no_grad;
  // DeepSpeed's rule: coef = max_norm / (norm + 1e-6), applied when below 1.
  const double coef = max_norm > 0.0 ? max_norm / (norm + 1e-6) : 1.0;
  if (coef < 1.0) {
    for (const auto& p : params) {
      if (p.grad().defined()) p.grad().mul_(coef);
    }
  }
}

double clip_grad_norm(const std::vector<torch::Tensor>& params, double max_norm) {
  const double norm = global_grad_norm(params);
  clip_grads_with_norm(params, norm, max_norm);
  return norm;
}

}  // namespace stepwise
