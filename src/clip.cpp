#include <stepwise/clip.h>
#include "fused.h"

#include <torch/torch.h>

namespace stepwise {

namespace {
std::vector<torch::Tensor> grads_of(const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> grads;
  for (const auto& p : params) {
    if (p.grad().defined()) grads.push_back(p.grad());
  }
  return grads;
}
}  // namespace

double global_grad_norm(const std::vector<torch::Tensor>& params) {
  // One fused norm over all gradients (fp32 accumulation), one host sync. An inf or
  // nan anywhere makes it inf or nan.
  return fused::global_norm(grads_of(params)).item<double>();
}

double clip_coefficient(double norm, double max_norm) {
  // DeepSpeed's rule: coef = max_norm / (norm + 1e-6), applied when below 1.
  const double coef = max_norm > 0.0 ? max_norm / (norm + 1e-6) : 1.0;
  return coef < 1.0 ? coef : 1.0;
}

void clip_grads_with_norm(const std::vector<torch::Tensor>& params, double norm, double max_norm) {
  torch::NoGradGuard no_grad;
  const double coef = clip_coefficient(norm, max_norm);
  // The fused unscale is a multi-tensor multiply; its inf/nan flag is not needed here.
  if (coef < 1.0) fused::unscale_and_check(grads_of(params), coef);
}

double clip_grad_norm(const std::vector<torch::Tensor>& params, double max_norm) {
  const double norm = global_grad_norm(params);
  clip_grads_with_norm(params, norm, max_norm);
  return norm;
}

}  // namespace stepwise
