// Lamb as DeepSpeed's FusedLamb computes it (csrc/lamb/fused_lamb_cuda_kernel.cu), over any
// device with ATen ops: what the config's "type": "Lamb" builds (make_optimizer).
#pragma once

#include <torch/arg.h>
#include <torch/optim/adamw.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>

#include <tuple>
#include <vector>

namespace stepwise::detail {

/// FusedLamb's options, with its defaults.
struct LambOptions : torch::optim::OptimizerCloneableOptions<LambOptions> {
  using Betas = std::tuple<double, double>;
  explicit LambOptions(double lr = 1e-3) : lr_(lr) {}
  void serialize(torch::serialize::OutputArchive& archive) const override;
  void serialize(torch::serialize::InputArchive& archive) override;
  double get_lr() const override { return lr(); }
  void set_lr(const double lr) override { this->lr(lr); }

  TORCH_ARG(double, lr);
  TORCH_ARG(Betas, betas) = std::make_tuple(0.9, 0.999);
  TORCH_ARG(double, eps) = 1e-8;
  /// Added to the update (times the weight), before the trust ratio is taken.
  TORCH_ARG(double, weight_decay) = 0.0;
  /// The step size lr * sqrt(1 - beta2^t) / (1 - beta1^t) (true) or lr (false).
  TORCH_ARG(bool, bias_correction) = true;
  /// sqrt(v + eps) (true) or sqrt(v) + eps (false).
  TORCH_ARG(bool, eps_inside_sqrt) = false;
  /// The trust ratio ||w|| / ||update|| is capped at max_coeff, then floored at min_coeff.
  TORCH_ARG(double, max_coeff) = 10.0;
  TORCH_ARG(double, min_coeff) = 0.01;
};

/// Lamb over parameter groups; each parameter's state is torch::optim::AdamWParamState
/// (step, exp_avg, exp_avg_sq).
class Lamb : public torch::optim::Optimizer {
 public:
  Lamb(std::vector<torch::optim::OptimizerParamGroup> groups, LambOptions defaults);
  /// One update of every parameter with a gradient, tensor by tensor: m and v as Adam's,
  /// update = m / denom + weight_decay * w, and w -= step_size * clamp(||w|| / ||update||)
  /// * update (the ratio 1 when either norm is 0).
  torch::Tensor step(LossClosure closure = nullptr) override;
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;
};

}  // namespace stepwise::detail
