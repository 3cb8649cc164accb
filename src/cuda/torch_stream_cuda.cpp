// DeviceScope with a CUDA LibTorch: c10's device guard and current stream.
#include "torch_stream.h"

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

namespace stepwise::fused::detail::cuda {

struct DeviceScope::Impl {
  explicit Impl(const torch::Device& device) : guard(device) {}
  c10::cuda::CUDAGuard guard;
};

DeviceScope::DeviceScope(const torch::Device& device) : impl_(std::make_unique<Impl>(device)) {}
DeviceScope::~DeviceScope() = default;

void* DeviceScope::stream() const { return c10::cuda::getCurrentCUDAStream().stream(); }

}  // namespace stepwise::fused::detail::cuda
