// Gloo process groups; compiled with USE_C10D_GLOO (see CMakeLists.txt).
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include "distributed_backends.h"

namespace stepwise::distributed::detail {

c10::intrusive_ptr<Group> make_gloo_process_group(const c10::intrusive_ptr<c10d::Store>& store,
                                                  int64_t rank, int64_t world_size,
                                                  const std::string& master_addr,
                                                  std::chrono::milliseconds timeout) {
  auto options = c10d::ProcessGroupGloo::Options::create(timeout);
  // NOTE: [gloo device] createDefaultDevice binds to the address the host name
  // resolves to, which in containers can be unreachable; a loopback rendezvous
  // means all ranks are on this machine, so bind to loopback.
  const bool loopback = master_addr == "127.0.0.1" || master_addr == "localhost";
  options->devices.push_back(loopback ? c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1")
                                      : c10d::ProcessGroupGloo::createDefaultDevice());
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, static_cast<int>(rank),
                                                     static_cast<int>(world_size), options);
}

}  // namespace stepwise::distributed::detail
