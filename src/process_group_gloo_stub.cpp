// Without Gloo's headers (PyTorch's wheels ship none): a clear error instead.
#include "distributed_backends.h"

namespace stepwise::distributed::detail {

c10::intrusive_ptr<Group> make_gloo_process_group(const c10::intrusive_ptr<c10d::Store>&, int64_t,
                                                  int64_t, const std::string&,
                                                  std::chrono::milliseconds) {
  throw DistributedError(
      "the Gloo backend was requested, but stepwise was built without Gloo (gloo/algorithm.h "
      "was not found next to this LibTorch's headers; set STEPWISE_GLOO_INCLUDE_DIR to a Gloo "
      "checkout of the same version and reconfigure)");
}

}  // namespace stepwise::distributed::detail
