// stepwise: micro-step counters, the accumulation boundary and the cadence checks.
//
// Usage {.cpp .fragment context="basic"} (what Engine does with it):
//
//   stepwise::Accumulator acc(/*gas=*/4, /*strict_cadence=*/true);
//   acc.on_backward();              // throws if backward() came twice in a row
//   bool boundary = acc.is_boundary();
//   acc.on_step(boundary, /*skipped=*/false, /*samples=*/32);
//
// NOTE: [accumulation boundary] The boundary is (micro_steps + 1) % GAS == 0,
// as in DeepSpeed. It depends only on how many times step() was called, never
// on backward(): a loop that calls step() only "at the boundary" makes the
// engine step the optimizer GAS times too rarely. That is why step() must be
// called after EVERY micro-batch.
#pragma once

#include <cstdint>

namespace stepwise {

/// The docs page the guard-rail messages point at.
inline constexpr const char* kCadenceDocs =
    "docs/gradient-accumulation.md (stepwise docs: Gradient accumulation guide)";

/// Counters and the boundary rule (docs/engine.md, "Counters").
class Accumulator {
 public:
  /// `gas` > 0 micro-batches per optimizer step.
  Accumulator(int64_t gas, bool strict_cadence);

  /// Records a backward(); with strict cadence, refuses two in a row.
  void on_backward();
  /// Checks a step() is allowed (strict cadence: a backward() came first).
  void check_step() const;
  /// Records a step(): `boundary` whether it was one, `skipped` whether the
  /// optimizer step was skipped (fp16 overflow), `samples` added at a boundary.
  void on_step(bool boundary, bool skipped, int64_t samples);
  /// Records a flush of `pending()` micro-batches: one boundary step, and
  /// micro_steps moves to the next multiple of GAS so the next window is whole.
  void on_flush(bool skipped, int64_t samples);

  /// see NOTE: [accumulation boundary]
  bool is_boundary() const { return (micro_steps_ + 1) % gas_ == 0; }
  /// Micro-batches stepped since the last boundary (0 .. GAS-1).
  int64_t pending() const { return micro_steps_ % gas_; }
  /// Whether a backward() is waiting for its step().
  bool awaiting_step() const { return awaiting_step_; }

  /// Micro-batches per optimizer step.
  int64_t gas() const { return gas_; }
  /// step() calls so far.
  int64_t micro_steps() const { return micro_steps_; }
  /// Boundaries reached, skipped ones included.
  int64_t global_steps() const { return global_steps_; }
  /// Boundaries whose optimizer step was skipped.
  int64_t skipped_steps() const { return skipped_steps_; }
  /// Samples of all boundary steps.
  int64_t global_samples() const { return global_samples_; }
  /// Whether the cadence checks are on.
  bool strict_cadence() const { return strict_cadence_; }

 private:
  int64_t gas_;
  bool strict_cadence_;
  bool awaiting_step_ = false;
  int64_t micro_steps_ = 0;
  int64_t global_steps_ = 0;
  int64_t skipped_steps_ = 0;
  int64_t global_samples_ = 0;
};

}  // namespace stepwise
