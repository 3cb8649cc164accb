// Engine::save_checkpoint and Engine::load_checkpoint: what the engine saves, how a
// checkpoint fits it, and how a load applies. The files, the tag and the phases are the
// checkpoint component's (src/checkpoint/). see NOTE: [checkpoint layout]
#include <stepwise/engine.h>

#include <torch/serialize.h>
#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include "check.h"
#include "checkpoint/deepspeed.h"
#include "checkpoint/files.h"
#include "checkpoint/load_checks.h"
#include "checkpoint/optimizer.h"
#include "checkpoint/protocol.h"
#include "checkpoint/rng.h"
#include "engine_state.h"
#include "leftover_checks.h"
#include "load_plan.h"
#include "lr_schedules_detail.h"
#include "torch_compat.h"
#include "zero.h"

#include <map>

namespace stepwise {

namespace {

#ifndef STEPWISE_VERSION
#define STEPWISE_VERSION "unknown"
#endif

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

detail::NamedTensors named(const std::vector<std::string>& names,
                           const std::vector<torch::Tensor>& tensors) {
  detail::NamedTensors out;
  for (size_t i = 0; i < tensors.size(); ++i) out.emplace_back(names[i], tensors[i].detach());
  return out;
}

// The process group a save's or a load's phases agree over: none on one rank.
std::shared_ptr<distributed::Context> checkpoint_context(const BatchSizes& sizes) {
  return sizes.world_size > 1 ? distributed::default_context() : nullptr;
}

}  // namespace

detail::SharedState Engine::State::shared_state(const ClientState& client_state) const {
  detail::SharedState s;
  for (const auto& item : model_->named_parameters()) {
    s.module.emplace_back(item.key(), item.value().detach());
  }
  for (const auto& item : model_->named_buffers()) {
    s.module.emplace_back(item.key(), item.value().detach());
  }
  // ZeRO stage 1 or 2 with W > 1: each rank's masters are in its shard file (save_shard).
  if (precision_->has_masters() && !zero_->sharded()) {
    s.fp32_masters = named(detail::trainable_names(*model_), precision_->optimizer_params());
  }
  s.zero_stage = zero_->sharded() ? config_.zero.stage() : 0;
  s.optimizer_type = detail::optimizer_type(*optimizer_);
  if (scheduler_) {
    s.lr_scheduler =
        detail::SavedScheduler{scheduler_step_count(*scheduler_), scheduler_steps_taken_, get_lr()};
  }
  if (const LossScaler* scaler = precision_->scaler()) s.loss_scaler = scaler->state();
  const AccumulatorState acc = accumulator_.state();
  s.global_steps = acc.global_steps;
  s.global_samples = acc.global_samples;
  s.skipped_steps = acc.skipped_steps;
  s.micro_steps = acc.micro_steps;
  s.window_micro_batches = acc.window_backwards;
  s.window_awaiting_step = acc.awaiting_step;
  s.manual_boundary = acc.manual_boundary;
  s.dp_world_size = accumulator_.sizes().world_size;
  s.gradient_accumulation_steps = accumulator_.gas();
  s.precision = precision_->name();
  s.ds_config = resolved_config(config_, accumulator_.sizes());
  s.stepwise_version = STEPWISE_VERSION;
  s.was_step_applied = was_step_applied_;
  s.global_grad_norm = global_grad_norm_;
  s.client_state = client_state;
  return s;
}

detail::RankWindow Engine::State::rank_window() const {
  const AccumulatorState acc = accumulator_.state();
  detail::RankWindow w;
  w.rank = distributed::rank();
  w.world_size = accumulator_.sizes().world_size;
  w.micro_steps = acc.micro_steps;
  w.window_backwards = acc.window_backwards;
  w.window_scaled = acc.window_scaled;
  const auto names = detail::trainable_names(*model_);
  const auto& params = precision_->model_params();
  for (size_t i = 0; i < params.size(); ++i) {
    if (params[i].grad().defined()) w.grads.emplace_back(names[i], params[i].grad().detach());
  }
  w.window_losses = window_losses_.current;
  w.last_window_losses = window_losses_.last;
  w.last_window_factor = window_losses_.last_factor;
  w.rng = detail::capture_rng();
  return w;
}

std::string Engine::State::save_checkpoint(const std::string& dir, const SaveOptions& options) {
  const auto context = checkpoint_context(accumulator_.sizes());
  detail::SaveSource source;
  source.window = [&] { return rank_window(); };
  source.shared = [&] { return shared_state(options.client_state()); };
  if (zero_->sharded()) {
    source.shard = [&](auto& archive) { save_shard(archive); };
  } else {
    source.optimizer = [&](auto& archive) { detail::save_optimizer(*optimizer_, archive); };
  }
  // ZeRO stage 2 keeps a window's gradients (its own parameters' sums) off .grad.
  reducer_->show_grads();
  struct Hide {
    distributed::GradientReducer& reducer;
    ~Hide() { reducer.restore_grads(); }
  } hide{*reducer_};
  return detail::save_checkpoint(
      context.get(), dir,
      options.tag().value_or(c10::str("global_step", accumulator_.global_steps())),
      config_.checkpoint.tag_validation(), options.save_latest(), source);
}

LoadedCheckpoint Engine::State::load_checkpoint(const std::string& dir,
                                                const LoadOptions& options) {
  const auto context = checkpoint_context(accumulator_.sizes());
  const detail::Setup setup{accumulator_.sizes().world_size, accumulator_.gas(), precision_->name(),
                            zero_->sharded() ? config_.zero.stage() : 0};
  detail::LoadPlan plan;
  return detail::load_checkpoint(
      context.get(), dir, options, setup,
      [&](const detail::ReadCheckpoint& c) { plan_load(c, options, plan); },
      [&](const detail::ReadCheckpoint& c) { apply_load(c, plan); });
}

void Engine::State::plan_load(const detail::ReadCheckpoint& c, const LoadOptions& options,
                              detail::LoadPlan& plan) const {
  detail::ModelTensors model;
  for (const auto& item : model_->named_parameters())
    model.all.emplace_back(item.key(), item.value());
  for (const auto& item : model_->named_buffers()) model.all.emplace_back(item.key(), item.value());
  model.trainable_names = detail::trainable_names(*model_);
  model.model_params = precision_->model_params();
  model.masters.resize(model.model_params.size());  // by trainable index; ZeRO: owned only
  for (size_t k = 0; k < precision_->owned().size(); ++k) {
    model.masters[precision_->owned()[k]] = precision_->optimizer_params()[k];
  }
  // NOTE: [resharding] Whenever ZeRO (stage 1 or 2) saved the checkpoint or loads it, each
  // master comes by name from the file that holds it, and each parameter's optimizer state
  // from its saving rank's optimizer file (read_sources), moved to this rank's own
  // optimizer by parameter (install_resharded): so a checkpoint loads at any stage and W.
  // Whole-tensor shards make this exact: no parameter's state is ever split between files.
  const bool saved_sharded = c.shared.zero_stage >= 1;
  plan.reshard = c.full && (zero_->sharded() || saved_sharded);
  detail::ReadCheckpoint with_masters = c;  // the masters, from wherever they were saved
  if (plan.reshard) {
    auto masters = read_sources(c, plan);
    if (saved_sharded && precision_->has_masters()) {
      with_masters.shared.fp32_masters = std::move(masters);
    }
  }
  plan.copies = detail::weights_to_load(with_masters, model, options.load_module_strict());
  if (!c.full) return;
  if (c.continue_window) plan.window_grads = detail::window_grads_to_load(c, model);
  plan.load_scheduler = scheduler_ && c.shared.lr_scheduler && options.load_lr_scheduler_states();
  if (plan.load_scheduler) detail::check_scheduler_groups(c, optimizer_->param_groups().size());
  plan.load_scaler = precision_->scaler() != nullptr && c.shared.loss_scaler;
  plan.counters = counters_after_load(c);
  if (options.load_optimizer_states()) plan_optimizer_load(c, model, plan);
  if (options.load_rng_state() && c.window && c.window->rng) {
    detail::check_rng_fits(*c.window->rng, c.window_file);
    plan.rng = c.window->rng;
  }
}

AccumulatorState Engine::State::counters_after_load(const detail::ReadCheckpoint& c) const {
  const detail::SharedState& s = c.shared;
  AccumulatorState acc;
  acc.micro_steps = s.micro_steps;
  acc.global_steps = s.global_steps;
  acc.skipped_steps = s.skipped_steps;
  acc.global_samples = s.global_samples;
  acc.manual_boundary = s.manual_boundary;
  if (c.continue_window) {
    acc.window_backwards = c.window->window_backwards;
    acc.window_scaled = c.window->window_scaled;
    acc.awaiting_step = s.window_awaiting_step;
  } else {
    acc.micro_steps =
        accumulator_.after_dropped_window(s.micro_steps, s.gradient_accumulation_steps);
  }
  return acc;
}

// The optimizer's state: the same type, parameter groups and per-parameter entries.
void Engine::State::plan_optimizer_load(const detail::ReadCheckpoint& c,
                                        const detail::ModelTensors& model,
                                        detail::LoadPlan& plan) const {
  if (c.shared.deepspeed_optimizer) {
    if (c.shared.deepspeed_optimizer->isNone()) return;
    const std::string mismatch =
        detail::deepspeed_optimizer_mismatch(*optimizer_, *c.shared.deepspeed_optimizer);
    STEPWISE_CHECK(
        mismatch.empty(), CheckpointError, "the DeepSpeed optimizer state in ", c.path,
        " does not fit this engine's optimizer: ", mismatch,
        ". Build the same optimizer, or pass LoadOptions().load_optimizer_states(false)");
    plan.load_deepspeed_optimizer = true;
    return;
  }
  const std::string type = detail::optimizer_type(*optimizer_);
  STEPWISE_CHECK(c.shared.optimizer_type == type, CheckpointError, c.shared_file,
                 " holds the state of a ", c.shared.optimizer_type,
                 "; this engine's optimizer is a ", type,
                 ": build the same optimizer, or pass "
                 "LoadOptions().load_optimizer_states(false)");
  if (plan.reshard) {
    for (auto& source : plan.sources) {
      std::string mismatch;
      with_stand_ins(source.params, [&](const detail::StandIns& stand_ins) {
        mismatch = detail::optimizer_mismatch(
            *optimizer_, source.archive, source.file,
            [&](const torch::Tensor& t) { return stand_ins.name_of(t); });
      });
      STEPWISE_CHECK(mismatch.empty(), CheckpointError, "the optimizer state in ", source.file,
                     " does not fit this engine's optimizer: ", mismatch,
                     ". Build the same optimizer, or pass "
                     "LoadOptions().load_optimizer_states(false)");
    }
    plan.load_optimizer = true;
    return;
  }
  const std::string optimizer_file = c.path + "/" + detail::kOptimizerFile;
  detail::read_archive(optimizer_file, plan.optimizer_archive);
  std::map<const c10::TensorImpl*, std::string> param_names;
  for (size_t i = 0; i < model.trainable_names.size(); ++i) {
    if (model.masters[i].defined()) {
      param_names.emplace(model.masters[i].unsafeGetTensorImpl(), model.trainable_names[i]);
    }
    param_names.emplace(model.model_params[i].unsafeGetTensorImpl(), model.trainable_names[i]);
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

void Engine::State::apply_load(const detail::ReadCheckpoint& c, detail::LoadPlan& plan) {
  if (plan.load_optimizer && plan.reshard) {
    install_resharded(plan);
  } else if (plan.load_optimizer) {
    detail::load_optimizer(*optimizer_, plan.optimizer_archive);
  }
  if (plan.load_deepspeed_optimizer) {
    detail::apply_deepspeed_optimizer(*optimizer_, *c.shared.deepspeed_optimizer);
  }
  {
    torch::NoGradGuard no_grad;
    for (auto& [target, value] : plan.copies) target.copy_(value);
  }
  if (c.full) {
    if (plan.load_scheduler) restore_scheduler(*c.shared.lr_scheduler);
    if (scheduler_) {
      scheduler_steps_at_start_ = scheduler_step_count(*scheduler_) - scheduler_steps_taken_;
    }
    if (plan.load_scaler) precision_->scaler()->restore(*c.shared.loss_scaler);
    auto& model_params = precision_->model_params();
    for (size_t i = 0; i < model_params.size(); ++i) {
      model_params[i].mutable_grad() = c.continue_window ? plan.window_grads[i] : torch::Tensor();
    }
    accumulator_.restore(plan.counters);
    was_step_applied_ = c.shared.was_step_applied;
    global_grad_norm_ = c.shared.global_grad_norm;
    window_losses_ = {};
    if (c.continue_window) window_losses_.current = c.window->window_losses;
    if (c.window) {
      window_losses_.last = c.window->last_window_losses;
      window_losses_.last_factor = c.window->last_window_factor;
    }
    reducer_->restore_grads();  // W > 1: into the buckets (NOTE: [bucket views])
    if (plan.rng) detail::restore_rng(*plan.rng);
  }
  // The load changed weights and gradients on purpose: the guard rails start afresh.
  leftover_checks_ = std::make_unique<detail::LeftoverChecks>(
      config_.guard_rails, detail::trainable_names(*model_), precision_->model_params(),
      precision_->optimizer_params(), precision_->owned());
}

void Engine::State::restore_scheduler(const detail::SavedScheduler& saved) {
  if (auto* schedule = dynamic_cast<Schedule*>(scheduler_.get())) {
    schedule->jump_to(saved.step_count);  // the lrs (and OneCycle's beta1) from the schedule
  } else {
    // A client scheduler's state is its count and the optimizer's lrs, which a load
    // without the optimizer's state would not restore.
    set_scheduler_step_count(*scheduler_, saved.step_count);
    auto& groups = optimizer_->param_groups();
    for (size_t i = 0; i < groups.size() && saved.lrs && i < saved.lrs->size(); ++i) {
      groups[i].options().set_lr((*saved.lrs)[i]);
    }
  }
  scheduler_steps_taken_ = saved.steps_taken;
}

}  // namespace stepwise
