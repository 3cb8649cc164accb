// A build without the CUDA kernels (no CUDA-enabled LibTorch was found): a clear error.
#include <stepwise/errors.h>

#include "fused_backends.h"

#include <stdexcept>

namespace stepwise::fused::detail::cuda {

namespace {
[[noreturn]] void fail(const char* op) {
  throw std::invalid_argument(std::string("stepwise::fused::") + op +
                              ": the tensors are on CUDA, but stepwise was built without CUDA "
                              "kernels; configure against a CUDA LibTorch (CMAKE_PREFIX_PATH, "
                              "see docs/cuda.md)");
}
}  // namespace

bool built() { return false; }
torch::Tensor unscale_and_check(const std::vector<torch::Tensor>&, double) {
  fail("unscale_and_check");
}
torch::Tensor global_norm(const std::vector<torch::Tensor>&) { fail("global_norm"); }
void adamw_step(const AdamWTensors&, const AdamWStep&, const torch::Tensor&) { fail("adamw_step"); }

}  // namespace stepwise::fused::detail::cuda
