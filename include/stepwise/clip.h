// stepwise: the global L2 norm of gradients and clipping by it.
//
// Usage {.cpp .fragment context="engine"}:
//
//   loss_of(0).backward();
//   double norm = stepwise::clip_grad_norm(model->parameters(), /*max_norm=*/1.0);
//   // gradients were multiplied by 1.0 / (norm + 1e-6) if norm > 1.0
//
// One host sync per call (the norm), not one per parameter.
#pragma once

#include <torch/types.h>

#include <vector>

namespace stepwise {

/// L2 norm over all defined gradients of `params`, accumulated in fp32 by
/// stepwise::fused::global_norm (one multi-tensor kernel on CUDA), with one host sync. Returns 0
/// when no parameter has a gradient; inf or nan when a gradient holds inf or nan.
double global_grad_norm(const std::vector<torch::Tensor>& params);

/// Computes the global norm and, if `max_norm` > 0, multiplies every gradient
/// by coef = max_norm / (norm + 1e-6) when coef < 1 (DeepSpeed's rule).
/// Returns the norm before clipping.
double clip_grad_norm(const std::vector<torch::Tensor>& params, double max_norm);

/// DeepSpeed's clip coefficient: max_norm / (norm + 1e-6) when that is below 1 and
/// `max_norm` > 0, else 1 (what the gradients are multiplied by).
double clip_coefficient(double norm, double max_norm);

/// Clipping with a norm already computed (the engine gets it together with the
/// overflow flag): multiplies every gradient by max_norm / (norm + 1e-6) when
/// that is below 1 and `max_norm` > 0.
void clip_grads_with_norm(const std::vector<torch::Tensor>& params, double norm, double max_norm);

}  // namespace stepwise
