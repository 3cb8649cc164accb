// stepwise: the gradient reducer's options: how data parallelism averages gradients over
// the ranks.
//
// Usage {.cpp .fragment context="basic"}:
//
//   // The config's "stepwise" section: {"reduce_bucket_size": 4096, "overlap_comm": false}
//   auto reducer = stepwise::distributed::ReducerOptions().bucket_size(4096).overlap_comm(false);
//   stepwise::Config config;
//   config.train_micro_batch_size_per_gpu = 2;
//   config.reducer = reducer;
//   // DeepSpeed's top-level "prescale_gradients" and "gradient_predivide_factor":
//   auto prescaled = stepwise::distributed::ReducerOptions().prescale_gradients(true);
//   auto predivided = stepwise::distributed::ReducerOptions().gradient_predivide_factor(4.0);
//
// At the accumulation boundary (never in between) the engine's reducer sums every
// gradient over the W ranks in flat buckets of `bucket_size` elements, one all-reduce
// each, and the engine divides by W in the unscale that follows (with a predivide factor
// f: by f before the all-reduce and by W / f after; prescale: by W before, as DeepSpeed).
// The reducer itself is internal (src/gradient_reducer.h).
#pragma once

#include <torch/arg.h>

#include <cstdint>

namespace stepwise::distributed {

/// Options of the gradient reducer that stepwise::initialize builds (the config's
/// `"stepwise"` section: reduce_bucket_size, overlap_comm; and DeepSpeed's top-level
/// prescale_gradients and gradient_predivide_factor).
struct ReducerOptions {
  /// Elements per flat all-reduce bucket when W > 1 (> 0; DeepSpeed's stage-0 bucket
  /// is 500,000,000 elements and has no key).
  TORCH_ARG(int64_t, bucket_size) = 500000000;
  /// When W > 1, start each bucket's all-reduce during the backward() that ends the
  /// window, as soon as the bucket is full (DeepSpeed's overlap_comm); false: all at
  /// step() (NOTE: [bucket views]). At ZeRO stage 2: each bucket's reduce runs while
  /// backward goes on; false: backward waits for it.
  TORCH_ARG(bool, overlap_comm) = true;
  /// DeepSpeed's prescale_gradients: when W > 1, divide the gradients by W before the
  /// all-reduce instead of after it (the same mean, rounded on the way in).
  TORCH_ARG(bool, prescale_gradients) = false;
  /// DeepSpeed's gradient_predivide_factor f (> 0; ignored with prescale_gradients): when
  /// W > 1, divide by f before the all-reduce and by W / f after it.
  TORCH_ARG(double, gradient_predivide_factor) = 1.0;
};

}  // namespace stepwise::distributed
