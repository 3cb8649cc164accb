// stepwise (internal): the collectives the engine's own parts use beside the public ones
// of distributed::Context: an all-reduce that returns at once, for the reducer's buckets
// to overlap the backward pass (NOTE: [bucket views] in gradient_reducer.cpp), and a
// reduce to one rank (ZeRO stage 2).
#pragma once

#include <stepwise/distributed.h>

#include <torch/types.h>

#include <memory>
#include <string>

namespace stepwise::distributed::detail {

/// A collective in flight (all_reduce_sum_start, reduce_sum_start): wait() for it before
/// reading the tensor; destroying it without wait() waits (errors then are only logged).
class PendingCollective {
 public:
  struct Impl;
  explicit PendingCollective(std::unique_ptr<Impl> impl);
  ~PendingCollective();
  PendingCollective(const PendingCollective&) = delete;
  PendingCollective& operator=(const PendingCollective&) = delete;

 private:
  friend struct ContextAccess;
  std::unique_ptr<Impl> impl_;
};

/// Starts summing `tensor` over all ranks of `context`, in place, and returns at once (the
/// backend works on its own threads or stream). `tensor` must be on context.device();
/// every rank must start the same collectives in the same order. `what` names it in errors.
std::unique_ptr<PendingCollective> all_reduce_sum_start(Context& context, torch::Tensor& tensor,
                                                        const std::string& what);
/// Waits for `pending` (DistributedError naming the rank that is gone, as
/// Context::all_reduce_sum, when it fails or passes the timeout).
void wait(Context& context, PendingCollective& pending);

/// The dtype a gradient bucket like `t` is summed in: its own, except bf16 on the CPU,
/// which Gloo (LibTorch 1.13) does not sum ("Invalid scalar type"): fp32, rounded back
/// once after the sum.
inline torch::ScalarType wire_dtype(const torch::Tensor& t) {
  return t.scalar_type() == torch::kBFloat16 && t.device().is_cpu() ? torch::kFloat
                                                                    : t.scalar_type();
}

/// Starts summing `tensor` over all ranks of `context` into rank `root`'s `tensor` (the
/// others' are left as the backend leaves them) and returns at once, as
/// all_reduce_sum_start: ZeRO stage 2's reduce of a gradient bucket to its owner.
std::unique_ptr<PendingCollective> reduce_sum_start(Context& context, torch::Tensor& tensor,
                                                    int64_t root, const std::string& what);

}  // namespace stepwise::distributed::detail
