#include <stepwise/errors.h>
#include <stepwise/precision.h>

#include "check.h"
#include "fused.h"
#include "precision_policy.h"

#include <torch/torch.h>

#include <cmath>

namespace stepwise {

Precision::Precision(const PrecisionOptions& options, torch::nn::Module& model)
    : mode_(options.mode()) {
  if (mode_ != PrecisionMode::kFp32) {
    // Floating-point tensors only, as PyTorch's module.half() does: Module::to(dtype)
    // would also turn integer buffers (BatchNorm's num_batches_tracked) into half.
    const auto dtype = mode_ == PrecisionMode::kFp16 ? torch::kHalf : torch::kBFloat16;
    torch::NoGradGuard no_grad;
    for (auto& p : model.parameters()) {
      if (p.is_floating_point()) p.set_data(p.to(dtype));
    }
    for (auto& b : model.buffers()) {
      if (b.is_floating_point()) b.set_data(b.to(dtype));
    }
  }
  for (auto& p : model.parameters()) {
    if (p.requires_grad()) model_.push_back(p);
  }
  STEPWISE_CHECK(!model_.empty(), ConfigError,
                 "the model has no parameters that require grad; nothing to train");
  if (mode_ == PrecisionMode::kFp32) {
    master_ = model_;
  } else {
    torch::NoGradGuard no_grad;
    for (const auto& p : model_) {
      master_.push_back(p.detach().to(torch::kFloat).clone().requires_grad_(true));
    }
  }
  if (mode_ == PrecisionMode::kFp16) scaler_.emplace(options.loss_scaler());
}

torch::Tensor Precision::scale_loss(const torch::Tensor& loss) const {
  // In fp32: (loss / GAS) * S could overflow half before the cast.
  auto fp32 = loss.to(torch::kFloat);
  return scaler_ ? fp32 * scaler_->scale() : fp32;
}

GradientStats Precision::unscale_and_check(double factor) {
  torch::NoGradGuard no_grad;
  const double coef = grad_scale(factor);
  std::vector<torch::Tensor> grads;  // the optimizer's (fp32) gradients
  for (size_t i = 0; i < model_.size(); ++i) {
    const auto& g = model_[i].grad();
    if (!g.defined()) continue;
    if (!master_[i].is_same(model_[i])) master_[i].mutable_grad() = g.to(torch::kFloat);
    grads.push_back(master_[i].grad());
  }
  // NOTE: [one sync per step] unscale + inf/nan flag, then the norm, both fused over
  // all tensors and left on the device; one transfer brings both to the host. A norm
  // that overflows fp32 from finite gradients also counts as an fp16 overflow. fp32
  // and bf16 at a full boundary (coef 1) need neither the multiply nor the flag.
  torch::Tensor found_inf;
  if (mode_ == PrecisionMode::kFp16 || coef != 1.0) {
    found_inf = fused::unscale_and_check(grads, coef);
  }
  const auto norm = fused::global_norm(grads).reshape({1});
  const auto host =
      (found_inf.defined() ? torch::cat({norm, found_inf.reshape({1})}) : norm).to(torch::kCPU);
  GradientStats stats;
  stats.norm = host[0].item<double>();
  stats.overflow = mode_ == PrecisionMode::kFp16 &&
                   (host[1].item<float>() != 0.0f || !std::isfinite(stats.norm));
  return stats;
}

// NOTE: [folded unscale] With FusedAdamW, a boundary reads the gradients twice: once
// for the norm and the overflow flag together (an inf or nan anywhere makes the norm
// non-finite), then in the update, which multiplies them by factor / S times the clip
// coefficient. The unscale, the clip multiply and the fp32 copy of half gradients are
// not separate passes. With a power-of-two S and factor 1 the results are bitwise those
// of unscale-then-clip: scaling by 2^-k is exact, so the norm of the scaled gradients
// times 2^-k is the norm of the unscaled ones, and g * (2^-k c) rounds as (g 2^-k) c.
GradientStats Precision::check_unscaled(double factor) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> grads;  // the model's gradients, as backward() left them
  for (size_t i = 0; i < model_.size(); ++i) {
    const auto& g = model_[i].grad();
    if (!g.defined()) continue;
    // The optimizer reads the half/bf16 gradient itself (its kernels take any dtype).
    if (!master_[i].is_same(model_[i])) master_[i].mutable_grad() = g;
    grads.push_back(g);
  }
  const double scaled = fused::global_norm(grads).item<double>();  // the one host sync
  GradientStats stats;
  stats.norm = scaled * grad_scale(factor);
  stats.overflow = mode_ == PrecisionMode::kFp16 && !std::isfinite(stats.norm);
  return stats;
}

void Precision::check_optimizer_source(bool client_optimizer) const {
  STEPWISE_CHECK(!client_optimizer || mode_ == PrecisionMode::kFp32, ConfigError,
                 "a client optimizer cannot be combined with ",
                 (mode_ == PrecisionMode::kFp16 ? "fp16" : "bf16"),
                 ".enabled: the engine must build the optimizer over its fp32 master weights; "
                 "use the config's \"optimizer\" section instead");
}

void Precision::attach(torch::optim::Optimizer& optimizer) {
  // NOTE: [fused write-back] an optimizer that WritesModelCopies (a FusedAdamW) writes
  // the rounded new weights into the half/bf16 model in the same pass as the update;
  // copy_to_model() then has nothing left to do.
  auto* writer = dynamic_cast<WritesModelCopies*>(&optimizer);
  if (mode_ == PrecisionMode::kFp32 || writer == nullptr) return;
  std::vector<torch::Tensor> copies;
  for (const auto& p : model_) copies.push_back(p.detach());
  writer->set_model_copies(std::move(copies));
  writes_back_ = true;
}

void Precision::copy_to_model() {
  if (mode_ == PrecisionMode::kFp32 || writes_back_) return;
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < model_.size(); ++i) {
    model_[i].detach().copy_(master_[i].detach());
  }
}

void Precision::zero_grads() {
  for (size_t i = 0; i < model_.size(); ++i) {
    model_[i].mutable_grad() = torch::Tensor();
    master_[i].mutable_grad() = torch::Tensor();
  }
}

void Precision::finish_boundary(bool overflow) {
  if (scaler_) scaler_->update(overflow);
}

}  // namespace stepwise
