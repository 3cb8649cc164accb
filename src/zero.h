// stepwise (internal): ZeRO stage 1's sharding: which rank owns each trainable parameter,
// and the gather of the updated parameters from their owners. Its options are public
// (<stepwise/zero.h>); the precision policy keeps the owned parameters' fp32 masters only
// (Precision::shard) and the optimizer steps those.
#pragma once

#include <stepwise/distributed.h>
#include <stepwise/zero.h>

#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace stepwise::detail {

/// NOTE: [whole-tensor shards] Rank r owns a contiguous run of the parameters (in the
/// model's order), chosen so that each rank's elements come closest to its 1/W share of
/// the total; a tensor is never split. DeepSpeed cuts one flat buffer at exact 1/W points
/// instead. Whole tensors cost some balance (a rank's share can exceed 1/W by up to one
/// tensor) and buy exactness: each tensor's unscale, norm, clip and update run on the
/// same values, in the same order, as at stage 0, so the weights are bitwise stage 0's.
/// Returns the owner of each parameter, from its element count.
std::vector<int64_t> owners_by_size(const std::vector<int64_t>& numels, int64_t world_size);

/// The sharding of one engine: stage 0 (or W = 1) owns everything and gathers nothing.
class ZeroShards {
 public:
  /// `params` are the model's trainable parameters; `context` is null when W = 1.
  ZeroShards(const distributed::ZeroOptions& options, const std::vector<torch::Tensor>& params,
             std::shared_ptr<distributed::Context> context);
  /// Whether parameters are sharded (stage >= 1 and W > 1).
  bool sharded() const { return sharded_; }
  /// The indices (into the parameters) this rank owns, in order.
  const std::vector<size_t>& owned() const { return owned_; }
  /// Each parameter's owner.
  const std::vector<int64_t>& owners() const { return owners_; }
  /// Sums `t` over the ranks in place (for the gradient statistics).
  void sum_over_ranks(torch::Tensor& t) const;
  /// After the owners updated their parameters: every rank receives them, by broadcast from
  /// their owners, large tensors in place and small ones packed (NOTE: [gather buckets]);
  /// their bytes go unchanged, so no dtype is rounded on the way. A no-op unless sharded().
  void gather(const std::vector<torch::Tensor>& params) const;
  /// Broadcasts this gather has made so far.
  int64_t gather_calls() const { return calls_; }

 private:
  distributed::ZeroOptions options_;
  std::shared_ptr<distributed::Context> context_;
  bool sharded_ = false;
  std::vector<int64_t> owners_;
  std::vector<size_t> owned_;
  mutable int64_t calls_ = 0;
};

}  // namespace stepwise::detail
