// stepwise (internal): the engine's precision policy, one type per arithmetic behind one
// interface: fp32, bf16 (fp32 master copies) and fp16 (master copies and the loss scaler).
// Its options are include/stepwise/precision.h's PrecisionOptions.
//
// How the engine uses it:
//
//   auto precision = stepwise::Precision::make(
//       stepwise::PrecisionOptions().mode(stepwise::PrecisionMode::kBf16),
//       *model);                                    // casts the model to bf16
//   auto optimizer = stepwise::make_optimizer(stepwise::OptimizerOptions("AdamW"),
//                                             precision->optimizer_params());  // fp32 masters
//   precision->attach(*optimizer);                  // a FusedAdamW writes the model too
//   auto out = model->forward(batches[0].first.to(torch::kBFloat16)).to(torch::kFloat);
//   auto loss = torch::mse_loss(out, batches[0].second);
//   precision->scale_loss(loss / 4).backward();     // * S for fp16
//   auto stats = precision->unscale_and_check(1.0); // master grads, norm, overflow
//   if (!stats.overflow) { optimizer->step(); precision->copy_to_model(); }
//   precision->finish_boundary(stats.overflow);     // loss-scale bookkeeping
//
#pragma once

#include <stepwise/precision.h>

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <functional>
#include <memory>
#include <optional>
#include <vector>

namespace stepwise {

/// What the boundary learned about the gradients.
struct GradientStats {
  /// Global L2 norm of the unscaled gradients (inf or nan on overflow).
  double norm = 0.0;
  /// Whether any gradient was inf or nan (fp16 only; bf16 and fp32 never skip).
  bool overflow = false;
};

/// The precision policy of an engine: the Engine holds one and never asks which.
class Precision {
 public:
  /// Casts `model` (its floating-point parameters and buffers) to options.mode() and
  /// builds that mode's policy: fp32 trains the parameters themselves; bf16 and fp16
  /// make fp32 master copies of the trainable parameters; fp16 adds the loss scaler.
  static std::unique_ptr<Precision> make(const PrecisionOptions& options, torch::nn::Module& model);
  virtual ~Precision() = default;
  Precision(const Precision&) = delete;
  Precision& operator=(const Precision&) = delete;

  /// "fp32", "fp16" or "bf16": what a checkpoint records.
  virtual const char* name() const = 0;
  /// Whether optimizer_params() are fp32 copies (bf16, fp16) rather than the model's own.
  virtual bool has_masters() const = 0;
  /// The parameters the optimizer must update (fp32 masters, or the model's own in fp32):
  /// those of owned() only, in its order.
  const std::vector<torch::Tensor>& optimizer_params() const { return master_; }
  /// The indices into model_params() whose masters this rank keeps and steps: all of
  /// them, unless shard() chose some (ZeRO stage 1).
  const std::vector<size_t>& owned() const { return owned_; }
  /// ZeRO stage 1 (see NOTE: [whole-tensor shards]): keeps the masters of the `owned`
  /// parameters only (indices into model_params(), in order) and hands the optimizer
  /// those; the norm and the overflow flag then add up every rank's share through
  /// `sum_over_ranks` (an all-reduce sum), bitwise what one rank computes over all.
  /// Call before adopt() and before an optimizer is built over optimizer_params().
  void shard(std::vector<size_t> owned, std::function<void(torch::Tensor&)> sum_over_ranks);
  /// The optimizer's parameter groups as indices into model_params(), every rank's
  /// parameters included (what a checkpoint's optimizer state is laid out by, whatever
  /// the sharding): one group of all unless adopt() saw a client's groups; empty when a
  /// client's group holds a tensor that is not a trainable parameter (fp32 only allows it).
  const std::vector<std::vector<size_t>>& group_members() const { return groups_; }
  /// The model's trainable parameters (half or bf16 in those modes); their
  /// gradients are what backward() fills and the data-parallel reducer averages.
  std::vector<torch::Tensor>& model_params() { return model_; }
  /// The same, read-only.
  const std::vector<torch::Tensor>& model_params() const { return model_; }
  /// The current loss scale S (1 unless fp16).
  virtual double loss_scale() const { return 1.0; }
  /// The scaler (fp16 only), else null.
  virtual const LossScaler* scaler() const { return nullptr; }
  /// The scaler (fp16 only), else null; a checkpoint restores it.
  virtual LossScaler* scaler() { return nullptr; }

  /// What to call backward() on: the loss as fp32, times S for fp16.
  virtual torch::Tensor scale_loss(const torch::Tensor& loss) const;
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
  /// Takes a client optimizer, built by the user over the model's parameters: in fp16 and
  /// bf16 each of its parameters is replaced by that parameter's fp32 master, so that it
  /// steps the masters, as DeepSpeed's FP16_Optimizer and BF16_Optimizer do (its groups
  /// and their options stay). Sharded (shard()), a parameter this rank does not own
  /// leaves its group. ConfigError if it holds a tensor that is not a trainable
  /// parameter of the model, or has state already. fp32 unsharded: nothing to do.
  void adopt(torch::optim::Optimizer& client);
  /// Lets an optimizer over optimizer_params() that WritesModelCopies (a FusedAdamW)
  /// write the model's half/bf16 weights in its update (see NOTE: [fused write-back]);
  /// other optimizers, and every optimizer in fp32, are left alone.
  virtual void attach(torch::optim::Optimizer& optimizer) = 0;
  /// Copies the masters back into the model's parameters (after an applied step); a
  /// no-op in fp32 and when an attached optimizer already did.
  virtual void copy_to_model() = 0;
  /// Sets every gradient (model and masters) to none.
  void zero_grads();
  /// Loss-scale bookkeeping at the end of a boundary (see NOTE: [loss scale rule]);
  /// nothing to do but in fp16.
  virtual void finish_boundary(bool /*overflow*/) {}

 protected:
  /// Takes `model`'s trainable parameters (ConfigError if there are none) as both the
  /// model's and the optimizer's; a policy with masters replaces master_.
  explicit Precision(torch::nn::Module& model);
  /// Whether an inf or nan gradient skips the step (fp16 only).
  virtual bool skips_overflow() const { return false; }
  /// The index in model_params() of `p`, a model parameter or a master; ConfigError if it
  /// is neither.
  size_t index_of(const torch::Tensor& p) const;
  /// The same, or nothing.
  std::optional<size_t> find_index(const torch::Tensor& p) const;
  /// `optimizer`'s groups as indices into model_params(); nothing if a group holds a
  /// tensor that is not a trainable parameter or a master.
  std::optional<std::vector<std::vector<size_t>>> members_of(
      const torch::optim::Optimizer& optimizer) const;
  /// The norm and the overflow flag of `grads`, the gradients of model_params()
  /// `indices` (one each), with `found_inf` (undefined: not checked): one host sync.
  GradientStats stats_of(const std::vector<torch::Tensor>& grads,
                         const std::vector<size_t>& indices, const torch::Tensor& found_inf);

  std::vector<torch::Tensor> model_;
  std::vector<size_t> owned_;                           // indices into model_, one per master
  std::vector<torch::Tensor> master_;                   // one per owned_ entry
  std::function<void(torch::Tensor&)> sum_over_ranks_;  // set by shard()
  std::vector<std::vector<size_t>> groups_;             // group_members()
};

}  // namespace stepwise
