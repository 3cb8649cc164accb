// Private: creates the c10d process group of a backend. Which backends exist is
// decided in CMake (Gloo where its headers are, NCCL with a CUDA LibTorch and nccl.h;
// stubs say why otherwise), not by #ifdef here.
#pragma once

#include <stepwise/distributed.h>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "torch_compat.h"

namespace stepwise::distributed::detail {

/// The Gloo/NCCL object, typed by its base (see NOTE: [c10d collectives]).
using Group = compat::Collectives;

/// Gloo (src/process_group_gloo.cpp, or src/process_group_gloo_stub.cpp: "built
/// without Gloo"). Binds to loopback when `master_addr` is a loopback address.
c10::intrusive_ptr<Group> make_gloo_process_group(const c10::intrusive_ptr<c10d::Store>& store,
                                                  int64_t rank, int64_t world_size,
                                                  const std::string& master_addr,
                                                  std::chrono::milliseconds timeout);

/// NCCL (src/cuda/process_group_nccl.cpp, or src/process_group_nccl_stub.cpp).
c10::intrusive_ptr<Group> make_nccl_process_group(const c10::intrusive_ptr<c10d::Store>& store,
                                                  int64_t rank, int64_t world_size,
                                                  std::chrono::milliseconds timeout);

}  // namespace stepwise::distributed::detail
