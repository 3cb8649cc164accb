#include "checkpoint/load_checks.h"

#include <stepwise/errors.h>

#include "check.h"

#include <map>

namespace stepwise::detail {

namespace {

std::string shape_of(const torch::Tensor& t) { return c10::str(t.sizes()); }

std::map<std::string, torch::Tensor> by_name(const NamedTensors& tensors) {
  return {tensors.begin(), tensors.end()};
}

}  // namespace

void check_fits(const std::string& name, const torch::Tensor& value, const torch::Tensor& target,
                const char* what, const std::string& file) {
  STEPWISE_CHECK(value.sizes() == target.sizes(), CheckpointError, what, " \"", name,
                 "\" has shape ", shape_of(value), " in ", file, " but ", shape_of(target),
                 " in this model");
  STEPWISE_CHECK(value.is_floating_point() == target.is_floating_point() &&
                     (target.is_floating_point() || value.dtype() == target.dtype()),
                 CheckpointError, what, " \"", name, "\" is ", value.dtype(), " in ", file, " but ",
                 target.dtype(), " in this model");
}

void check_window_setup(const ReadCheckpoint& c, const Setup& now) {
  const SharedState& s = c.shared;
  const auto reason = s.dp_world_size != now.world_size
                          ? c10::str("world size ", s.dp_world_size, " (now ", now.world_size, ")")
                      : s.gradient_accumulation_steps != now.gradient_accumulation_steps
                          ? c10::str("gradient_accumulation_steps ", s.gradient_accumulation_steps,
                                     " (now ", now.gradient_accumulation_steps, ")")
                      : s.precision != now.precision
                          ? c10::str("precision ", s.precision, " (now ", now.precision, ")")
                      // NOTE: [stage 2 gradients]: a stage-2 window holds sums over the ranks
                      : (s.zero_stage == 2) != (now.zero_stage == 2)
                          ? c10::str("ZeRO stage ", s.zero_stage, " (now ", now.zero_stage, ")")
                          : std::string();
  const int64_t pending = s.window_micro_batches;
  STEPWISE_CHECK(reason.empty(), CheckpointError, "checkpoint ", c.path,
                 " was saved inside an accumulation window (", pending,
                 pending == 1 ? " micro-batch" : " micro-batches", " pending) with ", reason,
                 ": its pending gradients belong to that setup. Resume it with the same GAS, "
                 "world size and precision, or save at a boundary (a different world size "
                 "is allowed there), or pass LoadOptions().load_window(false) to drop them");
}

void check_window_matches_shared(const ReadCheckpoint& c) {
  const RankWindow& w = *c.window;
  STEPWISE_CHECK(w.micro_steps == c.shared.micro_steps, CheckpointError, "checkpoint file ",
                 c.window_file, " was saved at micro-step ", w.micro_steps, ", ", c.shared_file,
                 " at ", c.shared.micro_steps, ": the folder mixes two saves");
  if (!c.continue_window) return;
  STEPWISE_CHECK(
      w.window_backwards == c.shared.window_micro_batches, CheckpointError, "checkpoint file ",
      c.window_file, " holds window_backwards = ", w.window_backwards,
      ", which must be the shared file's window_micro_batches (", c.shared.window_micro_batches,
      "): the file is damaged or was not written by stepwise's save_checkpoint");
}

Copies weights_to_load(const ReadCheckpoint& c, const ModelTensors& model, bool strict) {
  const std::string& file = c.shared_file;
  const auto saved = by_name(c.shared.module);
  const std::map<std::string, torch::Tensor> targets(model.all.begin(), model.all.end());
  for (const auto& [name, target] : targets) {
    const auto it = saved.find(name);
    STEPWISE_CHECK(it != saved.end() || !strict, CheckpointError, "parameter or buffer \"", name,
                   "\" of this model is not in ", file,
                   ": load the checkpoint of the same model, or pass "
                   "LoadOptions().load_module_strict(false) to keep its current value");
    if (it != saved.end()) check_fits(name, it->second, target, "parameter", file);
  }
  if (strict) {
    for (const auto& [name, tensor] : saved) {
      STEPWISE_CHECK(targets.count(name) != 0, CheckpointError, "\"", name, "\" in ", file,
                     " is not a parameter or buffer of this model: load the checkpoint of the "
                     "same model, or pass LoadOptions().load_module_strict(false) to ignore it");
    }
  }
  // The fp32 master weights, by name: each trainable parameter loaded needs its own.
  const auto saved_masters = c.shared.fp32_masters ? by_name(*c.shared.fp32_masters)
                                                   : std::map<std::string, torch::Tensor>();
  std::map<std::string, size_t> trainable_index;
  for (size_t i = 0; i < model.trainable_names.size(); ++i) {
    trainable_index.emplace(model.trainable_names[i], i);
  }
  Copies copies;
  for (const auto& [name, target] : targets) {
    const auto it = saved.find(name);
    if (it == saved.end()) continue;
    const auto t = trainable_index.find(name);
    if (t == trainable_index.end()) {
      copies.emplace_back(target, it->second);
      continue;
    }
    const size_t i = t->second;
    torch::Tensor precise = it->second;
    const bool keeps_master = model.masters[i].defined();  // ZeRO: this rank's share only
    if (c.shared.fp32_masters && keeps_master) {
      const auto m = saved_masters.find(name);
      STEPWISE_CHECK(m != saved_masters.end(), CheckpointError, file,
                     " has no fp32 master weight for parameter \"", name,
                     "\": it was not written by stepwise's save_checkpoint for this model");
      check_fits(name, m->second, target, "the fp32 master weight of parameter", file);
      precise = m->second;
    }
    if (!keeps_master || model.masters[i].is_same(model.model_params[i])) {
      copies.emplace_back(model.model_params[i], precise);
    } else {
      copies.emplace_back(model.masters[i], precise);
      copies.emplace_back(model.model_params[i], it->second);
    }
  }
  return copies;
}

std::vector<torch::Tensor> window_grads_to_load(const ReadCheckpoint& c,
                                                const ModelTensors& model) {
  std::map<std::string, size_t> trainable_index;
  for (size_t i = 0; i < model.trainable_names.size(); ++i) {
    trainable_index.emplace(model.trainable_names[i], i);
  }
  std::vector<torch::Tensor> grads(model.trainable_names.size());
  for (const auto& [name, grad] : c.window->grads) {
    const auto t = trainable_index.find(name);
    STEPWISE_CHECK(t != trainable_index.end(), CheckpointError, "checkpoint file ", c.window_file,
                   " holds a gradient of \"", name,
                   "\", which is not a trainable parameter of this model");
    const auto& param = model.model_params[t->second];
    check_fits(name, grad, param, "the pending gradient of parameter", c.window_file);
    grads[t->second] = grad.to(param.options()).clone();
  }
  return grads;
}

void check_scheduler_groups(const ReadCheckpoint& c, size_t groups) {
  const auto& lrs = c.shared.lr_scheduler->lrs;
  STEPWISE_CHECK(!lrs || lrs->size() == groups, CheckpointError, "checkpoint file ", c.shared_file,
                 " holds ", lrs ? lrs->size() : 0, " scheduler lrs for ", groups,
                 " parameter groups: build the same optimizer, or pass "
                 "LoadOptions().load_lr_scheduler_states(false)");
}

}  // namespace stepwise::detail
