// stepwise: ZeRO's sharding (DeepSpeed's "zero_optimization" section): which ranks keep
// which parameters' optimizer state and fp32 master weights.
//
// Usage {.cpp .fragment context="basic"}:
//
//   // The config's "zero_optimization": {"stage": 1, "allgather_bucket_size": 200000000}
//   auto zero = stepwise::distributed::ZeroOptions().stage(1).allgather_bucket_size(200000000);
//   stepwise::Config config;
//   config.train_micro_batch_size_per_gpu = 2;
//   config.zero = zero;
//
// Stage 1, with W > 1 ranks: each trainable parameter belongs to one rank (whole tensors,
// in order, balanced by size); that rank alone keeps its fp32 master weight and its
// optimizer state and steps it; then every rank receives the updated parameters from
// their owners. The gradients are reduced at the boundary as at stage 0, and each
// parameter's update, norm and clip run exactly as at stage 0: the weights, the loss
// scale, the skipped steps and global_grad_norm() are bitwise stage 0's.
// Stage 2 shards the gradients too: each micro-step's are summed into their owner as
// backward produces them, and a rank keeps its own parameters' sums only (off .grad, which
// is none between micro-steps); bitwise stage 0 with one micro-step per window, within
// float rounding with more (the sums add in another order).
// Stage 0 (the default), or W = 1: nothing is sharded.
#pragma once

#include <torch/arg.h>

#include <cstdint>

namespace stepwise::distributed {

/// Options of ZeRO's sharding (the config's `"zero_optimization"` section).
struct ZeroOptions {
  /// 0: every rank keeps the whole optimizer state; 1: each rank keeps the optimizer
  /// state and fp32 master weights of its share of the parameters; 2: and the sums of
  /// its share's gradients (stage 3 is refused by name).
  TORCH_ARG(int64_t, stage) = 0;
  /// Elements per broadcast when the updated parameters go from their owners to every
  /// rank (> 0; DeepSpeed's allgather_bucket_size, 500,000,000 by default).
  TORCH_ARG(int64_t, allgather_bucket_size) = 500000000;
};

}  // namespace stepwise::distributed
