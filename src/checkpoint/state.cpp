#include "checkpoint/state.h"

#include <ATen/core/Dict.h>
#include <ATen/core/List.h>

#include <stepwise/errors.h>

#include "check.h"
#include "checkpoint/files.h"

#include <cmath>

namespace stepwise::detail {

namespace {

using Dict = c10::impl::GenericDict;

Dict new_dict() { return Dict(c10::StringType::get(), c10::AnyType::get()); }

c10::Dict<std::string, at::Tensor> to_dict(const NamedTensors& tensors) {
  c10::Dict<std::string, at::Tensor> d;
  for (const auto& [name, tensor] : tensors) d.insert(name, tensor);
  return d;
}

NamedTensors named_tensors(const c10::IValue& value) {
  NamedTensors out;
  for (const auto& e : value.toGenericDict()) {
    out.emplace_back(e.key().toStringRef(), e.value().toTensor());
  }
  return out;
}

std::vector<torch::Tensor> tensors(const c10::IValue& value) {
  std::vector<torch::Tensor> out;
  for (const auto& t : value.toTensorList()) out.push_back(t);
  return out;
}

Dict dict_of(const c10::IValue& value, const std::string& file) {
  STEPWISE_CHECK(value.isGenericDict(), CheckpointError, "checkpoint file ", file,
                 " does not hold a dict: it was not written by stepwise's save_checkpoint");
  return value.toGenericDict();
}

// NOTE: [saved fields] every number a load applies is in its range first, so a damaged
// file (its checksum passed) is refused here and never trains from nonsense.
void check_field(bool ok, const std::string& file, const char* key, double value,
                 const char* range) {
  STEPWISE_CHECK(ok, CheckpointError, "checkpoint file ", file, " holds ", key, " = ", value,
                 ", which must be ", range,
                 ": the file is damaged or was not written by "
                 "stepwise's save_checkpoint");
}

void check_count(const std::string& file, const char* key, int64_t value, int64_t low = 0) {
  check_field(value >= low, file, key, static_cast<double>(value), low == 0 ? ">= 0" : ">= -1");
}

SavedScheduler scheduler_from(const Dict& s, const std::string& file) {
  SavedScheduler out;
  out.step_count = entry(s, "step_count", file).toInt();
  out.steps_taken = entry(s, "steps_taken", file).toInt();
  check_count(file, "lr_scheduler.step_count", out.step_count);
  check_field(out.steps_taken >= 0 && out.steps_taken <= out.step_count, file,
              "lr_scheduler.steps_taken", static_cast<double>(out.steps_taken),
              "in 0..lr_scheduler.step_count");
  const auto lrs = s.find(c10::IValue(std::string("lrs")));
  if (lrs != s.end()) {
    out.lrs = lrs->value().toDoubleVector();
    for (double lr : *out.lrs) {
      check_field(std::isfinite(lr) && lr >= 0.0, file, "an lr of lr_scheduler.lrs", lr,
                  "finite and >= 0");
    }
  }
  return out;
}

LossScalerState scaler_from(const Dict& s, const std::string& file) {
  const LossScalerState out{entry(s, "scale", file).toDouble(), entry(s, "iteration", file).toInt(),
                            entry(s, "last_overflow_iteration", file).toInt(),
                            entry(s, "hysteresis_left", file).toInt()};
  check_field(std::isfinite(out.scale) && out.scale > 0.0, file, "loss_scaler.scale", out.scale,
              "finite and > 0");
  check_count(file, "loss_scaler.iteration", out.iteration);
  check_count(file, "loss_scaler.last_overflow_iteration", out.last_overflow_iteration, -1);
  check_count(file, "loss_scaler.hysteresis_left", out.hysteresis_left);
  return out;
}

}  // namespace

c10::IValue to_ivalue(const SharedState& state) {
  Dict d = new_dict();
  d.insert("module", to_dict(state.module));
  if (state.fp32_masters) d.insert("fp32_masters", to_dict(*state.fp32_masters));
  d.insert("optimizer_type", state.optimizer_type);
  if (state.lr_scheduler) {
    Dict s = new_dict();
    s.insert("step_count", state.lr_scheduler->step_count);
    s.insert("steps_taken", state.lr_scheduler->steps_taken);
    if (state.lr_scheduler->lrs) s.insert("lrs", c10::List<double>(*state.lr_scheduler->lrs));
    d.insert("lr_scheduler", s);
  } else {
    d.insert("lr_scheduler", c10::IValue());
  }
  if (state.loss_scaler) {
    Dict s = new_dict();
    s.insert("scale", state.loss_scaler->scale);
    s.insert("iteration", state.loss_scaler->iteration);
    s.insert("last_overflow_iteration", state.loss_scaler->last_overflow_iteration);
    s.insert("hysteresis_left", state.loss_scaler->hysteresis_left);
    d.insert("loss_scaler", s);
  } else {
    d.insert("loss_scaler", c10::IValue());
  }
  d.insert("global_steps", state.global_steps);
  d.insert("global_samples", state.global_samples);
  d.insert("skipped_steps", state.skipped_steps);
  d.insert("micro_steps", state.micro_steps);
  d.insert("window_micro_batches", state.window_micro_batches);
  d.insert("window_awaiting_step", state.window_awaiting_step);
  d.insert("manual_boundary",
           state.manual_boundary ? static_cast<int64_t>(*state.manual_boundary) : int64_t{-1});
  d.insert("dp_world_size", state.dp_world_size);
  d.insert("zero_stage", state.zero_stage);
  d.insert("gradient_accumulation_steps", state.gradient_accumulation_steps);
  d.insert("precision", state.precision);
  d.insert("ds_config", state.ds_config);
  d.insert("stepwise_version", state.stepwise_version);
  d.insert("was_step_applied", state.was_step_applied);
  d.insert("global_grad_norm", state.global_grad_norm);
  Dict client = new_dict();
  for (const auto& [key, value] : state.client_state) client.insert(key, value);
  d.insert("client_state", client);
  if (state.deepspeed_optimizer) d.insert("deepspeed_optimizer", *state.deepspeed_optimizer);
  return d;
}

SharedState shared_state_from(const c10::IValue& value, const std::string& file) {
  const Dict d = dict_of(value, file);
  return reading(file, [&] {
    SharedState s;
    s.module = named_tensors(entry(d, "module", file));
    const auto masters = d.find(c10::IValue(std::string("fp32_masters")));
    if (masters != d.end()) s.fp32_masters = named_tensors(masters->value());
    s.optimizer_type = entry(d, "optimizer_type", file).toStringRef();
    s.window_micro_batches = entry(d, "window_micro_batches", file).toInt();
    check_count(file, "window_micro_batches", s.window_micro_batches);
    s.window_awaiting_step = entry(d, "window_awaiting_step", file).toBool();
    const auto& scheduler = entry(d, "lr_scheduler", file);
    if (!scheduler.isNone()) s.lr_scheduler = scheduler_from(scheduler.toGenericDict(), file);
    const auto& scaler = entry(d, "loss_scaler", file);
    if (!scaler.isNone()) s.loss_scaler = scaler_from(scaler.toGenericDict(), file);
    s.micro_steps = entry(d, "micro_steps", file).toInt();
    s.global_steps = entry(d, "global_steps", file).toInt();
    s.skipped_steps = entry(d, "skipped_steps", file).toInt();
    s.global_samples = entry(d, "global_samples", file).toInt();
    check_count(file, "micro_steps", s.micro_steps);
    check_count(file, "global_steps", s.global_steps);
    check_field(s.skipped_steps >= 0 && s.skipped_steps <= s.global_steps, file, "skipped_steps",
                static_cast<double>(s.skipped_steps), "in 0..global_steps");
    check_count(file, "global_samples", s.global_samples);
    const int64_t manual = entry(d, "manual_boundary", file).toInt();
    check_field(manual >= -1 && manual <= 1, file, "manual_boundary", static_cast<double>(manual),
                "-1 (none), 0 or 1");
    if (manual >= 0) s.manual_boundary = manual == 1;
    s.dp_world_size = entry(d, "dp_world_size", file).toInt();
    check_field(s.dp_world_size >= 1, file, "dp_world_size", static_cast<double>(s.dp_world_size),
                ">= 1");
    const auto zero = d.find(c10::IValue(std::string("zero_stage")));  // absent: before ZeRO
    if (zero != d.end()) s.zero_stage = zero->value().toInt();
    check_field(s.zero_stage >= 0 && s.zero_stage <= 2, file, "zero_stage",
                static_cast<double>(s.zero_stage), "0, 1 or 2");
    s.gradient_accumulation_steps = entry(d, "gradient_accumulation_steps", file).toInt();
    check_field(s.gradient_accumulation_steps >= 1, file, "gradient_accumulation_steps",
                static_cast<double>(s.gradient_accumulation_steps), ">= 1");
    s.precision = entry(d, "precision", file).toStringRef();
    s.ds_config = entry(d, "ds_config", file).toStringRef();
    const auto version = d.find(c10::IValue(std::string("stepwise_version")));
    if (version != d.end()) s.stepwise_version = version->value().toStringRef();
    s.was_step_applied = entry(d, "was_step_applied", file).toBool();
    s.global_grad_norm = entry(d, "global_grad_norm", file).toDouble();
    for (const auto& e : entry(d, "client_state", file).toGenericDict()) {
      s.client_state.emplace(e.key().toStringRef(), e.value());
    }
    const auto ds_optimizer = d.find(c10::IValue(std::string("deepspeed_optimizer")));
    if (ds_optimizer != d.end()) s.deepspeed_optimizer = ds_optimizer->value();
    return s;
  });
}

c10::IValue to_ivalue(const RankWindow& window) {
  Dict d = new_dict();
  d.insert("rank", window.rank);
  d.insert("world_size", window.world_size);
  d.insert("micro_steps", window.micro_steps);
  d.insert("window_backwards", window.window_backwards);
  d.insert("window_scaled", window.window_scaled);
  d.insert("grads", to_dict(window.grads));
  d.insert("window_losses", c10::List<at::Tensor>(window.window_losses));
  d.insert("last_window_losses", c10::List<at::Tensor>(window.last_window_losses));
  d.insert("last_window_factor", window.last_window_factor);
  if (window.rng) {
    Dict rng = new_dict();
    rng.insert("cpu", window.rng->cpu);
    rng.insert("cuda", c10::List<at::Tensor>(window.rng->cuda));
    d.insert("rng", rng);
  }
  return d;
}

RankWindow rank_window_from(const c10::IValue& value, const std::string& file) {
  const Dict d = dict_of(value, file);
  return reading(file, [&] {
    RankWindow w;
    w.rank = entry(d, "rank", file).toInt();
    w.world_size = entry(d, "world_size", file).toInt();
    w.micro_steps = entry(d, "micro_steps", file).toInt();
    w.window_backwards = entry(d, "window_backwards", file).toInt();
    w.window_scaled = entry(d, "window_scaled", file).toInt();
    check_count(file, "window_backwards", w.window_backwards);
    check_field(w.window_scaled >= 0 && w.window_scaled <= w.window_backwards, file,
                "window_scaled", static_cast<double>(w.window_scaled), "in 0..window_backwards");
    w.grads = named_tensors(entry(d, "grads", file));
    w.window_losses = tensors(entry(d, "window_losses", file));
    w.last_window_losses = tensors(entry(d, "last_window_losses", file));
    w.last_window_factor = entry(d, "last_window_factor", file).toDouble();
    const auto rng = d.find(c10::IValue(std::string("rng")));
    if (rng != d.end()) {
      const Dict r = rng->value().toGenericDict();
      w.rng = RngState{entry(r, "cpu", file).toTensor(), tensors(entry(r, "cuda", file))};
    }
    return w;
  });
}

}  // namespace stepwise::detail
