// stepwise: the training engine. Four pitfalls decide whether a loop is correct.
//
// Usage {.cpp .fragment context="loader"}:
//
//   auto engine = stepwise::initialize(model, stepwise::Config::from_file("ds_config.json"));
//   for (auto& batch : loader) {                      // every MICRO-batch
//     auto loss = torch::mse_loss(model->forward(batch.data), batch.target);
//     torch::Tensor shown = engine.backward(loss);    // 1. returns loss / GAS
//     engine.step();                                  // 4. after EVERY micro-batch
//   }
//   // 2. do NOT divide the loss by GAS yourself: backward() does.
//   // 3. the engine steps the LR scheduler it owns (the config's, or one handed to
//   //    initialize) in step() at each boundary, and in flush(); never on an fp16
//   //    overflow: do NOT step it yourself. A scheduler it does not own is yours.
//   //    Nor call optimizer.step(), zero_grad() or clip_grad_norm_: step() does them.
//
// Differences from DeepSpeed are listed on the docs site ("Differences from
// DeepSpeed", docs/differences.md); the loop's contract is stated in docs/engine.md
// and docs/gradient-accumulation.md.
#pragma once

#include <stepwise/checkpoint.h>
#include <stepwise/config.h>
#include <stepwise/errors.h>
#include <stepwise/optimizers.h>

#include <torch/arg.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/schedulers/lr_scheduler.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace stepwise {

namespace distributed {
class GradientReducer;
}  // namespace distributed

/// Per-call options of Engine::backward.
struct BackwardOptions {
  /// Divide the loss by GAS (unset: the config's stepwise.scale_wrt_gas, default true).
  TORCH_ARG(std::optional<bool>, scale_wrt_gas) = std::nullopt;
  /// The micro-batch's tokens on this rank, for the progress line's tokens/s (summed over
  /// the ranks at print steps). 0: not reported.
  TORCH_ARG(int64_t, tokens) = 0;
};

/// A model, its optimizer and LR scheduler, driven by a DeepSpeed config.
/// Create it with stepwise::initialize.
class Engine {
 public:
  /// Prefer stepwise::initialize. Takes ownership of the optimizer and scheduler
  /// (either may be null: then the config's section is used).
  Engine(std::shared_ptr<torch::nn::Module> model, Config config,
         std::unique_ptr<torch::optim::Optimizer> client_optimizer,
         std::unique_ptr<torch::optim::LRScheduler> client_scheduler);
  /// Movable (the model, optimizer and scheduler stay where they are).
  Engine(Engine&&) noexcept;
  /// Move assignment.
  Engine& operator=(Engine&&) noexcept;
  /// Destroys the engine (the model stays the caller's).
  ~Engine();

  /// Backpropagates `loss / GAS` and returns that divided loss, detached.
  ///
  /// FACT 1: the return value is the loss DIVIDED by gradient_accumulation_steps
  /// (log `loss`, not the return value, if you want the micro-batch loss).
  /// FACT 2: the engine divides by GAS itself: pass the plain mean loss; do not
  /// divide it yourself. Gradients accumulate across micro-batches, so at the
  /// boundary they are the mean over the GAS micro-batches.
  /// `loss` must be a defined, floating-point, 0-dim tensor that requires grad.
  /// With strict cadence, calling backward() twice without step() in between
  /// throws UsageError (allowed while the boundary is set by hand). Throws
  /// UsageError when the gradients were cleared since the last backward() of this
  /// window (a leftover zero_grad(); "stepwise.check_grads_cleared").
  torch::Tensor backward(const torch::Tensor& loss, const BackwardOptions& options = {});

