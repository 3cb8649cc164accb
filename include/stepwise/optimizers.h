// stepwise: the optimizers DeepSpeed's "optimizer" section names, from their options.
//
// Usage {.cpp .fragment context="engine"}:
//
//   auto optimizer = stepwise::make_optimizer(
//       stepwise::OptimizerOptions("Adam").lr(1e-3),  // decoupled weight decay: AdamW
//       model->parameters());
//
// "Adam" -> AdamW (or Adam with adam_w_mode(false)), "AdamW" -> AdamW, "SGD" ->
// torch::optim::SGD, "Lamb" -> Lamb as DeepSpeed's FusedLamb computes it (on any device).
// Adam/AdamW are stepwise::FusedAdamW (one fused update for all parameters) when the
// parameters are on CUDA, torch_adam is false or bias_correction is false, and LibTorch's
// torch::optim::AdamW/Adam otherwise (CPU default, torch_adam true, or amsgrad).
// see NOTE: [Adam means AdamW], NOTE: [fused by device]
#pragma once

#include <torch/arg.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <array>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace stepwise {

/// Options of make_optimizer: DeepSpeed's `"optimizer"` section (`type` and `params`).
/// NOTE: [Adam means AdamW] As in DeepSpeed, `"type": "Adam"` applies weight decay
/// decoupled (AdamW) unless adam_w_mode is false.
struct OptimizerOptions {
  /// Adam/AdamW (beta1, beta2).
  using Betas = std::array<double, 2>;
  /// An optimizer of `type`: "Adam", "AdamW", "Lamb" or "SGD".
  explicit OptimizerOptions(std::string type = "AdamW") : type_(std::move(type)) {}
  /// The type name as in DeepSpeed's config.
  TORCH_ARG(std::string, type);
  /// Learning rate.
  TORCH_ARG(double, lr) = 1e-3;
  /// Adam/AdamW (beta1, beta2), each in [0, 1).
  TORCH_ARG(Betas, betas) = Betas{0.9, 0.999};
  /// Adam/AdamW term added to the denominator.
  TORCH_ARG(double, eps) = 1e-8;
  /// Weight decay; decoupled for AdamW, and for Adam unless adam_w_mode is false.
  TORCH_ARG(double, weight_decay) = 0.0;
  /// Adam only: true (default) means decoupled weight decay, i.e. AdamW.
  TORCH_ARG(bool, adam_w_mode) = true;
  /// Adam/AdamW: the AMSGrad variant.
  TORCH_ARG(bool, amsgrad) = false;
  /// Adam/AdamW: true = LibTorch's torch::optim::Adam/AdamW, false = stepwise's
  /// FusedAdamW (fused_adamw.h); unset = fused when the parameters are on CUDA, or when
  /// bias_correction is false.
  TORCH_ARG(std::optional<bool>, torch_adam) = std::nullopt;
  /// Adam/AdamW: divide the moments by 1 - beta^step (true), or use them as they are
  /// (false: DeepSpeed's FusedAdam with `bias_correction` false, on every device, through
  /// FusedAdamW; LibTorch's optimizers have no such option).
  TORCH_ARG(bool, bias_correction) = true;
  /// Lamb: sqrt(v + eps) (true) or sqrt(v) + eps (false), as DeepSpeed's FusedLamb.
  TORCH_ARG(bool, eps_inside_sqrt) = false;
  /// Lamb: the trust ratio ||w|| / ||update|| is capped at max_coeff...
  TORCH_ARG(double, max_coeff) = 10.0;
  /// ...then floored at min_coeff, as DeepSpeed's FusedLamb.
  TORCH_ARG(double, min_coeff) = 0.01;
  /// SGD momentum.
  TORCH_ARG(double, momentum) = 0.0;
  /// SGD dampening.
  TORCH_ARG(double, dampening) = 0.0;
  /// SGD Nesterov momentum.
  TORCH_ARG(bool, nesterov) = false;
};

/// Throws ConfigError naming the option (`type`, `lr`, `betas`, ...), its value and
/// what would be valid, for an unknown type or a value out of range. Lrs, weight
/// decay and momentum are finite, >= 0 and fit a float; betas are in [0, 1).
void validate(const OptimizerOptions& options);

/// Builds the optimizer `options` describes over `params`, after validate(options).
std::unique_ptr<torch::optim::Optimizer> make_optimizer(const OptimizerOptions& options,
                                                        std::vector<torch::Tensor> params);

/// One parameter group: its parameters and the options it sets over the optimizer's
/// (DeepSpeed's `model_parameters` as a list of dicts, `{"params": [...],
/// "weight_decay": 0.0}`). An unset option is the optimizer section's.
struct ParamGroup {
  /// A group of `params`, with the section's options until one is set.
  explicit ParamGroup(std::vector<torch::Tensor> params = {}) : params(std::move(params)) {}
  /// The group's parameters.
  std::vector<torch::Tensor> params;
  /// The group's learning rate. A config schedule sets every group's lr to the
  /// schedule's, as DeepSpeed's schedules do.
  TORCH_ARG(std::optional<double>, lr) = std::nullopt;
  /// The group's weight decay (0: the group does not decay).
  TORCH_ARG(std::optional<double>, weight_decay) = std::nullopt;
  /// Adam/AdamW: the group's (beta1, beta2).
  TORCH_ARG(std::optional<OptimizerOptions::Betas>, betas) = std::nullopt;
  /// Adam/AdamW: the group's eps.
  TORCH_ARG(std::optional<double>, eps) = std::nullopt;
  /// SGD: the group's momentum.
  TORCH_ARG(std::optional<double>, momentum) = std::nullopt;
};

/// Builds the optimizer `options` describes with one LibTorch parameter group per
/// group, each with `options` and the group's own options set over them. Throws
/// ConfigError naming the group and the option for a value out of range (validate()).
std::unique_ptr<torch::optim::Optimizer> make_optimizer(const OptimizerOptions& options,
                                                        const std::vector<ParamGroup>& groups);

/// The usual split for weight decay (transformers' Trainer makes the same): the
/// parameters that decay, with the optimizer's weight_decay, and then those that do not
/// (weight_decay 0): every bias (a parameter named "bias") and every parameter of a
/// normalization module. A module is one when its class name, without namespace and
/// "Impl", ends in "Norm" or "Norm1d" to "Norm3d" in any case (LibTorch's LayerNorm,
/// GroupNorm, BatchNorm and InstanceNorm; your RMSNorm), or when its name in its parent
/// is "norm", ends in "_norm" or contains "layernorm" or "rmsnorm" (transformers' rule).
/// Embeddings decay. Parameters that do not require grad are left out, and so is a group
/// that would be empty.
std::vector<ParamGroup> weight_decay_groups(const torch::nn::Module& model);

}  // namespace stepwise
