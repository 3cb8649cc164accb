// stepwise (internal): the progress line and the CSV monitor (see NOTE: [monitor syncs]).
// The engine reports each backward() and each optimizer step; the monitor keeps what the
// next print step needs and writes the CSV rows.
#pragma once

#include <stepwise/monitor.h>

#include <torch/types.h>

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace stepwise::detail {

/// What one optimizer step (a boundary, a flush) reports.
struct StepReport {
  int64_t global_steps = 0;
  int64_t global_samples = 0;
  int64_t skipped_steps = 0;
  /// This rank's losses of the window that ended, as backward() returned them, and their
  /// factor: window_mean() of them is window_loss(), computed only when it is shown or
  /// written (NOTE: [monitor syncs]).
  std::vector<torch::Tensor> window_losses;
  double loss_factor = 1.0;
  std::vector<double> lrs;
  double grad_norm = 0.0;
  /// fp16 only.
  std::optional<double> loss_scale;
};

/// Sums a tensor over the ranks, in place (every rank calls it at the same step).
using AllReduceSum = std::function<void(torch::Tensor&)>;

class Monitor {
 public:
  /// `writes`: this rank prints and writes the files (rank 0). `total_steps`: the run's
  /// optimizer steps when known (for the ETA). `all_reduce_sum`: null with one rank.
  Monitor(const CsvMonitorOptions& csv, int64_t steps_per_print, bool writes,
          std::optional<int64_t> total_steps, AllReduceSum all_reduce_sum, int64_t world_size);
  /// Writes the rows not yet written (rank 0).
  ~Monitor();
  Monitor(const Monitor&) = delete;
  Monitor& operator=(const Monitor&) = delete;

  /// One backward() with `tokens` tokens on this rank (0: not reported).
  void on_backward(int64_t tokens);
  /// One optimizer step. At a print step, every rank takes part in one all-reduce, and
  /// rank 0 returns the progress line; otherwise (or on other ranks) empty.
  std::string on_step(StepReport report);

  /// The folder the CSV files go to ("" when disabled).
  const std::string& csv_folder() const { return folder_; }

 private:
  void write_rows();

  CsvMonitorOptions csv_;
  int64_t steps_per_print_;
  bool writes_;
  std::optional<int64_t> total_steps_;
  AllReduceSum all_reduce_sum_;
  int64_t world_size_;
  std::string folder_;
  std::vector<StepReport> pending_;  // steps whose rows are not written yet
  int64_t tokens_ = 0;               // this rank's, since the last print step
  bool tokens_reported_ = false;
  std::optional<std::chrono::steady_clock::time_point> last_print_;  // or the first backward
  int64_t last_print_samples_ = 0;
  int64_t last_print_steps_ = 0;
};

}  // namespace stepwise::detail
