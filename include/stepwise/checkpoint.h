// stepwise: checkpoints that resume exactly, wherever they were taken.
//
// Usage {.cpp .fragment context="engine"}:
//
//   //~ const std::string dir = std::filesystem::temp_directory_path() / "stepwise-usage";
//   engine.backward(loss_of(0));
//   engine.step();  // micro-step 1 of 4: a window in progress
//   engine.save_checkpoint(dir, stepwise::SaveOptions().client_state({{"epoch", 3}}));
//   auto loaded = engine.load_checkpoint(dir);  // in a fresh process, after initialize
//   int64_t epoch = loaded.client_state.at("epoch").toInt();
//
// NOTE: [checkpoint layout] A checkpoint is a folder `<dir>/<tag>/` holding
// `mp_rank_00_model_states.pt` (written by rank 0: the weights, fp32 masters by name,
// scheduler position, loss scaler, counters, the window's size, config and client state),
// `optimizer_states.pt` (rank 0: the optimizer, a LibTorch archive streamed to disk) and
// one `window_rank_<r>.pt` per rank (that rank's gradients of the window in progress, not
// yet reduced, its window losses, its loss of the last window and its random generators'
// state). The .pt files other than the
// optimizer's are pickled dicts of tensors and scalars that Python's torch.load reads; each file
// has a `.sum` sidecar (size, hash).
// `<dir>/latest` names the newest tag. A save writes the folder under a temporary name and renames
// it into place, then replaces `latest` by rename, so a save killed at any point leaves the
// previous checkpoint and `latest` loadable.
#pragma once

#include <ATen/core/ivalue.h>
#include <torch/arg.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace stepwise {

/// What the caller saves with a checkpoint (epoch, data position): string
/// keys, IValue values (tensors, ints, doubles, strings, lists, dicts).
using ClientState = std::map<std::string, c10::IValue>;

/// What a save does when the ranks pass different checkpoint tags
/// (`checkpoint.tag_validation`, DeepSpeed's values).
enum class TagValidation {
  /// Do not compare the tags.
  kIgnore,
  /// Print a warning on rank 0 and save under rank 0's tag.
  kWarn,
  /// Throw CheckpointError on every rank; nothing is written.
  kFail,
};

/// Options of an engine's checkpoints (the config's `"checkpoint"` section).
struct CheckpointOptions {
  /// Whether the ranks' tags are compared before a save (default Warn).
  TORCH_ARG(TagValidation, tag_validation) = TagValidation::kWarn;
};

/// Options of Engine::save_checkpoint.
struct SaveOptions {
  /// The checkpoint's name (a folder under the directory). Unset: "global_step<N>".
  TORCH_ARG(std::optional<std::string>, tag) = std::nullopt;
  /// Saved with the checkpoint and returned by load_checkpoint.
  TORCH_ARG(ClientState, client_state) = {};
  /// Whether `<dir>/latest` then names this tag.
  TORCH_ARG(bool, save_latest) = true;
};

/// Options of Engine::load_checkpoint (DeepSpeed's names and defaults).
struct LoadOptions {
  /// The checkpoint to load. Unset: the one `<dir>/latest` names.
  TORCH_ARG(std::optional<std::string>, tag) = std::nullopt;
  /// Every parameter and buffer of the model must be in the checkpoint, and no other.
  TORCH_ARG(bool, load_module_strict) = true;
  /// Load the optimizer's state (moments, step counts, hyperparameters).
  TORCH_ARG(bool, load_optimizer_states) = true;
  /// Load the LR scheduler's position.
  TORCH_ARG(bool, load_lr_scheduler_states) = true;
  /// Continue the window in progress (its gradients and counters). false: DeepSpeed's
  /// behaviour, the pending micro-batches are dropped and the window starts again.
  TORCH_ARG(bool, load_window) = true;
  /// Set this rank's random generators (the CPU's, and each CUDA device's) to their state
  /// at the save, so dropout and random sampling continue as if the run had not stopped.
  /// false: the process keeps its own generators. A rank the saving run did not have (a
  /// larger world size, at a boundary) keeps its own either way.
  TORCH_ARG(bool, load_rng_state) = true;
  /// Load the model's weights only: no optimizer, scheduler, loss scale, counters or
  /// window in progress (fine-tuning from a checkpoint).
  TORCH_ARG(bool, load_module_only) = false;
};

/// What Engine::load_checkpoint returns.
struct LoadedCheckpoint {
  /// The checkpoint's folder.
  std::string path;
  /// The client state saved with it.
  ClientState client_state;
};

/// The tags of the checkpoints in `dir` (folders holding a model-states file), sorted.
std::vector<std::string> checkpoint_tags(const std::string& dir);

}  // namespace stepwise
