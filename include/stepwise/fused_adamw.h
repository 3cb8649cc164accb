// stepwise: FusedAdamW, a torch::optim::Optimizer whose step is one fused multi-tensor
// Adam/AdamW update (stepwise::fused::adamw_step: CUDA kernels on CUDA, ATen on CPU).
//
// Usage {.cpp .fragment context="engine"}:
//
//   stepwise::FusedAdamW optimizer(model->parameters(),
//                                  torch::optim::AdamWOptions(1e-3).weight_decay(0.01));
//   auto loss = loss_of(0);
//   loss.backward();
//   optimizer.step();  // as torch::optim::AdamW, in one pass over all parameters
//   // What the engine does with it under fp16/bf16: the same pass writes the new weights,
//   // rounded, into the model's copies, and takes the unscale (and clip) factor as a value.
//   auto weight = model->weight.detach().to(torch::kBFloat16);
//   auto bias = model->bias.detach().to(torch::kBFloat16);
//   optimizer.set_model_copies({weight, bias});  // one per parameter, in group order
//   optimizer.step_with_grad_scale(0.5);          // the gradients times 0.5, then the step
//   CHECK(torch::equal(weight, model->weight.detach().to(torch::kBFloat16)));
//   torch::serialize::OutputArchive archive;
//   optimizer.save(archive);  // its state, as torch::optim::AdamW saves its own
//   // DeepSpeed's FusedAdam flags: Adam's L2 weight decay, and no bias correction.
//   stepwise::FusedAdamW adam(model->parameters(), torch::optim::AdamWOptions(1e-3),
//                             stepwise::FusedAdamWMode().decoupled(false).bias_correction(false));
//
// It is what the engine builds for "Adam"/"AdamW" when the model is on CUDA (or when
// optimizer.params.torch_adam is false): same options, same state (AdamWParamState),
// same results as torch::optim::AdamW (Adam with decoupled = false) to float rounding,
// and schedulers drive its learning rate as they do LibTorch's. With model copies set
// (fp16/bf16 training), the update also writes the rounded new weights into them.
#pragma once

#include <stepwise/precision.h>

#include <torch/optim/adamw.h>
#include <torch/optim/optimizer.h>

#include <vector>

namespace stepwise {

/// How FusedAdamW updates, beyond LibTorch's AdamWOptions: the flags of DeepSpeed's
/// FusedAdam.
struct FusedAdamWMode {
  /// AdamW (true) or Adam with the weight decay added to the gradient (false), as
  /// DeepSpeed's `adam_w_mode`.
  TORCH_ARG(bool, decoupled) = true;
  /// Divide the moments by 1 - beta^step (true), or use them as they are (false), as
  /// DeepSpeed's `bias_correction`; LibTorch's Adam and AdamW always divide.
  TORCH_ARG(bool, bias_correction) = true;
};

/// Adam/AdamW as one fused update per parameter group.
class FusedAdamW : public torch::optim::Optimizer, public WritesModelCopies, public TakesGradScale {
 public:
  /// AdamW over `params` (Adam with L2 weight decay when `mode.decoupled()` is false).
  /// Throws std::invalid_argument for amsgrad (not fused: use torch::optim::AdamW) or a
  /// non-contiguous parameter.
  explicit FusedAdamW(std::vector<torch::Tensor> params, torch::optim::AdamWOptions options = {},
                      FusedAdamWMode mode = {});
  /// The same over parameter groups: a group without options has `defaults`.
  FusedAdamW(std::vector<torch::optim::OptimizerParamGroup> groups,
             torch::optim::AdamWOptions defaults, FusedAdamWMode mode = {});

  /// One update of every parameter with a gradient; parameters without one are skipped
  /// (their step count does not advance), as in torch::optim::AdamW.
  torch::Tensor step(LossClosure closure = nullptr) override;

  /// Tensors that receive each parameter's new value after every step (rounded to
  /// their dtype): one per parameter, in parameter-group order. Empty: none.
  void set_model_copies(std::vector<torch::Tensor> copies) override;
  /// step(), with every gradient multiplied by `grad_scale` in the same pass (the engine
  /// folds the unscale and the clip into it).
  void step_with_grad_scale(double grad_scale) override { update(nullptr, grad_scale); }

  /// Saves state and options (the format of torch::optim::AdamW).
  void save(torch::serialize::OutputArchive& archive) const override;
  /// Loads what save() wrote.
  void load(torch::serialize::InputArchive& archive) override;

 private:
  std::vector<torch::Tensor> all_params() const;  // every group's, in order
  torch::Tensor update(const LossClosure& closure, double grad_scale);

  FusedAdamWMode mode_;
  std::vector<torch::Tensor> copies_;  // parallel to all_params(), or empty
};

}  // namespace stepwise
