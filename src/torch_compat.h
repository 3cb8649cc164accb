// The one place where stepwise bridges LibTorch 1.13 (Debian, CI) and 2.x (PyTorch's
// own LibTorch, e.g. the CUDA one on a GPU machine). Each difference is detected from
// the types themselves, not from version numbers, so a third variant fails to compile
// here rather than misbehave elsewhere.
#pragma once

#include <torch/optim/optimizer.h>
#include <torch/types.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <sstream>
#include <string>
#include <type_traits>

namespace stepwise::compat {

/// NOTE: [optimizer state key] torch::optim::Optimizer::state() is keyed by the
/// parameter's TensorImpl address: printed to a std::string in 1.13, the void* itself
/// in 2.x. This gives the key of `param` for whichever map `state()` is.
template <class OptimizerType>  // a template, so only the matching branch is compiled
auto state_key(OptimizerType& optimizer, const torch::Tensor& param) {
  using Map = std::decay_t<decltype(optimizer.state())>;
  using Key = typename Map::key_type;
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream out;  // what c10::guts::to_string does in 1.13
    out << static_cast<void*>(param.unsafeGetTensorImpl());
    return Key(out.str());
  } else {
    return static_cast<Key>(param.unsafeGetTensorImpl());
  }
}

namespace detail {
template <class T, class = void>
struct WrapsBackends : std::false_type {};
template <class T>
struct WrapsBackends<T, std::void_t<decltype(std::declval<T&>().getBackend(c10::DeviceType::CPU))>>
    : std::true_type {};
}  // namespace detail

/// NOTE: [c10d collectives] In 1.13 ProcessGroupGloo/NCCL derive from
/// c10d::ProcessGroup; in 2.x they derive from c10d::Backend and ProcessGroup became a
/// dispatching wrapper (whose constructor changed within 2.x). Both bases have the
/// same allreduce/broadcast/allgather/barrier/getBackendName, so stepwise keeps the
/// Gloo/NCCL object itself, typed as whichever base it has.
using Collectives = std::conditional_t<detail::WrapsBackends<c10d::ProcessGroup>::value,
                                       c10d::Backend, c10d::ProcessGroup>;

}  // namespace stepwise::compat
