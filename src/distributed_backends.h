// Private: creates the c10d process group of a backend. Which backends exist is
// decided in CMake (NCCL only with a CUDA-enabled LibTorch), not by #ifdef here.
#pragma once

#include <stepwise/distributed.h>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

namespace stepwise::distributed::detail {

/// Gloo (src/process_group_gloo.cpp) or NCCL (src/cuda/process_group_nccl.cpp, or
/// src/process_group_nccl_stub.cpp: "built without CUDA").
c10::intrusive_ptr<c10d::ProcessGroup> make_process_group(
    Backend backend, const c10::intrusive_ptr<c10d::Store>& store, int64_t rank, int64_t world_size,
    const std::string& master_addr, std::chrono::milliseconds timeout);

/// The NCCL half of make_process_group.
c10::intrusive_ptr<c10d::ProcessGroup> make_nccl_process_group(
    const c10::intrusive_ptr<c10d::Store>& store, int64_t rank, int64_t world_size,
    std::chrono::milliseconds timeout);

}  // namespace stepwise::distributed::detail
