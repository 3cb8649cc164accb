#include <stepwise/clip.h>
#include <stepwise/errors.h>
#include <stepwise/precision.h>

#include <torch/torch.h>

#include <cmath>

namespace stepwise {

namespace {

PrecisionMode mode_of(const Config& config) {
  if (config.fp16.enabled) return PrecisionMode::kFp16;
  if (config.bf16.enabled) return PrecisionMode::kBf16;
  return PrecisionMode::kFp32;
}

}  // namespace

Precision::Precision(const Config& config, torch::nn::Module& model) : mode_(mode_of(config)) {
  if (mode_ != PrecisionMode::kFp32) {
    model.to(mode_ == PrecisionMode::kFp16 ? torch::kHalf : torch::kBFloat16);
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
  if (mode_ == PrecisionMode::kFp16) scaler_ = LossScaler::from_config(config.fp16);
}

torch::Tensor Precision::scale_loss(const torch::Tensor& loss) const {
  // In fp32: (loss / GAS) * S could overflow half before the cast.
  auto fp32 = loss.to(torch::kFloat);
  return scaler_ ? fp32 * scaler_->scale() : fp32;
}

GradientStats Precision::unscale_and_check(double factor) {
  torch::NoGradGuard no_grad;
  const double coef = factor / loss_scale();
  for (size_t i = 0; i < model_.size(); ++i) {
    const auto& g = model_[i].grad();
    if (!g.defined()) continue;
    if (master_[i].is_same(model_[i])) {
      if (coef != 1.0) g.mul_(coef);
    } else {
      master_[i].mutable_grad() = g.to(torch::kFloat).mul_(coef);
    }
  }
  // NOTE: [one sync per step] the norm is the only value brought to the host; an inf or
  // nan in any gradient makes it non-finite, which is the fp16 overflow flag.
  GradientStats stats;
  stats.norm = global_grad_norm(master_);
  stats.overflow = mode_ == PrecisionMode::kFp16 && !std::isfinite(stats.norm);
  return stats;
}

void Precision::copy_to_model() {
  if (mode_ == PrecisionMode::kFp32) return;
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
