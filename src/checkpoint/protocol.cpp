#include "checkpoint/protocol.h"

#include <torch/torch.h>

#include <stepwise/distributed.h>
#include <stepwise/errors.h>

#include "check.h"
#include "checkpoint/deepspeed.h"
#include "checkpoint/files.h"
#include "checkpoint/load_checks.h"

#include <exception>
#include <filesystem>
#include <functional>
#include <iostream>

namespace stepwise::detail {

namespace {

namespace fs = std::filesystem;

// NOTE: [checkpoint phases] With W > 1 a save or a load runs in phases, each ended by
// one all-gather of every rank's "it went well" flag. A rank whose phase threw rethrows
// its own error; the others throw a CheckpointError naming the ranks that failed. So an
// error on one rank (a full disk, a missing or corrupted window file) reaches every rank
// at once instead of leaving the others in the next collective until the timeout, and a
// load changes nothing on any rank unless every rank's checks passed. With W = 1 a phase
// just runs.
// A file system's or LibTorch's own error inside a phase becomes a CheckpointError naming
// the phase, so a caller only ever sees CheckpointError (or DistributedError: a rank died).
void phase(distributed::Context* ctx, const std::string& what, const std::function<void()>& run) {
  std::exception_ptr error;
  try {
    try {
      run();
    } catch (const fs::filesystem_error& e) {
      throw CheckpointError(c10::str(what, ": ", e.what()));
    } catch (const c10::Error& e) {
      throw CheckpointError(c10::str(what, ": ", e.what_without_backtrace()));
    }
  } catch (...) {
    error = std::current_exception();
  }
  if (ctx != nullptr) {
    const auto flags =
        ctx->all_gather(torch::tensor({error ? int64_t{1} : int64_t{0}}, torch::kLong), what);
    std::string failed;
    for (size_t r = 0; r < flags.size(); ++r) {
      if (flags[r].item<int64_t>() != 0) failed += c10::str(failed.empty() ? "" : ", ", r);
    }
    if (!error && !failed.empty()) {
      throw CheckpointError(c10::str(what, " failed on rank ", failed,
                                     " (its own CheckpointError says why); every rank stopped "
                                     "there"));
    }
  }
  if (error) std::rethrow_exception(error);
}

// The tags of all ranks are compared (one all-gather of a hash over c10d).
bool same_tag_everywhere(distributed::Context& ctx, const std::string& tag) {
  const auto hash = static_cast<int64_t>(std::hash<std::string>{}(tag));
  const auto all = ctx.all_gather(torch::tensor({hash}, torch::kLong), "checkpoint tag check");
  for (const auto& t : all) {
    if (t.item<int64_t>() != hash) return false;
  }
  return true;
}

// Rank 0's `text` on every rank (two broadcasts over c10d).
std::string rank0_text(distributed::Context& ctx, const std::string& text) {
  auto size = torch::tensor({static_cast<int64_t>(text.size())}, torch::kLong);
  ctx.broadcast(size, 0, "checkpoint tag (size)");
  std::vector<int64_t> chars(text.begin(), text.end());
  chars.resize(static_cast<size_t>(size.item<int64_t>()));
  auto bytes = torch::tensor(chars, torch::kLong);
  ctx.broadcast(bytes, 0, "checkpoint tag");
  std::string out;
  for (int64_t i = 0; i < bytes.numel(); ++i) out += static_cast<char>(bytes[i].item<int64_t>());
  return out;
}

// The tag every rank saves under: `tag` when all ranks passed the same, else rank 0's
// (TagValidation Warn or Ignore) or none (Fail: CheckpointError).
std::string agreed_tag(distributed::Context* ctx, std::string tag, TagValidation validation) {
  phase(ctx, "checkpoint save: tag check", [&] { check_tag(tag); });
  if (ctx == nullptr || same_tag_everywhere(*ctx, tag)) return tag;
  STEPWISE_CHECK(validation != TagValidation::kFail, CheckpointError,
                 "the ranks passed different checkpoint tags (this rank: \"", tag,
                 "\"); nothing was written. Pass the same tag on every rank, or leave it "
                 "unset (\"global_step<N>\")");
  const std::string mine = tag;
  tag = rank0_text(*ctx, tag);
  if (validation == TagValidation::kWarn && mine != tag) {
    std::cerr << "[stepwise] warning: rank " << ctx->rank() << " passed checkpoint tag \"" << mine
              << "\", rank 0 \"" << tag << "\"; saving as \"" << tag
              << "\" on every rank (checkpoint.tag_validation is Warn)\n";
  }
  return tag;
}

// The shared file of `<dir>/<tag>`: stepwise's own, or one tools/deepspeed-to-stepwise
// converted; CheckpointError listing the tags present when there is neither.
void read_shared(const std::string& dir, const std::string& tag, const Setup& setup,
                 ReadCheckpoint& c) {
  const std::string states_file = (fs::path(c.path) / kModelStatesFile).string();
  const std::string deepspeed_file = (fs::path(c.path) / kDeepSpeedFile).string();
  if (!fs::exists(states_file) && fs::exists(deepspeed_file)) {
    const c10::IValue ds = read_foreign_pickle(deepspeed_file);
    STEPWISE_CHECK(ds.isGenericDict(), CheckpointError, "checkpoint file ", deepspeed_file,
                   " does not hold a dict: write it with tools/deepspeed-to-stepwise");
    // Through the saved format, so that its entries are checked as stepwise's own are.
    c.shared = shared_state_from(reading(deepspeed_file,
                                         [&] {
                                           return to_ivalue(from_deepspeed(
                                               ds.toGenericDict(), deepspeed_file,
                                               setup.gradient_accumulation_steps, setup.precision));
                                         }),
                                 deepspeed_file);
    c.shared_file = deepspeed_file;
    return;
  }
  if (!fs::exists(states_file)) {
    std::string present;
    for (const auto& t : checkpoint_tags(dir)) present += " " + t;
    throw CheckpointError(c10::str(
        "no checkpoint \"", tag, "\" in ", dir, ": ",
        present.empty() ? std::string("it holds none") : "the tags present are:" + present));
  }
  c.shared = shared_state_from(read_pickle(states_file), states_file);
  c.shared_file = states_file;
}

// Everything a load reads, checked for what the files alone can say.
ReadCheckpoint read_checkpoint(const std::string& dir, const std::string& tag,
                               const LoadOptions& options, const Setup& setup) {
  ReadCheckpoint c;
  c.path = (fs::path(dir) / tag).string();
  read_shared(dir, tag, setup, c);
  c.full = !options.load_module_only();
  if (!c.full) return c;
  c.continue_window = c.shared.mid_window() && options.load_window();
  if (c.continue_window) check_window_setup(c, setup);
  // This rank's window file: its pending gradients (continue_window) and its loss of the
  // last window. A rank the saving run did not have (a larger W, at a boundary) has none.
  c.window_file = (fs::path(c.path) / window_file(distributed::rank())).string();
  const bool converted = c.shared.deepspeed_optimizer.has_value();
  if (!converted && (c.continue_window || fs::exists(c.window_file))) {
    c.window = rank_window_from(read_pickle(c.window_file), c.window_file);
    check_window_matches_shared(c);
  }
  return c;
}

}  // namespace

std::string save_checkpoint(distributed::Context* ctx, const std::string& dir, std::string tag,
                            TagValidation validation, bool save_latest, const SaveSource& source) {
  const int64_t rank = ctx ? ctx->rank() : 0;
  tag = agreed_tag(ctx, std::move(tag), validation);
  const std::string partial = partial_folder(dir, tag);
  try {
    phase(ctx, "checkpoint save: creating the folder", [&] {
      if (rank != 0) return;
      std::error_code ec;
      fs::create_directories(dir, ec);
      STEPWISE_CHECK(!ec, CheckpointError, "cannot create checkpoint directory ", dir, ": ",
                     ec.message());
      make_partial_folder(partial);
    });
    phase(ctx, "checkpoint save: writing the files", [&] {
      write_pickle((fs::path(partial) / window_file(rank)).string(), to_ivalue(source.window()));
      if (source.shard) {
        torch::serialize::OutputArchive shard;
        source.shard(shard);
        write_archive((fs::path(partial) / zero_shard_file(rank)).string(), shard);
      }
      if (rank != 0) return;
      write_pickle((fs::path(partial) / kModelStatesFile).string(), to_ivalue(source.shared()));
      if (source.optimizer) {
        torch::serialize::OutputArchive optimizer_archive;
        source.optimizer(optimizer_archive);
        write_archive((fs::path(partial) / kOptimizerFile).string(), optimizer_archive);
      }
    });
    phase(ctx, "checkpoint save: publishing", [&] {
      if (rank != 0) return;
      publish(partial, dir, tag);
      if (save_latest) write_latest(dir, tag);
    });
  } catch (...) {  // a CheckpointError, or a DistributedError: a rank died or timed out
    if (rank == 0) remove_tree(partial);  // what the failed save wrote; the last one stays
    throw;
  }
  return (fs::path(dir) / tag).string();
}

LoadedCheckpoint load_checkpoint(distributed::Context* ctx, const std::string& dir,
                                 const LoadOptions& options, const Setup& setup,
                                 const std::function<void(const ReadCheckpoint&)>& check,
                                 const std::function<void(const ReadCheckpoint&)>& apply) {
  std::string tag;
  phase(ctx, "checkpoint load: finding the tag", [&] {
    tag = options.tag() ? *options.tag() : read_latest(dir);
    check_tag(tag);
  });
  STEPWISE_CHECK(!ctx || same_tag_everywhere(*ctx, tag), CheckpointError,
                 "the ranks are loading different checkpoints (this rank: \"", tag,
                 "\"): pass the same LoadOptions().tag(...) on every rank, or none");
  ReadCheckpoint c;
  phase(ctx, "checkpoint load: reading and checking", [&] {
    c = read_checkpoint(dir, tag, options, setup);
    reading(c.shared_file, [&] { check(c); });
  });
  phase(ctx, "checkpoint load: loading", [&] { apply(c); });
  return LoadedCheckpoint{c.path, std::move(c.shared.client_state)};
}

}  // namespace stepwise::detail
