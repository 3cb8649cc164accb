// stepwise: optimizers from the config's "optimizer" section.
//
// Usage {.cpp .fragment context="engine"}:
//
//   stepwise::OptimizerConfig opt;
//   opt.type = "Adam";  // decoupled weight decay unless adam_w_mode = false
//   opt.lr = 1e-3;
//   auto optimizer = stepwise::make_optimizer(opt, model->parameters());
//
// "Adam" -> AdamW (or Adam with adam_w_mode = false), "AdamW" -> AdamW, "SGD" ->
// torch::optim::SGD. Adam/AdamW are stepwise::FusedAdamW (one fused update for all
// parameters) when the parameters are on CUDA or optimizer.params.torch_adam is false,
// and LibTorch's torch::optim::AdamW/Adam otherwise (CPU default, torch_adam true, or
// amsgrad). see NOTE: [Adam means AdamW], NOTE: [fused by device]
#pragma once

#include <stepwise/config.h>

#include <torch/optim/optimizer.h>

#include <memory>
#include <string>
#include <vector>

namespace stepwise {

/// The optimizer types make_optimizer accepts, as spelled in the config.
const std::vector<std::string>& supported_optimizer_types();

/// Throws ConfigError naming the option (`type`, `lr`, `betas`, ...), its value and
/// what would be valid, for an unknown type or a value out of range. Lrs, weight
/// decay and momentum are finite, >= 0 and fit a float; betas are in [0, 1).
void validate(const OptimizerConfig& config);

/// Builds the optimizer `config` describes over `params`, after validate(config).
std::unique_ptr<torch::optim::Optimizer> make_optimizer(const OptimizerConfig& config,
                                                        std::vector<torch::Tensor> params);

}  // namespace stepwise
