// stepwise: the precision policy: fp32, fp16 with loss scaling, or bf16.
//
// Usage {.cpp .fragment context="engine"} (what Engine does with it):
//
//   stepwise::Precision
//   precision(stepwise::PrecisionOptions().mode(stepwise::PrecisionMode::kBf16),
//                                 *model);          // casts the model to bf16
//   auto optimizer = stepwise::make_optimizer(stepwise::OptimizerOptions("AdamW"),
//                                             precision.optimizer_params());  // fp32 masters
//   precision.attach(*optimizer);                   // a FusedAdamW writes the model too
//   auto out = model->forward(batches[0].first.to(torch::kBFloat16)).to(torch::kFloat);
//   auto loss = torch::mse_loss(out, batches[0].second);
//   precision.scale_loss(loss / 4).backward();      // * S for fp16
//   auto stats = precision.unscale_and_check(1.0);  // master grads, norm, overflow
//   if (!stats.overflow) { optimizer->step(); precision.copy_to_model(); }
//   precision.finish_boundary(stats.overflow);      // loss-scale bookkeeping
//
// fp16: the model's parameters are half; fp32 master copies live in the
// optimizer; backward() multiplies the (GAS-divided) loss by S in fp32;
// at the boundary the gradients are copied to the masters, unscaled by 1/S and
// checked for inf/nan in one pass (one host sync, together with the norm); an
// overflow skips the optimizer and scheduler step. bf16: bf16 model, fp32
// masters, S = 1, never skips. fp32: the masters ARE the model's parameters.
#pragma once

#include <stepwise/loss_scaler.h>

#include <torch/arg.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <optional>
#include <vector>

namespace stepwise {

/// Which arithmetic the model runs in.
enum class PrecisionMode { kFp32, kFp16, kBf16 };

/// Options of Precision: DeepSpeed's `"fp16"` and `"bf16"` sections.
struct PrecisionOptions {
  /// fp32 (default), fp16 (with the loss scaler) or bf16.
  TORCH_ARG(PrecisionMode, mode) = PrecisionMode::kFp32;
  /// The fp16 loss scale's options (used in kFp16 only).
  TORCH_ARG(LossScalerOptions, loss_scaler);
};

/// What the boundary learned about the gradients.
struct GradientStats {
  /// Global L2 norm of the unscaled gradients (inf or nan on overflow).
  double norm = 0.0;
  /// Whether any gradient was inf or nan (fp16 only; bf16 and fp32 never skip).
  bool overflow = false;
};

/// An optimizer that can also write each parameter's new value, rounded, into a copy
/// (the half/bf16 model) in its update pass; FusedAdamW is one. Precision::attach hands
/// it the model's parameters (see NOTE: [fused write-back]).
class WritesModelCopies {
 public:
  /// Polymorphic base.
  virtual ~WritesModelCopies() = default;
  /// Tensors that receive each parameter's new value after every step (rounded to
  /// their dtype): one per parameter, in parameter-group order. Empty: none.
  virtual void set_model_copies(std::vector<torch::Tensor> copies) = 0;
};

/// An optimizer that multiplies every gradient by a factor inside its own update pass
/// (FusedAdamW, through fused::AdamWStep::grad_scale): the engine then folds the fp16
/// unscale, an early-ended window's factor and the clip coefficient into that one factor,
/// passed to the step as a value, instead of multiplying the gradients beforehand (see
/// NOTE: [folded unscale]).
class TakesGradScale {
 public:
  /// Polymorphic base.
  virtual ~TakesGradScale() = default;
  /// One optimizer step in which every gradient is multiplied by `grad_scale` first.
  virtual void step_with_grad_scale(double grad_scale) = 0;
};

/// The precision policy of an engine: one object, no precision branches in Engine.
class Precision {
 public:
  /// Casts `model` (its floating-point parameters and buffers) to options.mode() and
  /// makes fp32 master copies of its trainable parameters; fp16 builds the loss scaler.
  Precision(const PrecisionOptions& options, torch::nn::Module& model);

  /// The mode in use.
  PrecisionMode mode() const { return mode_; }
  /// The parameters the optimizer must update (fp32 masters, or the model's own in fp32).
  const std::vector<torch::Tensor>& optimizer_params() const { return master_; }
  /// The model's trainable parameters (half or bf16 in those modes); their
  /// gradients are what backward() fills and the data-parallel reducer averages.
  std::vector<torch::Tensor>& model_params() { return model_; }
  /// The current loss scale S (1 unless fp16).
  double loss_scale() const { return scaler_ ? scaler_->scale() : 1.0; }
  /// The scaler (fp16 only), else null.
  const LossScaler* scaler() const { return scaler_ ? &*scaler_ : nullptr; }
  /// The scaler (fp16 only), else null; a checkpoint restores it.
  LossScaler* scaler() { return scaler_ ? &*scaler_ : nullptr; }

  /// What to call backward() on: the loss as fp32, times S for fp16.
  torch::Tensor scale_loss(const torch::Tensor& loss) const;
  /// Moves the model's gradients to the masters, multiplies them by factor / S,
  /// and computes the norm and the overflow flag with one host sync.
  GradientStats unscale_and_check(double factor);
  /// For an optimizer that TakesGradScale: hands it the model's gradients as they are
  /// (no fp32 copy, no multiply) and computes, in one read-only pass and one host sync,
  /// the norm of the gradients times factor / S and the overflow flag. The optimizer
  /// must then be given grad_scale(factor) times the clip coefficient.
  GradientStats check_unscaled(double factor);
  /// factor / S: what the gradients are multiplied by to unscale them.
  double grad_scale(double factor) const { return factor / loss_scale(); }
  /// Throws ConfigError when `client_optimizer` (the user built the optimizer) in
  /// fp16/bf16: the optimizer must update the fp32 masters, which only the engine holds.
  void check_optimizer_source(bool client_optimizer) const;
  /// Lets an optimizer over optimizer_params() that WritesModelCopies (a FusedAdamW)
  /// write the model's half/bf16 weights in its update (see NOTE: [fused write-back]);
  /// other optimizers are left alone.
  void attach(torch::optim::Optimizer& optimizer);
  /// Copies the masters back into the model's parameters (after an applied step); a
  /// no-op when an attached optimizer already did.
  void copy_to_model();
  /// Sets every gradient (model and masters) to none.
  void zero_grads();
  /// Loss-scale bookkeeping at the end of a boundary (see NOTE: [loss scale rule]).
  void finish_boundary(bool overflow);

 private:
  PrecisionMode mode_;
  std::vector<torch::Tensor> model_;
  std::vector<torch::Tensor> master_;
  std::optional<LossScaler> scaler_;
  bool writes_back_ = false;
};

}  // namespace stepwise
