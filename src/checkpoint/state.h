// stepwise (internal): the saved format, defined once. A save fills these structs and
// pickles them; a load unpickles them, every field typed and in its range, before any
// check against the engine. The converted DeepSpeed file is read into the same struct.
// see NOTE: [checkpoint layout]
#pragma once

#include <ATen/core/ivalue.h>

#include <stepwise/checkpoint.h>
#include <stepwise/loss_scaler.h>

#include "checkpoint/rng.h"

#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace stepwise::detail {

/// Tensors by name, in the order they were saved.
using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

/// The LR scheduler's position.
struct SavedScheduler {
  /// Its step count.
  int64_t step_count = 0;
  /// How many of those steps the engine took (the others were taken before it).
  int64_t steps_taken = 0;
  /// Each parameter group's lr (absent in a converted DeepSpeed file).
  std::optional<std::vector<double>> lrs;
};

/// `mp_rank_00_model_states.pt`: what every rank shares, written by rank 0.
struct SharedState {
  /// The parameters and buffers.
  NamedTensors module;
  /// The fp32 master weights of the trainable parameters (fp16 and bf16 only).
  std::optional<NamedTensors> fp32_masters;
  /// The optimizer's C++ type ("torch::optim::AdamW"; "deepspeed" when converted).
  std::string optimizer_type;
  std::optional<SavedScheduler> lr_scheduler;
  std::optional<LossScalerState> loss_scaler;
  int64_t global_steps = 0;
  int64_t global_samples = 0;
  int64_t skipped_steps = 0;
  int64_t micro_steps = 0;
  /// The window in progress as every rank sees it: its backward() calls so far, and
  /// whether one waits for its step(). Its gradients are in the window files.
  int64_t window_micro_batches = 0;
  bool window_awaiting_step = false;
  /// The boundary set by hand, if any.
  std::optional<bool> manual_boundary;
  int64_t dp_world_size = 1;
  /// 1: saved by ZeRO stage 1 with dp_world_size > 1, so the fp32 masters and the
  /// optimizer's state are each rank's own, in zero_shard_file(rank); 0: here.
  int64_t zero_stage = 0;
  int64_t gradient_accumulation_steps = 1;
  /// "fp32", "fp16" or "bf16".
  std::string precision = "fp32";
  /// The config as JSON, with the batch sizes resolved.
  std::string ds_config;
  std::string stepwise_version;
  bool was_step_applied = false;
  double global_grad_norm = 0.0;
  ClientState client_state;
  /// Set only in a file tools/deepspeed-to-stepwise converted: its Adam state (None: it
  /// has none). Such a file has no window files and no optimizer file.
  std::optional<c10::IValue> deepspeed_optimizer;

  /// Whether it was saved inside an accumulation window.
  bool mid_window() const { return window_micro_batches > 0 || window_awaiting_step; }
};

/// `window_rank_<r>.pt`: one rank's window in progress, not yet reduced.
struct RankWindow {
  int64_t rank = 0;
  int64_t world_size = 1;
  int64_t micro_steps = 0;
  /// backward() calls of the window, and how many of them divided the loss by GAS.
  int64_t window_backwards = 0;
  int64_t window_scaled = 0;
  /// The trainable parameters' gradients so far (those that have one).
  NamedTensors grads;
  std::vector<torch::Tensor> window_losses;
  /// This rank's loss of the last finished window (window_loss()) and its factor.
  std::vector<torch::Tensor> last_window_losses;
  double last_window_factor = 1.0;
  /// The rank's generators when it saved (absent: the file holds none, nothing to restore).
  std::optional<RngState> rng;
};

/// What a file holds, to be pickled.
c10::IValue to_ivalue(const SharedState& state);
c10::IValue to_ivalue(const RankWindow& window);
/// What `file` holds, every entry present, of its type and in its range; CheckpointError
/// naming the file and the entry otherwise.
SharedState shared_state_from(const c10::IValue& value, const std::string& file);
RankWindow rank_window_from(const c10::IValue& value, const std::string& file);

}  // namespace stepwise::detail