  /// Call after EVERY micro-batch's backward() (FACT 4).
  ///
  /// Off the accumulation boundary it only counts the micro-step. At the
  /// boundary ((micro_steps + 1) % GAS == 0) it averages the gradients over
  /// the W data-parallel ranks (W > 1 only), unscales them (fp16), computes
  /// the global gradient norm, clips (gradient_clipping), steps the optimizer,
  /// sets the gradients to none (W > 1: zeros in the reducer's buckets, NOTE: [bucket
  /// views]), and steps the LR scheduler the engine owns (FACT 3:
  /// the user must not step it, nor call optimizer.step()). On an fp16 overflow
  /// (on any rank) it skips the optimizer AND the scheduler step, but
  /// global_steps still advances and skipped_steps counts it. Throws UsageError when no
  /// backward() preceded it (strict cadence), when the engine's scheduler
  /// was stepped by someone else, when the gradients changed since backward() (a
  /// leftover clip_grad_norm_) or when the parameters changed since the last
  /// optimizer step (a leftover optimizer.step()); see docs/gradient-accumulation.md,
  /// pitfall 5. With the boundary set by hand (set_gradient_accumulation_boundary),
  /// a boundary step ends the window as flush() does.
  void step();

  /// Ends a partial accumulation window (end of an epoch): if k in 1..GAS-1
  /// micro-batches are pending, rescales their gradients by GAS / k (so they
  /// are the mean over the k micro-batches seen; by 1 if backward() did not divide
  /// by GAS), takes a boundary step (the optimizer AND the scheduler the engine
  /// owns, as at any boundary), and moves micro_steps to the end of the window.
  /// Returns whether a step was taken. DeepSpeed has no such call: without it
  /// the remainder carries into the next window.
  bool flush();

  /// Sets the accumulation boundary by hand, as DeepSpeed's method of that name:
  /// sticky until set again or cleared. While it is set, backward() may be called
  /// several times before one step(); a step() with `true` ends the window like
  /// flush() (the gradients are the mean over the window's k backward() calls,
  /// whatever GAS is), a step() with `false` only counts. DeepSpeed keeps the 1/GAS
  /// factor instead, so its gradient is k/GAS times the mean when k != GAS.
  void set_gradient_accumulation_boundary(bool is_boundary);
  /// Returns to counting micro-steps (the boundary every GAS step() calls). Only
  /// between windows: inside one it throws UsageError.
  void clear_gradient_accumulation_boundary();

  /// Saves a checkpoint in `dir`, wherever the loop is: at a boundary or inside a window
  /// (its gradients are saved too, per rank), so that load_checkpoint continues the run
  /// bit for bit. Collective with W > 1: every rank calls it. Returns `<dir>/<tag>`.
  /// Throws CheckpointError when a file cannot be written, on every rank (see NOTE:
  /// [checkpoint phases]); the previous checkpoint and `latest` stay loadable. See
  /// docs/checkpoints.md and NOTE: [checkpoint layout].
  std::string save_checkpoint(const std::string& dir, const SaveOptions& options = {});
  /// Loads a checkpoint into this engine, which must be built as the saved one was (same
  /// model and optimizer type; the config may differ at a boundary). Checks every name,
  /// shape and dtype, and for a window in progress the GAS, world size and precision,
  /// before changing anything: on CheckpointError the engine is as it was. Collective
  /// with W > 1 (all ranks load the same tag; an error on one rank throws on all, and
  /// no rank's engine changes).
  LoadedCheckpoint load_checkpoint(const std::string& dir, const LoadOptions& options = {});

  /// Whether the NEXT step() call is at the accumulation boundary.
  bool is_gradient_accumulation_boundary() const;
  /// Optimizer steps taken or skipped (+1 at every boundary).
  int64_t global_steps() const;
  /// Micro-steps so far: +1 for each step() call; flush() moves it on to the
  /// end of the window it ends (the micro-steps that window did not get).
  int64_t micro_steps() const;
  /// Boundaries whose optimizer step was skipped (fp16 overflow).
  int64_t skipped_steps() const;
  /// Samples consumed by boundary steps, over all ranks.
  int64_t global_samples() const;
  /// Whether the last step() (or flush()) call stepped the optimizer: false
  /// after a step() off the boundary, as in DeepSpeed.
  bool was_step_applied() const;
  /// The loss of the last finished window (a boundary step, skipped or not, or a
  /// flush): the loss whose gradient that step used, i.e. the mean of the losses
  /// passed to backward() over the window's micro-batches (with scale_wrt_gas off,
  /// the sum of what backward() returned). A 0-dim float tensor on the loss's device,
  /// detached, this rank's only; reading it is the caller's host sync. This is what
  /// to log per optimizer step. Throws UsageError before the first window ends.
  torch::Tensor window_loss() const;
  /// The current lr of every parameter group.
  std::vector<double> get_lr() const;
  /// Global L2 norm of the gradients at the last boundary, before clipping
  /// (unscaled; inf or nan after an fp16 overflow).
  double global_grad_norm() const;
  /// The current fp16 loss scale S (1 in fp32 and bf16). backward() multiplies
  /// by it internally; its return value never includes it.
  double loss_scale() const;
  /// The parameters the optimizer steps: fp32 master copies of the model's trainable
  /// parameters under fp16 and bf16 (the model holds their rounded copies), the model's
  /// own parameters in fp32. Read them for the fp32 weights of a half-precision run.
  /// Under ZeRO stage 1 with W > 1: this rank's share only (docs/zero.md).
  const std::vector<torch::Tensor>& master_params() const;

