// stepwise (internal): the files of a checkpoint, written atomically and read with
// errors that name them. see NOTE: [checkpoint layout]
#pragma once

#include <ATen/core/Dict.h>
#include <ATen/core/ivalue.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <stepwise/errors.h>

#include <string>
#include <vector>

namespace torch::optim {
class Optimizer;
}  // namespace torch::optim

namespace stepwise::detail {

/// The file rank 0 writes: weights, optimizer, scheduler, scaler, counters, config.
inline constexpr const char* kModelStatesFile = "mp_rank_00_model_states.pt";
/// What tools/deepspeed-to-stepwise writes from a DeepSpeed checkpoint (no sidecar).
inline constexpr const char* kDeepSpeedFile = "deepspeed_model_states.pt";
/// The optimizer's state and its parameter groups' options (a LibTorch archive).
inline constexpr const char* kOptimizerFile = "optimizer_states.pt";
/// The entry `key` of a checkpoint's dict read from `path`; CheckpointError naming both
/// when it is missing (the file was not written by save_checkpoint).
const c10::IValue& entry(const c10::impl::GenericDict& dict, const char* key,
                         const std::string& path);
/// The optimizer's C++ type, as a checkpoint records it ("torch::optim::AdamW").
std::string optimizer_type(const torch::optim::Optimizer& optimizer);

/// Runs `read`, naming `path` in the CheckpointError for whatever it throws (LibTorch's
/// archive and unpickler errors).
template <typename F>
auto reading(const std::string& path, F&& read) {
  try {
    return read();
  } catch (const CheckpointError&) {
    throw;
  } catch (const std::exception& e) {
    const std::string what = e.what();
    throw CheckpointError(
        c10::str("checkpoint file ", path, " cannot be read: ", what.substr(0, what.find('\n'))));
  }
}

/// The file of one rank's window in progress.
std::string window_file(int64_t rank);
/// ZeRO stage 1 with W > 1: the file of one rank's fp32 masters and optimizer state
/// (DeepSpeed's name for it; a LibTorch archive).
std::string zero_shard_file(int64_t rank);

/// Throws CheckpointError unless `tag` can name a folder: not empty, no '/', not
/// "latest", not starting with '.'.
void check_tag(const std::string& tag);
/// The tag `<dir>/latest` names; CheckpointError listing the tags present if none.
std::string read_latest(const std::string& dir);
/// Replaces `<dir>/latest` by rename, so it always names a complete checkpoint.
void write_latest(const std::string& dir, const std::string& tag);
/// `<dir>/.<tag>.partial`: where a save writes before publish() renames it.
std::string partial_folder(const std::string& dir, const std::string& tag);

/// Removes `path` and everything under it, if it exists; returns whether nothing is left.
/// NOTE: [no remove_all] Not std::filesystem::remove_all: PyTorch's pip wheels (2.5 and
/// later, pytorch/pytorch#133437) export their own statically linked copy of
/// std::filesystem, and with PyTorch 2.11 (the H200 check) remove_all of a folder
/// crashed inside libtorch.so. POSIX nftw, depth first, does not go through it.
bool remove_tree(const std::string& path);
/// Creates an empty partial folder (removing one a killed save left).
void make_partial_folder(const std::string& partial);
/// Renames the finished partial folder to `<dir>/<tag>`, atomically replacing a
/// checkpoint of that tag if there is one.
void publish(const std::string& partial, const std::string& dir, const std::string& tag);

/// Pickles `value` (torch.load reads it) into `path`, flushed to disk.
void write_pickle(const std::string& path, const c10::IValue& value);
/// Reads what write_pickle wrote; CheckpointError naming the file when it is missing,
/// truncated or corrupted.
c10::IValue read_pickle(const std::string& path);

/// Reads a file Python's torch.save wrote (no checksum sidecar); CheckpointError naming
/// the file when it cannot be read.
c10::IValue read_foreign_pickle(const std::string& path);
/// Writes a LibTorch archive into `path` (streamed, no copy in memory), flushed to disk,
/// with its checksum sidecar.
void write_archive(const std::string& path, torch::serialize::OutputArchive& archive);
/// Checks `path` against its sidecar, then loads it into `archive`; CheckpointError naming
/// the file when it is missing, truncated or corrupted.
void read_archive(const std::string& path, torch::serialize::InputArchive& archive);

}  // namespace stepwise::detail
