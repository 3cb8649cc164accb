// stepwise: fused multi-tensor ops, on CPU (ATen ops) or CUDA (stepwise's own kernels).
//
// Usage {.cpp .fragment context="basic"}:
//
//   namespace fused = stepwise::fused;
//   std::vector<torch::Tensor> params = {torch::ones({3})}, grads = {torch::full({3}, 1024.0)};
//   std::vector<torch::Tensor> exp_avg = {torch::zeros({3})}, exp_avg_sq = {torch::zeros({3})};
//   auto found_inf = fused::unscale_and_check(grads, 1.0 / 1024);  // in place; a device flag
//   auto norm = fused::global_norm(grads);                         // fp32 scalar tensor
//   fused::adamw_step({params, grads, exp_avg, exp_avg_sq}, fused::AdamWStep().lr(1e-3),
//                     found_inf);  // nothing changes where found_inf != 0
//
// Each op takes whole lists of tensors, so on CUDA one launch covers many parameters
// (see NOTE: [multi-tensor apply] in src/cuda/multi_tensor_apply.cuh). The backend is
// chosen by the tensors' device: CPU tensors use the ATen implementation (also the
// reference the CUDA kernels are tested against); CUDA tensors use the kernels when
// stepwise was built with them, otherwise the call fails with "built without CUDA
// kernels". Results are returned as tensors on the tensors' device: nothing here
// waits for the device; the caller decides when to bring a value to the host.
#pragma once

#include <torch/arg.h>
#include <torch/types.h>

#include <string>
#include <vector>

namespace stepwise {
namespace fused {

/// Which implementation ran (or would run) for a list of tensors.
enum class Backend { kCpu, kCuda };

/// Whether this build of stepwise contains the CUDA kernels (a CUDA LibTorch was found).
bool cuda_kernels_built();

/// The backend for tensors on `device`; throws std::invalid_argument for CUDA tensors in
/// a build without CUDA kernels and for any other device type.
Backend backend_for(const torch::Device& device);

/// Multiplies every tensor by `inv_scale` in place and returns a float scalar tensor on
/// their device: 1 if any element was inf or nan before scaling, else 0. Empty list: a
/// CPU zero.
torch::Tensor unscale_and_check(const std::vector<torch::Tensor>& tensors, double inv_scale);

/// The L2 norm over all elements of all tensors, accumulated in fp32, as a float scalar
/// tensor on their device (inf or nan if any element is). Empty list: a CPU zero.
torch::Tensor global_norm(const std::vector<torch::Tensor>& tensors);

/// Hyper-parameters of one fused Adam/AdamW step, in LibTorch's options style.
struct AdamWStep {
  /// Sets both betas.
  AdamWStep& betas(double b1, double b2) {
    beta1(b1);
    return beta2(b2);
  }
  /// Learning rate.
  TORCH_ARG(double, lr) = 1e-3;
  /// First-moment decay.
  TORCH_ARG(double, beta1) = 0.9;
  /// Second-moment decay.
  TORCH_ARG(double, beta2) = 0.999;
  /// Added to the denominator.
  TORCH_ARG(double, eps) = 1e-8;
  /// Weight decay (decoupled for AdamW, added to the gradient for Adam).
  TORCH_ARG(double, weight_decay) = 0.0;
  /// AdamW (true, the default) or Adam with L2 weight decay (false).
  TORCH_ARG(bool, decoupled) = true;
  /// The step number after this update: 1 on the first (gives the bias corrections).
  TORCH_ARG(int64_t, step) = 1;
  /// Divide the moments by 1 - beta^step (true), or use them as they are (false: DeepSpeed's
  /// FusedAdam with bias_correction false).
  TORCH_ARG(bool, bias_correction) = true;
  /// Every gradient is multiplied by this first (1/S fuses the fp16 unscale).
  TORCH_ARG(double, grad_scale) = 1.0;
};

/// The tensors one fused Adam/AdamW step reads and writes; lists of equal length whose
/// i-th elements have the same number of elements.
struct AdamWTensors {
  /// fp32 weights (masters), updated in place.
  std::vector<torch::Tensor> params;
  /// Gradients (fp32, fp16 or bf16), read only.
  std::vector<torch::Tensor> grads;
  /// fp32 first moments, updated in place.
  std::vector<torch::Tensor> exp_avg;
  /// fp32 second moments, updated in place.
  std::vector<torch::Tensor> exp_avg_sq;
  /// Optional: model copies (fp32, fp16 or bf16) that receive the new weights.
  std::vector<torch::Tensor> model_copies;
};

/// One Adam/AdamW step over all tensors (torch::optim::AdamW's formulas; Adam's when
/// not decoupled). If `found_inf` is defined and non-zero, nothing is written, and on
/// CUDA that is decided on the device without a host sync.
void adamw_step(const AdamWTensors& tensors, const AdamWStep& step,
                const torch::Tensor& found_inf = {});

}  // namespace fused
}  // namespace stepwise
