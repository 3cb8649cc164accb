// Engine::save_checkpoint and Engine::load_checkpoint. see NOTE: [checkpoint layout]
#include <stepwise/engine.h>

#include <torch/serialize.h>
#include <torch/torch.h>

#include <stepwise/fused_adamw.h>

#include "checkpoint_files.h"
#include "leftover_checks.h"
#include "torch_compat.h"

#include <filesystem>
#include <functional>
#include <iostream>

namespace stepwise {

namespace {

namespace fs = std::filesystem;
using Dict = c10::impl::GenericDict;

#ifndef STEPWISE_VERSION
#define STEPWISE_VERSION "unknown"
#endif

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

std::string optimizer_type(const torch::optim::Optimizer& optimizer) {
  return c10::demangle(typeid(optimizer).name());
}

// LibTorch 1.13's Optimizer::load restores the state but not the parameter groups'
// options (lr, betas, momentum, ...), so they are saved beside it, group by group, with
// each group's size so that a load can check them before it changes anything.
void save_optimizer(const torch::optim::Optimizer& optimizer,
                    torch::serialize::OutputArchive& archive) {
  torch::serialize::OutputArchive state(archive.compilation_unit());
  optimizer.save(state);
  archive.write("state", state);
  const auto& groups = optimizer.param_groups();
  std::vector<int64_t> sizes;
  for (const auto& g : groups) sizes.push_back(static_cast<int64_t>(g.params().size()));
  archive.write("group_sizes", torch::tensor(sizes, torch::kLong));
  for (size_t i = 0; i < groups.size(); ++i) {
    torch::serialize::OutputArchive options(archive.compilation_unit());
    groups[i].options().serialize(options);
    archive.write(c10::str("options/", i), options);
  }
}

// Why the archive does not fit `optimizer` (empty: it fits).
std::string optimizer_mismatch(torch::optim::Optimizer& optimizer,
                               torch::serialize::InputArchive& archive) {
  torch::Tensor sizes;
  archive.read("group_sizes", sizes);
  const auto& groups = optimizer.param_groups();
  if (sizes.numel() != static_cast<int64_t>(groups.size())) {
    return c10::str("it has ", sizes.numel(), " parameter groups, this optimizer ", groups.size());
  }
  for (size_t i = 0; i < groups.size(); ++i) {
    const int64_t saved = sizes[static_cast<int64_t>(i)].item<int64_t>();
    if (saved != static_cast<int64_t>(groups[i].params().size())) {
      return c10::str("its parameter group ", i, " has ", saved, " parameters, this optimizer's ",
                      groups[i].params().size());
    }
  }
  return "";
}

void load_optimizer(torch::optim::Optimizer& optimizer, torch::serialize::InputArchive& archive) {
  torch::serialize::InputArchive state;
  archive.read("state", state);
  optimizer.load(state);
  auto& groups = optimizer.param_groups();
  for (size_t i = 0; i < groups.size(); ++i) {
    torch::serialize::InputArchive options;
    archive.read(c10::str("options/", i), options);
    groups[i].options().serialize(options);
  }
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

const c10::IValue& entry(const Dict& dict, const char* key, const std::string& path) {
  const auto it = dict.find(c10::IValue(std::string(key)));
  STEPWISE_CHECK(it != dict.end(), CheckpointError, "checkpoint file ", path, " has no \"", key,
                 "\" entry: it was not written by stepwise's save_checkpoint (or "
                 "tools/deepspeed-to-stepwise)");
  return it->value();
}

std::string shape_of(const torch::Tensor& t) { return c10::str(t.sizes()); }

// A converted DeepSpeed checkpoint (tools/deepspeed-to-stepwise) as the entries of
// stepwise's own model-states file: a boundary checkpoint without a window.
Dict from_deepspeed(const Dict& ds, const std::string& file, int64_t gas,
                    const std::string& precision) {
  Dict d(c10::StringType::get(), c10::AnyType::get());
  c10::Dict<std::string, at::Tensor> module;
  for (const auto& pair : entry(ds, "module", file).toTuple()->elements().vec()) {
    const auto items = pair.toTuple()->elements().vec();  // (name, tensor)
    module.insert(items[0].toStringRef(), items[1].toTensor());
  }
  d.insert("module", module);
  d.insert("optimizer_type", std::string("deepspeed"));
  d.insert("deepspeed_optimizer", entry(ds, "optimizer", file));
  const auto scheduler = entry(ds, "lr_scheduler", file);
  if (scheduler.isNone()) {
    d.insert("lr_scheduler", c10::IValue());
  } else {
    // DeepSpeed's last_batch_iteration is k - 1 after k steps; stepwise counts k.
    const int64_t steps = scheduler.toInt() + 1;
    c10::Dict<std::string, int64_t> s;
    s.insert("step_count", steps);
    s.insert("steps_taken", steps);
    d.insert("lr_scheduler", s);
  }
  d.insert("loss_scaler", c10::IValue());
  const int64_t global_steps = entry(ds, "global_steps", file).toInt();
  d.insert("global_steps", global_steps);
  d.insert("global_samples", entry(ds, "global_samples", file));
  d.insert("skipped_steps", entry(ds, "skipped_steps", file));
  d.insert("micro_steps", global_steps * gas);  // DeepSpeed does not save it
  d.insert("dp_world_size", entry(ds, "dp_world_size", file));
  d.insert("gradient_accumulation_steps", gas);
  d.insert("precision", precision);
  d.insert("ds_config", entry(ds, "ds_config", file));
  d.insert("was_step_applied", false);
  d.insert("global_grad_norm", 0.0);
  d.insert("last_window_losses", c10::List<at::Tensor>());
  d.insert("last_window_factor", 1.0);
  d.insert("client_state", Dict(c10::StringType::get(), c10::AnyType::get()));
  return d;
}

// tools/deepspeed-to-stepwise's optimizer entry: (state, groups), with (index, step,
// exp_avg, exp_avg_sq) per parameter and (lr, betas, eps, weight_decay, indices) per group.
std::vector<c10::IValue> elements(const c10::IValue& tuple) {
  return tuple.toTuple()->elements().vec();  // a copy of the handles (TupleElements)
}

// Why that Adam/AdamW state (from DeepSpeed) does not fit `optimizer`.
std::string deepspeed_optimizer_mismatch(torch::optim::Optimizer& optimizer,
                                         const c10::IValue& saved) {
  const bool adam = dynamic_cast<torch::optim::Adam*>(&optimizer) != nullptr ||
                    dynamic_cast<torch::optim::AdamW*>(&optimizer) != nullptr ||
                    dynamic_cast<FusedAdamW*>(&optimizer) != nullptr;
  if (!adam) {
    return "only an Adam or AdamW state converts; this engine's optimizer is a " +
           optimizer_type(optimizer);
  }
  const auto groups = elements(elements(saved)[1]);
  const auto& mine = optimizer.param_groups();
  if (groups.size() != mine.size()) {
    return c10::str("it has ", groups.size(), " parameter groups, this optimizer ", mine.size());
  }
  std::vector<torch::Tensor> params;
  for (size_t i = 0; i < mine.size(); ++i) {
    const auto indices = elements(elements(groups[i])[4]);
    if (indices.size() != mine[i].params().size()) {
      return c10::str("its parameter group ", i, " has ", indices.size(),
                      " parameters, this optimizer's ", mine[i].params().size());
    }
    for (const auto& p : mine[i].params()) params.push_back(p);
  }
  for (const auto& entry : elements(elements(saved)[0])) {
    const auto e = elements(entry);
    const int64_t index = e[0].toInt();
    if (index < 0 || index >= static_cast<int64_t>(params.size())) {
      return c10::str("its state names parameter ", index, " of ", params.size());
    }
    const auto m = e[2].toTensor();
    if (m.sizes() != params[index].sizes()) {
      return c10::str("parameter ", index, "'s exp_avg has shape ", m.sizes(), ", the parameter ",
                      params[index].sizes());
    }
  }
  return "";
}

template <typename State, typename Options>
void apply_adam_state(torch::optim::Optimizer& optimizer, const c10::IValue& saved) {
  const auto groups = elements(elements(saved)[1]);
  std::vector<torch::Tensor> params;
  auto& mine = optimizer.param_groups();
  for (size_t i = 0; i < mine.size(); ++i) {
    const auto g = elements(groups[i]);
    const auto betas = elements(g[1]);
    static_cast<Options&>(mine[i].options())
        .lr(g[0].toDouble())
        .betas({betas[0].toDouble(), betas[1].toDouble()})
        .eps(g[2].toDouble())
        .weight_decay(g[3].toDouble());
    for (const auto& p : mine[i].params()) params.push_back(p);
  }
  for (const auto& entry : elements(elements(saved)[0])) {
    const auto e = elements(entry);
    const auto& p = params[static_cast<size_t>(e[0].toInt())];
    auto state = std::make_unique<State>();
    state->step(e[1].toInt());
    state->exp_avg(e[2].toTensor().to(p.options()).clone());
    state->exp_avg_sq(e[3].toTensor().to(p.options()).clone());
    optimizer.state()[compat::state_key(optimizer, p)] = std::move(state);
  }
}

void apply_deepspeed_optimizer(torch::optim::Optimizer& optimizer, const c10::IValue& saved) {
  if (dynamic_cast<torch::optim::Adam*>(&optimizer) != nullptr) {
    apply_adam_state<torch::optim::AdamParamState, torch::optim::AdamOptions>(optimizer, saved);
  } else {
    apply_adam_state<torch::optim::AdamWParamState, torch::optim::AdamWOptions>(optimizer, saved);
  }
}

}  // namespace

c10::IValue Engine::model_states(const ClientState& client_state) const {
  c10::Dict<std::string, at::Tensor> module;
  for (const auto& item : model_->named_parameters())
    module.insert(item.key(), item.value().detach());
  for (const auto& item : model_->named_buffers()) module.insert(item.key(), item.value().detach());
  Dict d(c10::StringType::get(), c10::AnyType::get());
  d.insert("module", module);
  if (precision_->mode() != PrecisionMode::kFp32) {
    c10::List<at::Tensor> masters;
    for (const auto& m : precision_->optimizer_params()) masters.push_back(m.detach());
    d.insert("fp32_masters", masters);
  }
  d.insert("optimizer_type", optimizer_type(*optimizer_));
  if (scheduler_) {
    c10::Dict<std::string, int64_t> s;
    s.insert("step_count", scheduler_step_count(*scheduler_));
    s.insert("steps_taken", scheduler_steps_taken_);
    d.insert("lr_scheduler", s);
  } else {
    d.insert("lr_scheduler", c10::IValue());
  }
  if (const LossScaler* scaler = precision_->scaler()) {
    const LossScalerState st = scaler->state();
    Dict s(c10::StringType::get(), c10::AnyType::get());
    s.insert("scale", st.scale);
    s.insert("iteration", st.iteration);
    s.insert("last_overflow_iteration", st.last_overflow_iteration);
    s.insert("hysteresis_left", st.hysteresis_left);
    d.insert("loss_scaler", s);
  } else {
    d.insert("loss_scaler", c10::IValue());
  }
  d.insert("global_steps", global_steps());
  d.insert("global_samples", global_samples());
  d.insert("skipped_steps", skipped_steps());
  d.insert("micro_steps", micro_steps());
  d.insert("dp_world_size", sizes_.world_size);
  d.insert("gradient_accumulation_steps", sizes_.gradient_accumulation_steps);
  d.insert("precision", std::string(precision_name(precision_->mode())));
  d.insert("ds_config", config_.json_text);
  d.insert("stepwise_version", std::string(STEPWISE_VERSION));
  d.insert("was_step_applied", was_step_applied_);
  d.insert("global_grad_norm", global_grad_norm_);
  d.insert("last_window_losses", c10::List<at::Tensor>(last_window_losses_));
  d.insert("last_window_factor", last_window_factor_);
  Dict client(c10::StringType::get(), c10::AnyType::get());
  for (const auto& [key, value] : client_state) client.insert(key, value);
  d.insert("client_state", client);
  return d;
}

c10::IValue Engine::window_state() const {
  const AccumulatorState acc = accumulator_.state();
  Dict d(c10::StringType::get(), c10::AnyType::get());
  d.insert("rank", distributed::rank());
  d.insert("world_size", sizes_.world_size);
  d.insert("gradient_accumulation_steps", sizes_.gradient_accumulation_steps);
  d.insert("precision", std::string(precision_name(precision_->mode())));
  d.insert("micro_steps", acc.micro_steps);
  d.insert("global_steps", acc.global_steps);
  d.insert("skipped_steps", acc.skipped_steps);
  d.insert("global_samples", acc.global_samples);
  d.insert("window_backwards", acc.window_backwards);
  d.insert("window_scaled", acc.window_scaled);
  d.insert("awaiting_step", acc.awaiting_step);
  d.insert("manual_boundary",
           acc.manual_boundary ? static_cast<int64_t>(*acc.manual_boundary) : int64_t{-1});
  c10::Dict<std::string, at::Tensor> grads;
  const auto names = detail::trainable_names(*model_);
  auto& params = const_cast<Precision&>(*precision_).model_params();
  for (size_t i = 0; i < params.size(); ++i) {
    if (params[i].grad().defined()) grads.insert(names[i], params[i].grad().detach());
  }
  d.insert("grads", grads);
  d.insert("window_losses", c10::List<at::Tensor>(window_losses_));
  return d;
}

std::string Engine::save_checkpoint(const std::string& dir, const SaveOptions& options) {
  const std::string tag = options.tag().value_or(c10::str("global_step", global_steps()));
  detail::check_tag(tag);
  const auto ctx = sizes_.world_size > 1 ? distributed::default_context() : nullptr;
  const int64_t rank = ctx ? ctx->rank() : 0;
  if (ctx && config_.checkpoint.tag_validation != TagValidation::kIgnore &&
      !same_tag_everywhere(*ctx, tag)) {
    STEPWISE_CHECK(config_.checkpoint.tag_validation != TagValidation::kFail, CheckpointError,
                   "the ranks passed different checkpoint tags (this rank: \"", tag,
                   "\"); nothing was written. Pass the same tag on every rank, or leave it "
                   "unset (\"global_step<N>\")");
    if (rank == 0) {
      std::cerr << "[stepwise] warning: the ranks passed different checkpoint tags; saving as "
                   "rank 0's \""
                << tag << "\" (checkpoint.tag_validation is Warn)\n";
    }
  }
  const std::string partial = detail::partial_folder(dir, tag);
  if (rank == 0) {
    std::error_code ec;
    fs::create_directories(dir, ec);
    STEPWISE_CHECK(!ec, CheckpointError, "cannot create checkpoint directory ", dir, ": ",
                   ec.message());
    detail::make_partial_folder(partial);
  }
  if (ctx) ctx->barrier("checkpoint save: folder created");
  detail::write_pickle((fs::path(partial) / detail::window_file(rank)).string(), window_state());
  if (rank == 0) {
    detail::write_pickle((fs::path(partial) / detail::kModelStatesFile).string(),
                         model_states(options.client_state()));
    torch::serialize::OutputArchive optimizer_archive;
    save_optimizer(*optimizer_, optimizer_archive);
    detail::write_archive((fs::path(partial) / detail::kOptimizerFile).string(), optimizer_archive);
  }
  if (ctx) ctx->barrier("checkpoint save: files written");
  if (rank == 0) {
    detail::publish(partial, dir, tag);
    if (options.save_latest()) detail::write_latest(dir, tag);
  }
  if (ctx) ctx->barrier("checkpoint save: published");
  return (fs::path(dir) / tag).string();
}

LoadedCheckpoint Engine::load_checkpoint(const std::string& dir, const LoadOptions& options) {
  const std::string tag = options.tag() ? *options.tag() : detail::read_latest(dir);
  detail::check_tag(tag);
  const auto ctx = sizes_.world_size > 1 ? distributed::default_context() : nullptr;
  STEPWISE_CHECK(!ctx || same_tag_everywhere(*ctx, tag), CheckpointError,
                 "the ranks are loading different checkpoints (this rank: \"", tag,
                 "\"): pass the same LoadOptions().tag(...) on every rank, or none");
  const std::string path = (fs::path(dir) / tag).string();
  const std::string states_file = (fs::path(path) / detail::kModelStatesFile).string();
  const std::string deepspeed_file = (fs::path(path) / detail::kDeepSpeedFile).string();
  if (!fs::exists(states_file) && fs::exists(deepspeed_file)) {
    const c10::IValue ds = detail::read_foreign_pickle(deepspeed_file);
    STEPWISE_CHECK(ds.isGenericDict(), CheckpointError, "checkpoint file ", deepspeed_file,
                   " does not hold a dict: write it with tools/deepspeed-to-stepwise");
    const Dict states =
        from_deepspeed(ds.toGenericDict(), deepspeed_file, sizes_.gradient_accumulation_steps,
                       precision_name(precision_->mode()));
    load_states(states, nullptr, options, path);
    if (ctx) ctx->barrier("checkpoint load");
    return LoadedCheckpoint{path, {}};
  }
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
  std::optional<c10::IValue> window;
  const std::string window_path =
      (fs::path(path) / detail::window_file(distributed::rank())).string();
  if (!options.load_module_only() && fs::exists(window_path)) {
    window = detail::read_pickle(window_path);
  }
  const Dict window_dict =
      window ? window->toGenericDict() : Dict(c10::StringType::get(), c10::AnyType::get());
  load_states(states.toGenericDict(), window ? &window_dict : nullptr, options, path);
  if (ctx) ctx->barrier("checkpoint load");
  LoadedCheckpoint out{path, {}};
  for (const auto& e : entry(states.toGenericDict(), "client_state", states_file).toGenericDict()) {
    out.client_state.emplace(e.key().toStringRef(), e.value());
  }
  return out;
}

void Engine::load_states(const Dict& states, const Dict* window, const LoadOptions& options,
                         const std::string& path) {
  const bool converted = states.contains(c10::IValue(std::string("deepspeed_optimizer")));
  const std::string states_file =
      (fs::path(path) / (converted ? detail::kDeepSpeedFile : detail::kModelStatesFile)).string();
  // 1. Check everything, change nothing.
  const Dict module = entry(states, "module", states_file).toGenericDict();
  std::map<std::string, torch::Tensor> saved;
  for (const auto& e : module) saved.emplace(e.key().toStringRef(), e.value().toTensor());
  std::map<std::string, torch::Tensor> targets;
  for (const auto& item : model_->named_parameters()) targets.emplace(item.key(), item.value());
  for (const auto& item : model_->named_buffers()) targets.emplace(item.key(), item.value());
  for (const auto& [name, target] : targets) {
    const auto it = saved.find(name);
    STEPWISE_CHECK(it != saved.end() || !options.load_module_strict(), CheckpointError,
                   "parameter or buffer \"", name, "\" of this model is not in ", states_file,
                   ": load the checkpoint of the same model, or pass "
                   "LoadOptions().load_module_strict(false) to keep its current value");
    if (it == saved.end()) continue;
    STEPWISE_CHECK(it->second.sizes() == target.sizes(), CheckpointError, "parameter \"", name,
                   "\" has shape ", shape_of(it->second), " in ", states_file, " but ",
                   shape_of(target), " in this model");
    STEPWISE_CHECK(it->second.is_floating_point() == target.is_floating_point() &&
                       (target.is_floating_point() || it->second.dtype() == target.dtype()),
                   CheckpointError, "parameter \"", name, "\" is ", it->second.dtype(), " in ",
                   states_file, " but ", target.dtype(), " in this model");
  }
  if (options.load_module_strict()) {
    for (const auto& [name, tensor] : saved) {
      STEPWISE_CHECK(targets.count(name) != 0, CheckpointError, "\"", name, "\" in ", states_file,
                     " is not a parameter or buffer of this model: load the checkpoint of the "
                     "same model, or pass LoadOptions().load_module_strict(false) to ignore it");
    }
  }
  const auto names = detail::trainable_names(*model_);
  std::vector<torch::Tensor> saved_masters;
  const auto masters_it = states.find(c10::IValue(std::string("fp32_masters")));
  if (masters_it != states.end()) {
    for (const auto& m : masters_it->value().toTensorList()) saved_masters.push_back(m);
    STEPWISE_CHECK(saved_masters.size() == names.size(), CheckpointError, states_file, " holds ",
                   saved_masters.size(), " fp32 master weights; this model has ", names.size(),
                   " trainable parameters");
  }
  const int64_t saved_world = entry(states, "dp_world_size", states_file).toInt();
  const int64_t saved_gas = entry(states, "gradient_accumulation_steps", states_file).toInt();
  const std::string saved_precision = entry(states, "precision", states_file).toStringRef();
  const std::string precision = precision_name(precision_->mode());
  bool mid_window = false;
  if (window != nullptr) {
    const std::string window_file =
        (fs::path(path) / detail::window_file(distributed::rank())).string();
    const int64_t pending = entry(*window, "window_backwards", window_file).toInt();
    mid_window = options.load_window() &&
                 (pending > 0 || entry(*window, "awaiting_step", window_file).toBool());
    const auto reason = saved_world != sizes_.world_size
                            ? c10::str("world size ", saved_world, " (now ", sizes_.world_size, ")")
                        : saved_gas != sizes_.gradient_accumulation_steps
                            ? c10::str("gradient_accumulation_steps ", saved_gas, " (now ",
                                       sizes_.gradient_accumulation_steps, ")")
                        : saved_precision != precision
                            ? c10::str("precision ", saved_precision, " (now ", precision, ")")
                            : std::string();
    STEPWISE_CHECK(!mid_window || reason.empty(), CheckpointError, "checkpoint ", path,
                   " was saved inside an accumulation window (", pending,
                   pending == 1 ? " micro-batch" : " micro-batches", " pending) with ", reason,
                   ": its pending gradients belong to that setup. Resume it with the same GAS, "
                   "world size and precision, or save at a boundary (a different world size "
                   "is allowed there)");
  }
  const bool full = !options.load_module_only();
  torch::serialize::InputArchive optimizer_archive;
  bool load_optimizer_now = false;
  const auto ds_optimizer = states.find(c10::IValue(std::string("deepspeed_optimizer")));
  const bool deepspeed = ds_optimizer != states.end();
  if (deepspeed && full && options.load_optimizer_states() && !ds_optimizer->value().isNone()) {
    const std::string mismatch = deepspeed_optimizer_mismatch(*optimizer_, ds_optimizer->value());
    STEPWISE_CHECK(
        mismatch.empty(), CheckpointError, "the DeepSpeed optimizer state in ", path,
        " does not fit this engine's optimizer: ", mismatch,
        ". Build the same optimizer, or pass LoadOptions().load_optimizer_states(false)");
  }
  if (!deepspeed && full && options.load_optimizer_states()) {
    const std::string saved_type = entry(states, "optimizer_type", states_file).toStringRef();
    STEPWISE_CHECK(
        saved_type == optimizer_type(*optimizer_), CheckpointError, states_file,
        " holds the state of a ", saved_type, "; this engine's optimizer is a ",
        optimizer_type(*optimizer_),
        ": build the same optimizer, or pass LoadOptions().load_optimizer_states(false)");
    const std::string file = (fs::path(path) / detail::kOptimizerFile).string();
    detail::read_archive(file, optimizer_archive);
    const std::string mismatch = optimizer_mismatch(*optimizer_, optimizer_archive);
    STEPWISE_CHECK(
        mismatch.empty(), CheckpointError, "the optimizer state in ", file,
        " does not fit this engine's optimizer: ", mismatch,
        ". Build the same optimizer, or pass LoadOptions().load_optimizer_states(false)");
    load_optimizer_now = true;
  }

  // 2. Nothing below can fail on the checkpoint's content (its checksums held).
  if (load_optimizer_now) load_optimizer(*optimizer_, optimizer_archive);
  if (deepspeed && full && options.load_optimizer_states() && !ds_optimizer->value().isNone()) {
    apply_deepspeed_optimizer(*optimizer_, ds_optimizer->value());
  }
  torch::NoGradGuard no_grad;
  auto& model_params = precision_->model_params();
  const auto& masters = precision_->optimizer_params();
  std::map<std::string, size_t> trainable_index;
  for (size_t i = 0; i < names.size(); ++i) trainable_index.emplace(names[i], i);
  for (const auto& [name, target] : targets) {
    const auto it = saved.find(name);
    if (it == saved.end()) continue;
    const auto t = trainable_index.find(name);
    if (t == trainable_index.end()) {
      target.copy_(it->second);
      continue;
    }
    const size_t i = t->second;
    const torch::Tensor& precise = saved_masters.empty() ? it->second : saved_masters[i];
    if (masters[i].is_same(model_params[i])) {
      model_params[i].copy_(precise);
    } else {
      const_cast<torch::Tensor&>(masters[i]).copy_(precise);
      model_params[i].copy_(it->second);
    }
  }
  if (full) {
    const auto& sched = entry(states, "lr_scheduler", states_file);
    if (options.load_lr_scheduler_states() && scheduler_ && !sched.isNone()) {
      const auto s = sched.toGenericDict();
      const int64_t count = s.at(c10::IValue(std::string("step_count"))).toInt();
      scheduler_steps_taken_ = s.at(c10::IValue(std::string("steps_taken"))).toInt();
      set_scheduler_step_count(*scheduler_, count);
      scheduler_steps_at_start_ = count - scheduler_steps_taken_;
    } else if (scheduler_) {
      scheduler_steps_at_start_ = scheduler_step_count(*scheduler_) - scheduler_steps_taken_;
    }
    const auto& scaler_state = entry(states, "loss_scaler", states_file);
    if (LossScaler* scaler = precision_->scaler(); scaler && !scaler_state.isNone()) {
      const auto s = scaler_state.toGenericDict();
      auto get = [&](const char* key) { return s.at(c10::IValue(std::string(key))); };
      scaler->restore({get("scale").toDouble(), get("iteration").toInt(),
                       get("last_overflow_iteration").toInt(), get("hysteresis_left").toInt()});
    }
    AccumulatorState acc;
    acc.micro_steps = entry(states, "micro_steps", states_file).toInt();
    acc.global_steps = entry(states, "global_steps", states_file).toInt();
    acc.skipped_steps = entry(states, "skipped_steps", states_file).toInt();
    acc.global_samples = entry(states, "global_samples", states_file).toInt();
    const int64_t gas = sizes_.gradient_accumulation_steps;
    for (auto& p : model_params) p.mutable_grad() = torch::Tensor();
    window_losses_.clear();
    if (mid_window) {
      const auto get = [&](const char* key) { return window->at(c10::IValue(std::string(key))); };
      acc.window_backwards = get("window_backwards").toInt();
      acc.window_scaled = get("window_scaled").toInt();
      acc.awaiting_step = get("awaiting_step").toBool();
      const int64_t manual = get("manual_boundary").toInt();
      if (manual >= 0) acc.manual_boundary = manual == 1;
      for (const auto& e : get("grads").toGenericDict()) {
        const size_t i = trainable_index.at(e.key().toStringRef());
        model_params[i].mutable_grad() = e.value().toTensor().to(model_params[i].options()).clone();
      }
      for (const auto& l : get("window_losses").toTensorList()) window_losses_.push_back(l);
    } else if (saved_gas != gas) {
      acc.micro_steps = (acc.micro_steps + gas - 1) / gas * gas;  // the next window is whole
    } else {
      acc.micro_steps -= acc.micro_steps % gas;  // a dropped window starts again
    }
    accumulator_.restore(acc);
    was_step_applied_ = entry(states, "was_step_applied", states_file).toBool();
    global_grad_norm_ = entry(states, "global_grad_norm", states_file).toDouble();
    last_window_losses_.clear();
    for (const auto& l : entry(states, "last_window_losses", states_file).toTensorList()) {
      last_window_losses_.push_back(l);
    }
    last_window_factor_ = entry(states, "last_window_factor", states_file).toDouble();
  }
  // The load changed weights and gradients on purpose: the guard rails start afresh.
  leftover_checks_ = std::make_unique<detail::LeftoverChecks>(
      config_.stepwise, names, precision_->model_params(), precision_->optimizer_params());
}

}  // namespace stepwise
