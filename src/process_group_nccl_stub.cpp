// Without a CUDA-enabled LibTorch there is no NCCL: a clear error instead.
#include <stepwise/distributed.h>

#include "distributed_backends.h"

namespace stepwise::distributed::detail {

c10::intrusive_ptr<c10d::ProcessGroup> make_nccl_process_group(
    const c10::intrusive_ptr<c10d::Store>&, int64_t, int64_t, std::chrono::milliseconds) {
  throw DistributedError(
      "the NCCL backend was requested, but stepwise was built without CUDA (no CUDA-enabled "
      "LibTorch was found); use Backend::kGloo, or rebuild with CMAKE_PREFIX_PATH pointing at a "
      "CUDA LibTorch");
}

}  // namespace stepwise::distributed::detail
