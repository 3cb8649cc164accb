// DeviceScope with a CPU-only LibTorch: no CUDA tensor can exist, so no kernel is ever
// launched through it; this file lets the CUDA glue compile (and be checked) anyway.
#include "torch_stream.h"

#include <stdexcept>

namespace stepwise::fused::detail::cuda {

struct DeviceScope::Impl {};

DeviceScope::DeviceScope(const torch::Device& device) {
  throw std::invalid_argument(
      "stepwise::fused: a CUDA tensor on " + device.str() +
      " reached a LibTorch without CUDA; configure against a CUDA LibTorch (see docs/cuda.md)");
}
DeviceScope::~DeviceScope() = default;

void* DeviceScope::stream() const { return nullptr; }

}  // namespace stepwise::fused::detail::cuda
