// Engine::save_checkpoint and Engine::load_checkpoint. see NOTE: [checkpoint layout]
#include <stepwise/engine.h>

#include <torch/serialize.h>
#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include "check.h"
#include "checkpoint_deepspeed.h"
#include "checkpoint_files.h"
#include "checkpoint_optimizer.h"
#include "engine_state.h"
#include "leftover_checks.h"
#include "lr_schedules_detail.h"

#include <cmath>
#include <exception>
#include <filesystem>
#include <functional>
#include <iostream>

namespace stepwise {

namespace detail {

// What a load will do, worked out (and checked) before it changes anything.
struct LoadPlan {
  std::string path;
  std::string states_file;
  c10::impl::GenericDict states{c10::StringType::get(), c10::AnyType::get()};
  std::optional<c10::impl::GenericDict> window;  // this rank's window file, when read
  bool full = false;                             // not load_module_only
  bool continue_window = false;                  // the pending gradients are loaded
  int64_t saved_gas = 1;
  std::vector<std::pair<torch::Tensor, torch::Tensor>> copies;  // (target, value)
  std::vector<torch::Tensor> window_grads;  // by trainable index; undefined: none
  bool load_optimizer = false;
  torch::serialize::InputArchive optimizer_archive;
  c10::IValue deepspeed_optimizer;  // None: none to apply
  // The scheduler's position, when loaded: its step count, the engine's steps, the lrs.
  std::optional<std::pair<int64_t, int64_t>> scheduler_steps;
  std::vector<double> scheduler_lrs;
  std::optional<LossScalerState> scaler;
  AccumulatorState counters;
  std::vector<torch::Tensor> window_losses;
  std::vector<torch::Tensor> last_window_losses;
  double last_window_factor = 1.0;
  bool was_step_applied = false;
  double global_grad_norm = 0.0;
  ClientState client_state;
};

}  // namespace detail

namespace {

namespace fs = std::filesystem;
using Dict = c10::impl::GenericDict;
using detail::entry;

#ifndef STEPWISE_VERSION
#define STEPWISE_VERSION "unknown"
#endif

Dict new_dict() { return Dict(c10::StringType::get(), c10::AnyType::get()); }

const char* precision_name(PrecisionMode mode) {
  switch (mode) {
    case PrecisionMode::kFp16:
      return "fp16";
    case PrecisionMode::kBf16:
      return "bf16";
    default:
      return "fp32";
  }
}

// NOTE: [checkpoint phases] With W > 1 a save or a load runs in phases, each ended by
// one all-gather of every rank's "it went well" flag. A rank whose phase threw rethrows
// its own error; the others throw a CheckpointError naming the ranks that failed. So an
// error on one rank (a full disk, a missing or corrupted window file) reaches every rank
// at once instead of leaving the others in the next collective until the timeout, and a
// load changes nothing on any rank unless every rank's checks passed. With W = 1 a phase
// just runs.
// A file system's or LibTorch's own error inside a phase becomes a CheckpointError naming
// the phase, so a caller only ever sees CheckpointError (or DistributedError: a rank died).
template <typename F>
void phase(distributed::Context* ctx, const std::string& what, F&& run) {
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

// A saved number out of its range: a damaged or foreign file (the checksum passed).
void check_field(bool ok, const std::string& file, const char* key, double value,
                 const char* range) {
  STEPWISE_CHECK(ok, CheckpointError, "checkpoint file ", file, " holds ", key, " = ", value,
                 ", which must be ", range,
                 ": the file is damaged or was not written by "
                 "stepwise's save_checkpoint");
}

std::string shape_of(const torch::Tensor& t) { return c10::str(t.sizes()); }

// The config as saved: the JSON it was parsed from, with the batch sizes resolved (only
// those for a Config built in C++, which has no JSON text).
std::string resolved_config(const Config& config, const BatchSizes& sizes) {
  auto json =
      config.json_text.empty() ? nlohmann::json::object() : nlohmann::json::parse(config.json_text);
  json["train_batch_size"] = sizes.train_batch_size;
  json["train_micro_batch_size_per_gpu"] = sizes.micro_batch;
  json["gradient_accumulation_steps"] = sizes.gradient_accumulation_steps;
  return json.dump();
}

}  // namespace

c10::IValue Engine::State::model_states(const ClientState& client_state) const {
  const auto names = detail::trainable_names(*model_);
  c10::Dict<std::string, at::Tensor> module;
  for (const auto& item : model_->named_parameters())
    module.insert(item.key(), item.value().detach());
  for (const auto& item : model_->named_buffers()) module.insert(item.key(), item.value().detach());
  Dict d = new_dict();
  d.insert("module", module);
  if (precision_->mode() != PrecisionMode::kFp32) {
    c10::Dict<std::string, at::Tensor> masters;
    const auto& params = precision_->optimizer_params();
    for (size_t i = 0; i < params.size(); ++i) masters.insert(names[i], params[i].detach());
    d.insert("fp32_masters", masters);
  }
  d.insert("optimizer_type", detail::optimizer_type(*optimizer_));
  if (scheduler_) {
    Dict s = new_dict();
    s.insert("step_count", scheduler_step_count(*scheduler_));
    s.insert("steps_taken", scheduler_steps_taken_);
    s.insert("lrs", c10::List<double>(get_lr()));
    d.insert("lr_scheduler", s);
  } else {
    d.insert("lr_scheduler", c10::IValue());
  }
  if (const LossScaler* scaler = precision_->scaler()) {
    const LossScalerState st = scaler->state();
    Dict s = new_dict();
    s.insert("scale", st.scale);
    s.insert("iteration", st.iteration);
    s.insert("last_overflow_iteration", st.last_overflow_iteration);
    s.insert("hysteresis_left", st.hysteresis_left);
    d.insert("loss_scaler", s);
  } else {
    d.insert("loss_scaler", c10::IValue());
  }
  const AccumulatorState acc = accumulator_.state();
  d.insert("global_steps", acc.global_steps);
  d.insert("global_samples", acc.global_samples);
  d.insert("skipped_steps", acc.skipped_steps);
  d.insert("micro_steps", acc.micro_steps);
  // The window in progress as every rank sees it (its gradients are in the window files).
  d.insert("window_micro_batches", acc.window_backwards);
  d.insert("window_awaiting_step", acc.awaiting_step);
  d.insert("manual_boundary",
           acc.manual_boundary ? static_cast<int64_t>(*acc.manual_boundary) : int64_t{-1});
  d.insert("dp_world_size", sizes_.world_size);
  d.insert("gradient_accumulation_steps", accumulator_.gas());
  d.insert("precision", std::string(precision_name(precision_->mode())));
  d.insert("ds_config", resolved_config(config_, sizes_));
  d.insert("stepwise_version", std::string(STEPWISE_VERSION));
  d.insert("was_step_applied", was_step_applied_);
  d.insert("global_grad_norm", global_grad_norm_);
  Dict client = new_dict();
  for (const auto& [key, value] : client_state) client.insert(key, value);
  d.insert("client_state", client);
  return d;
}

c10::IValue Engine::State::window_state() const {
  const AccumulatorState acc = accumulator_.state();
  Dict d = new_dict();
  d.insert("rank", distributed::rank());
  d.insert("world_size", sizes_.world_size);
  d.insert("micro_steps", acc.micro_steps);
  d.insert("window_backwards", acc.window_backwards);
  d.insert("window_scaled", acc.window_scaled);
  c10::Dict<std::string, at::Tensor> grads;
  const auto names = detail::trainable_names(*model_);
  const auto& params = precision_->model_params();
  for (size_t i = 0; i < params.size(); ++i) {
    if (params[i].grad().defined()) grads.insert(names[i], params[i].grad().detach());
  }
  d.insert("grads", grads);
  d.insert("window_losses", c10::List<at::Tensor>(window_losses_));
  // This rank's loss of the last finished window (window_loss()).
  d.insert("last_window_losses", c10::List<at::Tensor>(last_window_losses_));
  d.insert("last_window_factor", last_window_factor_);
  return d;
}

std::string Engine::State::save_checkpoint(const std::string& dir, const SaveOptions& options) {
  std::string tag = options.tag().value_or(c10::str("global_step", accumulator_.global_steps()));
  const auto context = sizes_.world_size > 1 ? distributed::default_context() : nullptr;
  distributed::Context* ctx = context.get();
  const int64_t rank = ctx ? ctx->rank() : 0;
  phase(ctx, "checkpoint save: tag check", [&] { detail::check_tag(tag); });
  if (ctx && !same_tag_everywhere(*ctx, tag)) {
    const auto validation = config_.checkpoint.tag_validation();
    STEPWISE_CHECK(validation != TagValidation::kFail, CheckpointError,
                   "the ranks passed different checkpoint tags (this rank: \"", tag,
                   "\"); nothing was written. Pass the same tag on every rank, or leave it "
                   "unset (\"global_step<N>\")");
    const std::string mine = tag;
    tag = rank0_text(*ctx, tag);  // every rank saves under rank 0's tag
    if (validation == TagValidation::kWarn && mine != tag) {
      std::cerr << "[stepwise] warning: rank " << rank << " passed checkpoint tag \"" << mine
                << "\", rank 0 \"" << tag << "\"; saving as \"" << tag
                << "\" on every rank (checkpoint.tag_validation is Warn)\n";
    }
  }
  const std::string partial = detail::partial_folder(dir, tag);
  try {
    phase(ctx, "checkpoint save: creating the folder", [&] {
      if (rank != 0) return;
      std::error_code ec;
      fs::create_directories(dir, ec);
      STEPWISE_CHECK(!ec, CheckpointError, "cannot create checkpoint directory ", dir, ": ",
                     ec.message());
      detail::make_partial_folder(partial);
    });
    phase(ctx, "checkpoint save: writing the files", [&] {
      detail::write_pickle((fs::path(partial) / detail::window_file(rank)).string(),
                           window_state());
      if (rank != 0) return;
      detail::write_pickle((fs::path(partial) / detail::kModelStatesFile).string(),
                           model_states(options.client_state()));
      torch::serialize::OutputArchive optimizer_archive;
      detail::save_optimizer(*optimizer_, optimizer_archive);
      detail::write_archive((fs::path(partial) / detail::kOptimizerFile).string(),
                            optimizer_archive);
    });
    phase(ctx, "checkpoint save: publishing", [&] {
      if (rank != 0) return;
      detail::publish(partial, dir, tag);
      if (options.save_latest()) detail::write_latest(dir, tag);
    });
  } catch (...) {  // a CheckpointError, or a DistributedError: a rank died or timed out
    if (rank == 0) {
      detail::remove_tree(partial);  // what the failed save wrote; the last checkpoint stays
    }
    throw;
  }
  return (fs::path(dir) / tag).string();
}

LoadedCheckpoint Engine::State::load_checkpoint(const std::string& dir,
                                                const LoadOptions& options) {
  const auto context = sizes_.world_size > 1 ? distributed::default_context() : nullptr;
  distributed::Context* ctx = context.get();
  std::string tag;
  phase(ctx, "checkpoint load: finding the tag", [&] {
    tag = options.tag() ? *options.tag() : detail::read_latest(dir);
    detail::check_tag(tag);
  });
  STEPWISE_CHECK(!ctx || same_tag_everywhere(*ctx, tag), CheckpointError,
                 "the ranks are loading different checkpoints (this rank: \"", tag,
                 "\"): pass the same LoadOptions().tag(...) on every rank, or none");
  detail::LoadPlan plan;
  phase(ctx, "checkpoint load: reading and checking", [&] { plan_load(dir, tag, options, plan); });
  phase(ctx, "checkpoint load: loading", [&] { apply_load(plan); });
  return LoadedCheckpoint{plan.path, std::move(plan.client_state)};
}

void Engine::State::plan_load(const std::string& dir, const std::string& tag,
                              const LoadOptions& options, detail::LoadPlan& plan) const {
  plan.path = (fs::path(dir) / tag).string();
  plan.full = !options.load_module_only();
  const std::string states_file = (fs::path(plan.path) / detail::kModelStatesFile).string();
  const std::string deepspeed_file = (fs::path(plan.path) / detail::kDeepSpeedFile).string();
  const std::string precision = precision_name(precision_->mode());
  const int64_t gas = accumulator_.gas();
  if (!fs::exists(states_file) && fs::exists(deepspeed_file)) {
    const c10::IValue ds = detail::read_foreign_pickle(deepspeed_file);
    STEPWISE_CHECK(ds.isGenericDict(), CheckpointError, "checkpoint file ", deepspeed_file,
                   " does not hold a dict: write it with tools/deepspeed-to-stepwise");
    plan.states = detail::reading(deepspeed_file, [&] {
      return detail::from_deepspeed(ds.toGenericDict(), deepspeed_file, gas, precision);
    });
    plan.states_file = deepspeed_file;
  } else {
    if (!fs::exists(states_file)) {
      std::string present;
      for (const auto& t : checkpoint_tags(dir)) present += " " + t;
      throw CheckpointError(c10::str(
          "no checkpoint \"", tag, "\" in ", dir, ": ",
          present.empty() ? std::string("it holds none") : "the tags present are:" + present));
    }
    const c10::IValue states = detail::read_pickle(states_file);
    STEPWISE_CHECK(states.isGenericDict(), CheckpointError, "checkpoint file ", states_file,
                   " does not hold a dict: it was not written by stepwise's save_checkpoint");
    plan.states = states.toGenericDict();
    plan.states_file = states_file;
  }
  // Everything below reads entries through reading(): a value of another type (a file
  // from another version) is a CheckpointError naming the file too.
  detail::reading(plan.states_file, [&] { check_load(options, plan); });
}

void Engine::State::check_load(const LoadOptions& options, detail::LoadPlan& plan) const {
  const Dict& states = plan.states;
  const std::string& file = plan.states_file;
  for (const auto& e : entry(states, "client_state", file).toGenericDict()) {
    plan.client_state.emplace(e.key().toStringRef(), e.value());
  }
  // The weights: every name, shape and dtype.
  std::map<std::string, torch::Tensor> saved;
  for (const auto& e : entry(states, "module", file).toGenericDict()) {
    saved.emplace(e.key().toStringRef(), e.value().toTensor());
  }
  std::map<std::string, torch::Tensor> targets;
  for (const auto& item : model_->named_parameters()) targets.emplace(item.key(), item.value());
  for (const auto& item : model_->named_buffers()) targets.emplace(item.key(), item.value());
  const auto check_fits = [&](const std::string& name, const torch::Tensor& value,
                              const torch::Tensor& target, const char* what) {
    STEPWISE_CHECK(value.sizes() == target.sizes(), CheckpointError, what, " \"", name,
                   "\" has shape ", shape_of(value), " in ", file, " but ", shape_of(target),
                   " in this model");
    STEPWISE_CHECK(value.is_floating_point() == target.is_floating_point() &&
                       (target.is_floating_point() || value.dtype() == target.dtype()),
                   CheckpointError, what, " \"", name, "\" is ", value.dtype(), " in ", file,
                   " but ", target.dtype(), " in this model");
  };
  for (const auto& [name, target] : targets) {
    const auto it = saved.find(name);
    STEPWISE_CHECK(it != saved.end() || !options.load_module_strict(), CheckpointError,
                   "parameter or buffer \"", name, "\" of this model is not in ", file,
                   ": load the checkpoint of the same model, or pass "
                   "LoadOptions().load_module_strict(false) to keep its current value");
    if (it != saved.end()) check_fits(name, it->second, target, "parameter");
  }
  if (options.load_module_strict()) {
    for (const auto& [name, tensor] : saved) {
      STEPWISE_CHECK(targets.count(name) != 0, CheckpointError, "\"", name, "\" in ", file,
                     " is not a parameter or buffer of this model: load the checkpoint of the "
                     "same model, or pass LoadOptions().load_module_strict(false) to ignore it");
    }
  }
  // The fp32 master weights, by name: each trainable parameter loaded needs its own.
  std::map<std::string, torch::Tensor> saved_masters;
  const auto masters_it = states.find(c10::IValue(std::string("fp32_masters")));
  if (masters_it != states.end()) {
    for (const auto& e : masters_it->value().toGenericDict()) {
      saved_masters.emplace(e.key().toStringRef(), e.value().toTensor());
    }
  }
  const auto names = detail::trainable_names(*model_);
  std::map<std::string, size_t> trainable_index;
  for (size_t i = 0; i < names.size(); ++i) trainable_index.emplace(names[i], i);
  const auto& model_params = precision_->model_params();
  const auto& masters = precision_->optimizer_params();
  for (const auto& [name, target] : targets) {
    const auto it = saved.find(name);
    if (it == saved.end()) continue;
    const auto t = trainable_index.find(name);
    if (t == trainable_index.end()) {
      plan.copies.emplace_back(target, it->second);
      continue;
    }
    const size_t i = t->second;
    torch::Tensor precise = it->second;
    if (masters_it != states.end()) {
      const auto m = saved_masters.find(name);
      STEPWISE_CHECK(m != saved_masters.end(), CheckpointError, file,
                     " has no fp32 master weight for parameter \"", name,
                     "\": it was not written by stepwise's save_checkpoint for this model");
      check_fits(name, m->second, target, "the fp32 master weight of parameter");
      precise = m->second;
    }
    if (masters[i].is_same(model_params[i])) {
      plan.copies.emplace_back(model_params[i], precise);
    } else {
      plan.copies.emplace_back(masters[i], precise);
      plan.copies.emplace_back(model_params[i], it->second);
    }
  }
  if (!plan.full) return;

  // The window in progress: the same on every rank (rank 0's counts are in the shared
  // file), so every rank decides alike.
  const int64_t saved_world = entry(states, "dp_world_size", file).toInt();
  plan.saved_gas = entry(states, "gradient_accumulation_steps", file).toInt();
  const std::string saved_precision = entry(states, "precision", file).toStringRef();
  const std::string precision = precision_name(precision_->mode());
  const int64_t pending = entry(states, "window_micro_batches", file).toInt();
  check_field(pending >= 0, file, "window_micro_batches", static_cast<double>(pending), ">= 0");
  const bool mid_window = pending > 0 || entry(states, "window_awaiting_step", file).toBool();
  plan.continue_window = mid_window && options.load_window();
  if (plan.continue_window) {
    const auto reason = saved_world != sizes_.world_size
                            ? c10::str("world size ", saved_world, " (now ", sizes_.world_size, ")")
                        : plan.saved_gas != accumulator_.gas()
                            ? c10::str("gradient_accumulation_steps ", plan.saved_gas, " (now ",
                                       accumulator_.gas(), ")")
                        : saved_precision != precision
                            ? c10::str("precision ", saved_precision, " (now ", precision, ")")
                            : std::string();
    STEPWISE_CHECK(reason.empty(), CheckpointError, "checkpoint ", plan.path,
                   " was saved inside an accumulation window (", pending,
                   pending == 1 ? " micro-batch" : " micro-batches", " pending) with ", reason,
                   ": its pending gradients belong to that setup. Resume it with the same GAS, "
                   "world size and precision, or save at a boundary (a different world size "
                   "is allowed there), or pass LoadOptions().load_window(false) to drop them");
  }
  // This rank's window file: its pending gradients (continue_window) and its loss of the
  // last window. A rank the saving run did not have (a larger W, at a boundary) has none.
  const std::string window_path =
      (fs::path(plan.path) / detail::window_file(distributed::rank())).string();
  const bool converted = states.contains(c10::IValue(std::string("deepspeed_optimizer")));
  if (!converted && (plan.continue_window || fs::exists(window_path))) {
    const c10::IValue window = detail::read_pickle(window_path);
    STEPWISE_CHECK(window.isGenericDict(), CheckpointError, "checkpoint file ", window_path,
                   " does not hold a dict: it was not written by stepwise's save_checkpoint");
    plan.window = window.toGenericDict();
    detail::reading(window_path, [&] {
      const Dict& w = *plan.window;
      const int64_t micro = entry(w, "micro_steps", window_path).toInt();
      const int64_t saved_micro = entry(states, "micro_steps", file).toInt();
      STEPWISE_CHECK(micro == saved_micro, CheckpointError, "checkpoint file ", window_path,
                     " was saved at micro-step ", micro, ", ", file, " at ", saved_micro,
                     ": the folder mixes two saves");
      for (const auto& l : entry(w, "last_window_losses", window_path).toTensorList()) {
        plan.last_window_losses.push_back(l);
      }
      plan.last_window_factor = entry(w, "last_window_factor", window_path).toDouble();
      if (!plan.continue_window) return;
      plan.counters.window_backwards = entry(w, "window_backwards", window_path).toInt();
      plan.counters.window_scaled = entry(w, "window_scaled", window_path).toInt();
      check_field(plan.counters.window_backwards == pending, window_path, "window_backwards",
                  static_cast<double>(plan.counters.window_backwards),
                  c10::str("the shared file's window_micro_batches (", pending, ")").c_str());
      check_field(plan.counters.window_scaled >= 0 &&
                      plan.counters.window_scaled <= plan.counters.window_backwards,
                  window_path, "window_scaled", static_cast<double>(plan.counters.window_scaled),
                  "in 0..window_backwards");
      for (const auto& l : entry(w, "window_losses", window_path).toTensorList()) {
        plan.window_losses.push_back(l);
      }
      plan.window_grads.assign(names.size(), torch::Tensor());
      for (const auto& e : entry(w, "grads", window_path).toGenericDict()) {
        const std::string& name = e.key().toStringRef();
        const auto t = trainable_index.find(name);
        STEPWISE_CHECK(t != trainable_index.end(), CheckpointError, "checkpoint file ", window_path,
                       " holds a gradient of \"", name,
                       "\", which is not a trainable parameter of this model");
        const auto& param = model_params[t->second];
        check_fits(name, e.value().toTensor(), param, "the pending gradient of parameter");
        plan.window_grads[t->second] = e.value().toTensor().to(param.options()).clone();
      }
    });
  }

  read_states(options, plan);

  // The optimizer: the same type and parameter groups.
  const auto ds_optimizer = states.find(c10::IValue(std::string("deepspeed_optimizer")));
  if (!options.load_optimizer_states()) return;
  if (ds_optimizer != states.end()) {
    if (ds_optimizer->value().isNone()) return;
    const std::string mismatch =
        detail::deepspeed_optimizer_mismatch(*optimizer_, ds_optimizer->value());
    STEPWISE_CHECK(
        mismatch.empty(), CheckpointError, "the DeepSpeed optimizer state in ", plan.path,
        " does not fit this engine's optimizer: ", mismatch,
        ". Build the same optimizer, or pass LoadOptions().load_optimizer_states(false)");
    plan.deepspeed_optimizer = ds_optimizer->value();
    return;
  }
  const std::string saved_type = entry(states, "optimizer_type", file).toStringRef();
  const std::string type = detail::optimizer_type(*optimizer_);
  STEPWISE_CHECK(saved_type == type, CheckpointError, file, " holds the state of a ", saved_type,
                 "; this engine's optimizer is a ", type,
                 ": build the same optimizer, or pass "
                 "LoadOptions().load_optimizer_states(false)");
  const std::string optimizer_file = (fs::path(plan.path) / detail::kOptimizerFile).string();
  detail::read_archive(optimizer_file, plan.optimizer_archive);
  std::map<const c10::TensorImpl*, std::string> param_names;
  for (size_t i = 0; i < names.size(); ++i) {
    param_names.emplace(masters[i].unsafeGetTensorImpl(), names[i]);
    param_names.emplace(model_params[i].unsafeGetTensorImpl(), names[i]);
  }
  const auto name_of = [&](const torch::Tensor& p) {
    const auto it = param_names.find(p.unsafeGetTensorImpl());
    return it != param_names.end() ? it->second : std::string("(not a parameter of the model)");
  };
  const std::string mismatch =
      detail::optimizer_mismatch(*optimizer_, plan.optimizer_archive, optimizer_file, name_of);
  STEPWISE_CHECK(mismatch.empty(), CheckpointError, "the optimizer state in ", optimizer_file,
                 " does not fit this engine's optimizer: ", mismatch,
                 ". Build the same optimizer, or pass LoadOptions().load_optimizer_states(false)");
  plan.load_optimizer = true;
}

void Engine::State::read_states(const LoadOptions& options, detail::LoadPlan& plan) const {
  const Dict& states = plan.states;
  const std::string& file = plan.states_file;
  // NOTE: [saved fields] every number a load applies is in its range first, so a damaged
  // file is refused here and never trains from nonsense.
  const auto check_count = [&](const char* key, int64_t value, int64_t low = 0) {
    check_field(value >= low, file, key, static_cast<double>(value), low == 0 ? ">= 0" : ">= -1");
  };
  const auto& sched = entry(states, "lr_scheduler", file);
  if (scheduler_ && !sched.isNone() && options.load_lr_scheduler_states()) {
    const auto s = sched.toGenericDict();
    plan.scheduler_steps.emplace(entry(s, "step_count", file).toInt(),
                                 entry(s, "steps_taken", file).toInt());
    check_count("lr_scheduler.step_count", plan.scheduler_steps->first);
    const int64_t taken = plan.scheduler_steps->second;
    check_field(taken >= 0 && taken <= plan.scheduler_steps->first, file,
                "lr_scheduler.steps_taken", static_cast<double>(taken),
                "in 0..lr_scheduler.step_count");
    const auto lrs = s.find(c10::IValue(std::string("lrs")));  // none from DeepSpeed
    if (lrs != s.end()) plan.scheduler_lrs = lrs->value().toDoubleVector();
    STEPWISE_CHECK(lrs == s.end() || plan.scheduler_lrs.size() == optimizer_->param_groups().size(),
                   CheckpointError, "checkpoint file ", file, " holds ", plan.scheduler_lrs.size(),
                   " scheduler lrs for ", optimizer_->param_groups().size(),
                   " parameter groups: build the same optimizer, or pass "
                   "LoadOptions().load_lr_scheduler_states(false)");
    for (double lr : plan.scheduler_lrs) {
      check_field(std::isfinite(lr) && lr >= 0.0, file, "an lr of lr_scheduler.lrs", lr,
                  "finite and >= 0");
    }
  }
  const auto& scaler = entry(states, "loss_scaler", file);
  if (precision_->scaler() != nullptr && !scaler.isNone()) {
    const auto s = scaler.toGenericDict();
    plan.scaler =
        LossScalerState{entry(s, "scale", file).toDouble(), entry(s, "iteration", file).toInt(),
                        entry(s, "last_overflow_iteration", file).toInt(),
                        entry(s, "hysteresis_left", file).toInt()};
    check_field(std::isfinite(plan.scaler->scale) && plan.scaler->scale > 0.0, file,
                "loss_scaler.scale", plan.scaler->scale, "finite and > 0");
    check_count("loss_scaler.iteration", plan.scaler->iteration);
    check_count("loss_scaler.last_overflow_iteration", plan.scaler->last_overflow_iteration, -1);
    check_count("loss_scaler.hysteresis_left", plan.scaler->hysteresis_left);
  }
  AccumulatorState& acc = plan.counters;
  acc.micro_steps = entry(states, "micro_steps", file).toInt();
  acc.global_steps = entry(states, "global_steps", file).toInt();
  acc.skipped_steps = entry(states, "skipped_steps", file).toInt();
  acc.global_samples = entry(states, "global_samples", file).toInt();
  check_count("micro_steps", acc.micro_steps);
  check_count("global_steps", acc.global_steps);
  check_field(acc.skipped_steps >= 0 && acc.skipped_steps <= acc.global_steps, file,
              "skipped_steps", static_cast<double>(acc.skipped_steps), "in 0..global_steps");
  check_count("global_samples", acc.global_samples);
  const int64_t manual = entry(states, "manual_boundary", file).toInt();
  check_field(manual >= -1 && manual <= 1, file, "manual_boundary", static_cast<double>(manual),
              "-1 (none), 0 or 1");
  if (manual >= 0) acc.manual_boundary = manual == 1;
  if (plan.continue_window) {
    acc.awaiting_step = entry(states, "window_awaiting_step", file).toBool();
  } else {
    acc.micro_steps = accumulator_.after_dropped_window(acc.micro_steps, plan.saved_gas);
  }
  plan.was_step_applied = entry(states, "was_step_applied", file).toBool();
  plan.global_grad_norm = entry(states, "global_grad_norm", file).toDouble();
}

void Engine::State::apply_load(detail::LoadPlan& plan) {
  if (plan.load_optimizer) detail::load_optimizer(*optimizer_, plan.optimizer_archive);
  if (!plan.deepspeed_optimizer.isNone()) {
    detail::apply_deepspeed_optimizer(*optimizer_, plan.deepspeed_optimizer);
  }
  {
    torch::NoGradGuard no_grad;
    for (auto& [target, value] : plan.copies) target.copy_(value);
  }
  if (plan.full) {
    if (scheduler_ && plan.scheduler_steps) {
      const auto [count, taken] = *plan.scheduler_steps;
      if (auto* schedule = dynamic_cast<Schedule*>(scheduler_.get())) {
        schedule->jump_to(count);  // the lrs (and OneCycle's beta1) from the schedule itself
      } else {
        // A client scheduler's state is its count and the optimizer's lrs, which a load
        // without the optimizer's state would not restore.
        set_scheduler_step_count(*scheduler_, count);
        auto& groups = optimizer_->param_groups();
        for (size_t i = 0; i < groups.size() && i < plan.scheduler_lrs.size(); ++i) {
          groups[i].options().set_lr(plan.scheduler_lrs[i]);
        }
      }
      scheduler_steps_taken_ = taken;
    }
    if (scheduler_) {
      scheduler_steps_at_start_ = scheduler_step_count(*scheduler_) - scheduler_steps_taken_;
    }
    if (plan.scaler) precision_->scaler()->restore(*plan.scaler);
    auto& model_params = precision_->model_params();
    for (size_t i = 0; i < model_params.size(); ++i) {
      model_params[i].mutable_grad() =
          plan.continue_window ? plan.window_grads[i] : torch::Tensor();
    }
    window_losses_ = plan.window_losses;
    accumulator_.restore(plan.counters);
    was_step_applied_ = plan.was_step_applied;
    global_grad_norm_ = plan.global_grad_norm;
    last_window_losses_ = plan.last_window_losses;
    last_window_factor_ = plan.last_window_factor;
    reducer_->restore_grads();  // W > 1: into the buckets (NOTE: [bucket views])
  }
  // The load changed weights and gradients on purpose: the guard rails start afresh.
  leftover_checks_ = std::make_unique<detail::LeftoverChecks>(
      config_.guard_rails, detail::trainable_names(*model_), precision_->model_params(),
      precision_->optimizer_params());
}

}  // namespace stepwise
