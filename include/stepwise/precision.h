// stepwise: the precision policy: fp32, fp16 with loss scaling, or bf16.
//
// Usage {.cpp .fragment context="basic"}:
//
//   auto config = stepwise::Config::from_string(
//       R"({"train_micro_batch_size_per_gpu": 2, "bf16": {"enabled": true}})");
//   const bool bf16 = config.precision.mode() == stepwise::PrecisionMode::kBf16;  // true
//   // The same in C++: fp32 is the default, fp16 takes the loss scaler's options.
//   stepwise::PrecisionOptions fp32;
//   CHECK(fp32.mode() == stepwise::PrecisionMode::kFp32);
//   auto fp16 = stepwise::PrecisionOptions()
//                   .mode(stepwise::PrecisionMode::kFp16)
//                   .loss_scaler(stepwise::LossScalerOptions().init_scale(4096));
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
#include <torch/types.h>

#include <vector>

namespace stepwise {

/// Which arithmetic the model runs in.
enum class PrecisionMode { kFp32, kFp16, kBf16 };

/// Options of the engine's precision policy: DeepSpeed's `"fp16"` and `"bf16"` sections.
struct PrecisionOptions {
  /// fp32 (default), fp16 (with the loss scaler) or bf16.
  TORCH_ARG(PrecisionMode, mode) = PrecisionMode::kFp32;
  /// The fp16 loss scale's options (used in kFp16 only).
  TORCH_ARG(LossScalerOptions, loss_scaler);
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
/// (FusedAdamW): the engine then folds the fp16
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

}  // namespace stepwise
