// stepwise (internal): how a save and a load run, on one rank or many. The engine says
// what it saves and how a checkpoint fits it; the files, the tag, the phases and the
// atomic publish are here. see NOTE: [checkpoint layout], NOTE: [checkpoint phases]
#pragma once

#include <torch/serialize/output-archive.h>

#include <stepwise/checkpoint.h>

#include "checkpoint/state.h"

#include <functional>
#include <optional>
#include <string>

namespace stepwise::distributed {
class Context;
}  // namespace stepwise::distributed

namespace stepwise::detail {

/// What a save writes, asked for when the save gets there.
struct SaveSource {
  /// This rank's window in progress (every rank).
  std::function<RankWindow()> window;
  /// What the ranks share (rank 0).
  std::function<SharedState()> shared;
  /// The optimizer's state (rank 0); unset under ZeRO stage 1 with W > 1.
  std::function<void(torch::serialize::OutputArchive&)> optimizer;
  /// ZeRO stage 1 with W > 1: this rank's fp32 masters and optimizer state, into
  /// zero_shard_file(rank) (every rank); unset otherwise.
  std::function<void(torch::serialize::OutputArchive&)> shard;
};

/// Saves a checkpoint `<dir>/<tag>`: the tag is checked and, with W > 1, agreed on
/// (`validation`); each rank writes its files into a partial folder, rank 0 publishes it
/// and, with `save_latest`, names it in `<dir>/latest`. A failed save removes what it
/// wrote. `ctx` is null with one rank. Returns the checkpoint's folder.
std::string save_checkpoint(distributed::Context* ctx, const std::string& dir, std::string tag,
                            TagValidation validation, bool save_latest, const SaveSource& source);

/// What a window in progress needs to be the same to resume.
struct Setup {
  int64_t world_size = 1;
  int64_t gradient_accumulation_steps = 1;
  std::string precision = "fp32";
  int64_t zero_stage = 0;  // 0 when unsharded (W = 1)
};

/// A checkpoint as read from disk, before anything is applied.
struct ReadCheckpoint {
  /// The checkpoint's folder, and the shared file it was read from.
  std::string path;
  std::string shared_file;
  SharedState shared;
  /// This rank's window file, and what it holds when it was read: when the window is
  /// continued, or when it exists for the loss of the last window (never in a converted
  /// DeepSpeed checkpoint, nor with load_module_only).
  std::string window_file;
  std::optional<RankWindow> window;
  /// Not load_module_only.
  bool full = false;
  /// The window in progress is continued (its pending gradients are loaded).
  bool continue_window = false;
};

/// Loads a checkpoint from `dir` (the tag from `options`, or `<dir>/latest`): every rank
/// reads its files and runs `check`, which throws to refuse; only when every rank's
/// checks passed does each run `apply`. Returns the folder and the client state.
LoadedCheckpoint load_checkpoint(distributed::Context* ctx, const std::string& dir,
                                 const LoadOptions& options, const Setup& setup,
                                 const std::function<void(const ReadCheckpoint&)>& check,
                                 const std::function<void(const ReadCheckpoint&)>& apply);

}  // namespace stepwise::detail
