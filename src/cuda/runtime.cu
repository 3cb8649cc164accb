// device_available and check_launch.
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "kernels.h"

namespace stepwise::cuda {
namespace {

// Built like every kernel of the library; if the device cannot run it (no image for
// its architecture), none of them can.
__global__ void probe_kernel() {}

std::string describe(cudaError_t error) {
  return std::string(cudaGetErrorName(error)) + ": " + cudaGetErrorString(error);
}

}  // namespace

bool device_available(std::string* why) {
  int count = 0;
  cudaError_t error = cudaGetDeviceCount(&count);
  if (error == cudaSuccess && count == 0) error = cudaErrorNoDevice;
  if (error == cudaSuccess) {
    cudaFuncAttributes attributes{};
    error = cudaFuncGetAttributes(&attributes, probe_kernel);
  }
  if (error != cudaSuccess) {
    (void)cudaGetLastError();  // don't let check_launch report this later
    if (why != nullptr) *why = describe(error);
    return false;
  }
  return true;
}

void check_launch(const char* what) {
  const cudaError_t error = cudaGetLastError();
  if (error != cudaSuccess) {
    throw std::runtime_error(std::string("stepwise::cuda::") + what +
                             ": kernel launch failed: " + describe(error));
  }
}

}  // namespace stepwise::cuda
