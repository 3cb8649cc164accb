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
  /// ZeRO-Offload of the optimizer to the CPU at stage 1 or 2 (DeepSpeed's
  /// `offload_optimizer` with `"device": "cpu"`, or the older `cpu_offload`): the optimizer
  /// state and fp32 masters in host memory. With the parameters on the CPU they are there
  /// already, and initialize accepts it with a note; with CUDA parameters it refuses it.
  TORCH_ARG(bool, offload_optimizer) = false;
  /// DeepSpeed's `zero_force_ds_cpu_optimizer`: with offload_optimizer, an optimizer passed
  /// to initialize is refused (true, DeepSpeed's default: it takes only its CPU Adam there)
  /// or taken (false).
  TORCH_ARG(bool, force_ds_cpu_optimizer) = true;
};

}  // namespace stepwise::distributed