  /// The resolved batch sizes.
  const BatchSizes& batch_sizes() const;
  /// Samples per optimizer step over all ranks.
  int64_t train_batch_size() const;
  /// Samples per micro-batch on this rank.
  int64_t train_micro_batch_size_per_gpu() const;
  /// Micro-batches per optimizer step (GAS).
  int64_t gradient_accumulation_steps() const;

  /// The optimizer the engine steps (under ZeRO stage 1 with W > 1, over this rank's
  /// share of the parameters).
  torch::optim::Optimizer& optimizer();
  /// The LR scheduler the engine steps, or null.
  torch::optim::LRScheduler* lr_scheduler();
  /// The model.
  torch::nn::Module& module();
  /// The parsed configuration.
  const Config& config() const;
  /// The reducer that averages gradients over the ranks at each boundary: an internal
  /// type (src/gradient_reducer.h), for the tests and benchmarks that count its calls.
  const distributed::GradientReducer& gradient_reducer() const;

 private:
  struct State;  // everything the engine holds: src/engine_state.h
  std::unique_ptr<State> state_;
};

/// Creates an engine for `model` from `config`. `optimizer` / `lr_scheduler`
/// are client objects that replace the config's sections (a config section and
/// a client object for the same role is a ConfigError). In fp16/bf16 a client
/// optimizer, built over the model's parameters, is handed the fp32 masters in their
/// place (docs/mixed-precision.md). A client scheduler must drive the engine's
/// optimizer; the engine steps it, not you.
Engine initialize(std::shared_ptr<torch::nn::Module> model, Config config,
                  std::unique_ptr<torch::optim::Optimizer> optimizer = nullptr,
                  std::unique_ptr<torch::optim::LRScheduler> lr_scheduler = nullptr);

/// Overload for module holders such as torch::nn::Linear or TORCH_MODULE types.
template <typename ModuleImpl>
Engine initialize(const torch::nn::ModuleHolder<ModuleImpl>& model, Config config,
                  std::unique_ptr<torch::optim::Optimizer> optimizer = nullptr,
                  std::unique_ptr<torch::optim::LRScheduler> lr_scheduler = nullptr) {
  return initialize(model.ptr(), std::move(config), std::move(optimizer), std::move(lr_scheduler));
}

/// Creates an engine whose optimizer is the config's `"optimizer"` section built over
/// `param_groups`, one LibTorch parameter group each, with the group's own options set
/// over the section's (DeepSpeed's `model_parameters` as a list of dicts). Every
/// parameter of `model` that requires grad must be in exactly one group
/// (weight_decay_groups() makes the usual split); ConfigError naming the parameter
/// otherwise, or when the config has no optimizer section. Under fp16/bf16 the groups
/// hold the fp32 master weights, as a client optimizer's do.
Engine initialize(std::shared_ptr<torch::nn::Module> model, Config config,
                  std::vector<ParamGroup> param_groups,
                  std::unique_ptr<torch::optim::LRScheduler> lr_scheduler = nullptr);

/// Overload for module holders, with parameter groups.
template <typename ModuleImpl>
Engine initialize(const torch::nn::ModuleHolder<ModuleImpl>& model, Config config,
                  std::vector<ParamGroup> param_groups,
                  std::unique_ptr<torch::optim::LRScheduler> lr_scheduler = nullptr) {
  return initialize(model.ptr(), std::move(config), std::move(param_groups),
                    std::move(lr_scheduler));
}

}  // namespace stepwise
