// stepwise (internal): micro-step counters, the accumulation boundary and the cadence
// checks: the engine's Accumulator, which alone owns GAS and the window's arithmetic.
//
// How the engine uses it:
//
//   stepwise::Accumulator acc(config.resolve_batch_sizes(/*world_size=*/1),
//                             stepwise::AccumulationOptions().strict_cadence(true));
//   acc.on_backward();              // throws if backward() came twice in a row
//   if (acc.is_boundary()) {
//     acc.on_boundary(/*skipped=*/false, acc.window_samples(/*ends_early=*/false));
//   } else {
//     acc.on_step();                // a micro-step inside the window
//   }
//
// NOTE: [accumulation boundary] The boundary is (micro_steps + 1) % GAS == 0,
// as in DeepSpeed. It depends only on how many times step() was called, never
// on backward(): a loop that calls step() only "at the boundary" makes the
// engine step the optimizer GAS times too rarely. That is why step() must be
// called after EVERY micro-batch.
#pragma once

#include <stepwise/accumulation.h>

#include <cstdint>
#include <optional>

namespace stepwise {

/// The docs page the guard-rail messages point at.
inline constexpr const char* kCadenceDocs =
    "docs/gradient-accumulation.md (stepwise docs: The pitfalls of gradient accumulation)";

/// Everything an Accumulator counts (what a checkpoint saves of it).
struct AccumulatorState {
  /// step() calls so far.
  int64_t micro_steps = 0;
  /// Boundaries reached.
  int64_t global_steps = 0;
  /// Boundaries skipped.
  int64_t skipped_steps = 0;
  /// Samples of all boundary steps.
  int64_t global_samples = 0;
  /// backward() calls since the last boundary.
  int64_t window_backwards = 0;
  /// ... of which divided the loss by GAS.
  int64_t window_scaled = 0;
  /// Whether a backward() waits for its step().
  bool awaiting_step = false;
  /// The boundary set by hand, if any.
  std::optional<bool> manual_boundary;
};

/// Counters and the boundary rule (docs/engine.md, "Counters").
class Accumulator {
 public:
  /// `sizes`: the run's resolved batch sizes (GAS > 0 micro-batches per optimizer step).
  explicit Accumulator(const BatchSizes& sizes, const AccumulationOptions& options = {});

  /// Records a backward() (`scaled`: it divided the loss by GAS); with strict
  /// cadence, refuses two in a row unless the boundary is set by hand.
  void on_backward(bool scaled = true);
  /// Checks a step() is allowed (strict cadence: a backward() came first).
  void check_step() const;
  /// Records a step() off the boundary: one more micro-step.
  void on_step();
  /// Records a step() at the boundary: one more micro-step and one more global step,
  /// `skipped` whether the optimizer step was skipped (fp16 overflow), `samples` the
  /// samples it used over all ranks.
  void on_boundary(bool skipped, int64_t samples);
  /// Records a step that ends the window early (a flush, or a boundary set by
  /// hand): one boundary step, and micro_steps moves to the next multiple of GAS
  /// so the next window is whole.
  void on_flush(bool skipped, int64_t samples);

  /// Sets (a value) or clears (nullopt: back to counting) the boundary by hand.
  void set_manual_boundary(std::optional<bool> boundary) { s_.manual_boundary = boundary; }
  /// The boundary set by hand, if any.
  std::optional<bool> manual_boundary() const { return s_.manual_boundary; }

  /// see NOTE: [accumulation boundary]; a boundary set by hand wins.
  bool is_boundary() const {
    return s_.manual_boundary ? *s_.manual_boundary : (s_.micro_steps + 1) % gas() == 0;
  }
  /// backward() calls since the last boundary.
  int64_t window_backwards() const { return s_.window_backwards; }
  /// What a step ending the window after `window_backwards()` micro-batches (a
  /// flush or a boundary set by hand) multiplies the gradients by so that they are
  /// their mean: GAS / k when backward() divided each loss by GAS, 1 when it did
  /// not (the loop normalised the loss itself). Throws UsageError if the window mixed both.
  double early_end_factor() const;
  /// Micro-batches stepped since the last boundary (0 .. GAS-1).
  int64_t pending() const { return s_.micro_steps % gas(); }
  /// Whether a backward() is waiting for its step().
  bool awaiting_step() const { return s_.awaiting_step; }

  /// The run's batch sizes: the one owner of GAS, the micro-batch and W.
  const BatchSizes& sizes() const { return sizes_; }
  /// Micro-batches per optimizer step.
  int64_t gas() const { return sizes_.gradient_accumulation_steps; }
  /// The samples, over all ranks, of the window that ends now: train_batch_size at a
  /// counted boundary; window_backwards() micro-batches on each rank when the window
  /// `ends_early` (a flush, or a boundary set by hand).
  int64_t window_samples(bool ends_early) const {
    return ends_early ? s_.window_backwards * sizes_.micro_batch * sizes_.world_size
                      : sizes_.train_batch_size;
  }
  /// Where a run saved at `micro_steps` with `saved_gas` continues when its window in
  /// progress is dropped (a load's load_window(false)): back to that window's start, then
  /// on to the next whole window of this GAS, as flush() moves it.
  int64_t after_dropped_window(int64_t micro_steps, int64_t saved_gas) const {
    const int64_t start = micro_steps - micro_steps % saved_gas;
    return (start + gas() - 1) / gas() * gas();
  }
  /// step() calls so far.
  int64_t micro_steps() const { return s_.micro_steps; }
  /// Boundaries reached, skipped ones included.
  int64_t global_steps() const { return s_.global_steps; }
  /// Boundaries whose optimizer step was skipped.
  int64_t skipped_steps() const { return s_.skipped_steps; }
  /// Samples of all boundary steps.
  int64_t global_samples() const { return s_.global_samples; }
  /// The options it was built with.
  const AccumulationOptions& options() const { return options_; }

  /// The counters, for a checkpoint.
  const AccumulatorState& state() const { return s_; }
  /// Sets the counters (a checkpoint's).
  void restore(const AccumulatorState& state) { s_ = state; }

 private:
  BatchSizes sizes_;
  AccumulationOptions options_;
  // A boundary: the window's counts restart, one more (maybe skipped) step.
  void end_window(bool skipped, int64_t samples);

  AccumulatorState s_;  // every counter, as a checkpoint saves them
};

}  // namespace stepwise
