#include <stepwise/clip.h>

#include <torch/torch.h>

namespace stepwise {

namespace {
// Sum of squares of every defined gradient, as one 0-dim tensor (no host sync).
torch::Tensor squared_norm(const std::vector<torch::Tensor>& params) {
  torch::Tensor total;
  for (const auto& p : params) {
    const auto& g = p.grad();
    if (!g.defined()) continue;
    auto g32 = g.scalar_type() == torch::kDouble ? g : g.to(torch::kFloat);
    auto sq = g32.pow(2).sum();
    total = total.defined() ? total + sq : sq;
  }
  return total;
}
}  // namespace

double global_grad_norm(const std::vector<torch::Tensor>& params) {
  torch::NoGradGuard no_grad;
  auto sq = squared_norm(params);
  return sq.defined() ? std::sqrt(sq.item<double>()) : 0.0;
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
