// stepwise: what training shows while it runs: the progress line every steps_per_print
// optimizer steps, and DeepSpeed's CSV monitor files.
//
// Usage {.cpp .fragment context="basic"}:
//
//   auto config = stepwise::Config::from_string(R"({"train_batch_size": 8,
//     "steps_per_print": 100,
//     "csv_monitor": {"enabled": true, "output_path": "logs", "job_name": "run1"}})");
//   CHECK(config.csv_monitor.enabled());
//   // logs/run1/Train_Samples_train_loss.csv, Train_Samples_lr.csv (and with fp16
//   // Train_Samples_loss_scale.csv): "step,<name>" then one row per optimizer step, the
//   // step being global_samples, written by rank 0.
//
// NOTE: [monitor syncs] A step that does not print costs the monitor no host sync and no
// tensor op: it keeps the handles of the window's losses (tensors on the model's device)
// until the next print step. There the pending losses (and the token count) go to the
// host in one copy, after one all-reduce across the ranks for the progress line's mean
// loss. The CSV files get their rows then, and when the engine is destroyed.
#pragma once

#include <torch/arg.h>

#include <string>

namespace stepwise {

/// The config's `"csv_monitor"` section (DeepSpeed's names and defaults).
struct CsvMonitorOptions {
  /// Write the files.
  TORCH_ARG(bool, enabled) = false;
  /// The folder that holds the job's folder ("": the working directory).
  TORCH_ARG(std::string, output_path) = "";
  /// The job's folder, under output_path.
  TORCH_ARG(std::string, job_name) = "DeepSpeedJobName";
};

}  // namespace stepwise
