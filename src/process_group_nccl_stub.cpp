// Without NCCL (a CPU LibTorch, or no nccl.h): a clear error naming why, from CMake.
#include <stepwise/distributed.h>

#include "distributed_backends.h"
#include "nccl_missing.h"  // STEPWISE_NCCL_MISSING, written by CMakeLists.txt

namespace stepwise::distributed::detail {

c10::intrusive_ptr<Group> make_nccl_process_group(const c10::intrusive_ptr<c10d::Store>&, int64_t,
                                                  int64_t, std::chrono::milliseconds) {
  throw DistributedError("the NCCL backend was requested, but stepwise was " STEPWISE_NCCL_MISSING
                         "; use Backend::kGloo, or rebuild with NCCL");
}

}  // namespace stepwise::distributed::detail
