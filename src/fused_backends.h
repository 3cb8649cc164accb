// The two implementations behind stepwise::fused (src/fused.h): ATen ops
// (src/fused_cpu.cpp) and stepwise's CUDA kernels (src/cuda/fused_cuda.cpp, or
// src/fused_cuda_stub.cpp in a build without them; chosen in CMake). Arguments arrive
// checked by src/fused.cpp: same device, equal list lengths and sizes, contiguous.
#pragma once

#include "fused.h"

namespace stepwise::fused::detail {

/// The ATen implementation; the reference the CUDA kernels are tested against.
namespace cpu {
torch::Tensor unscale_and_check(const std::vector<torch::Tensor>& tensors, double inv_scale);
torch::Tensor global_norm(const std::vector<torch::Tensor>& tensors);
void adamw_step(const AdamWTensors& tensors, const AdamWStep& step, const torch::Tensor& found_inf);
}  // namespace cpu

/// The CUDA kernels (src/cuda/kernels.h) on LibTorch tensors.
namespace cuda {
/// Whether this build has them (false: every function below throws "built without").
bool built();
torch::Tensor unscale_and_check(const std::vector<torch::Tensor>& tensors, double inv_scale);
torch::Tensor global_norm(const std::vector<torch::Tensor>& tensors);
void adamw_step(const AdamWTensors& tensors, const AdamWStep& step, const torch::Tensor& found_inf);
}  // namespace cuda

}  // namespace stepwise::fused::detail
