// stepwise: micro-step counters, the accumulation boundary and the cadence checks.
//
// Usage {.cpp .fragment context="basic"}:
//
//   // 100 micro-batches an epoch, 3 epochs, GAS 8, a flush() at each epoch's end:
//   const int64_t steps = stepwise::total_num_steps(100, 3, 8, stepwise::EpochEnd::kFlush);
//   // 3 * ceil(100 / 8) = 39: the "total_num_steps" of a WarmupDecayLR for this loop
//   stepwise::Config config;  // or the config's "stepwise" section: {"strict_cadence": false}
//   config.accumulation = stepwise::AccumulationOptions().strict_cadence(false);
//
// The engine counts micro-steps and finds the boundary (NOTE: [accumulation boundary] in
// src/accumulator.h); these options and the step count of a run are what a user sets
// and needs of it.
#pragma once

#include <torch/arg.h>

#include <cstdint>
#include <optional>

namespace stepwise {

/// What a loop does with the micro-batches left over at the end of an epoch.
enum class EpochEnd {
  /// engine.flush() at each epoch end: a last, shorter window of its own.
  kFlush,
  /// No flush: the remainder carries into the next epoch's first window (DeepSpeed).
  kCarry,
};

/// Optimizer steps (boundaries) of a run of `epochs` epochs of
/// `micro_batches_per_epoch` micro-batches on each rank with `gas` micro-batches per
/// step: the value for a scheduler's total_num_steps. kFlush: epochs * ceil(n / gas);
/// kCarry: floor(epochs * n / gas). Skipped fp16 steps count (the scheduler is not
/// stepped on them, so a run with skips ends before the schedule does).
int64_t total_num_steps(int64_t micro_batches_per_epoch, int64_t epochs, int64_t gas,
                        EpochEnd epoch_end);

/// Resolved batch sizes: tb == micro_batch * gas * world_size (docs/config.md, "Batch sizes").
struct BatchSizes {
  /// Samples per optimizer step over all ranks (tb).
  int64_t train_batch_size = 0;
  /// Samples per micro-batch on one rank (mbs).
  int64_t micro_batch = 0;
  /// Micro-batches per optimizer step (GAS).
  int64_t gradient_accumulation_steps = 0;
  /// Data-parallel ranks (W).
  int64_t world_size = 1;
};

/// Options of the accumulation window (the config's `"stepwise"` section).
struct AccumulationOptions {
  /// Refuse backward() twice without step() and step() without backward().
  TORCH_ARG(bool, strict_cadence) = true;
  /// Divide the loss by GAS in backward() (DeepSpeed's behaviour, default on).
  TORCH_ARG(bool, scale_wrt_gas) = true;
};

}  // namespace stepwise
