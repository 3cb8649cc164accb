// NCCL process groups; built only with a CUDA-enabled LibTorch (USE_C10D_NCCL).
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

#include "../distributed_backends.h"

namespace stepwise::distributed::detail {

c10::intrusive_ptr<Group> make_nccl_process_group(const c10::intrusive_ptr<c10d::Store>& store,
                                                  int64_t rank, int64_t world_size,
                                                  std::chrono::milliseconds timeout) {
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = timeout;
  return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, static_cast<int>(rank),
                                                     static_cast<int>(world_size), options);
}

}  // namespace stepwise::distributed::detail
