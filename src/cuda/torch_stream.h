// The CUDA stream and device the kernels must use for LibTorch tensors: LibTorch's
// current stream on the tensors' device. Defined in torch_stream_cuda.cpp with a
// CUDA LibTorch, and in torch_stream_none.cpp otherwise (CMake picks one).
#pragma once

#include <torch/types.h>

#include <memory>

namespace stepwise::fused::detail::cuda {

/// Makes `device` current for its lifetime (like c10::cuda::CUDAGuard).
class DeviceScope {
 public:
  /// Switches to `device`; restores the previous device on destruction.
  explicit DeviceScope(const torch::Device& device);
  ~DeviceScope();
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

  /// LibTorch's current stream on that device, as a cudaStream_t.
  void* stream() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace stepwise::fused::detail::cuda
