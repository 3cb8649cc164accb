// stepwise (internal): the guard rails for calls a ported loop leaves behind.
//
// NOTE: [leftover calls] A loop ported to the engine often keeps a call that the
// engine now makes: zero_grad() at the top of every iteration, optimizer.step(), or
// its own clip_grad_norm_. Each gives wrong weights with no error, so the engine
// refuses them (docs/gradient-accumulation.md, pitfall 5):
// 1. gradients cleared or changed between micro-steps of a window (checked when
//    backward() starts; "stepwise.check_grads_cleared");
// 2. gradients changed between backward() and step() (checked when step() and
//    flush() start; "stepwise.check_grads_changed");
// 3. the optimizer's parameters updated outside step() (checked when step() and
//    flush() start; "stepwise.check_params_changed").
// How, at little cost per micro-step and without a host sync off the boundary:
// - Each tensor's identity (its TensorImpl) and version counter are recorded after
//   every backward() and every boundary. An in-place op, set_to_none and a new
//   tensor each change one of them, so comparing them is a loop over the parameters.
// - LibTorch 1.13 writes some updates through .data(), which has its own version
//   counter: clip_grad_norm_ scales the gradients that way, and SGD::step() updates
//   the parameters that way. For those, per-tensor fingerprints are compared too: of
//   the gradients, after the backward() that ends a window and when its step() starts;
//   of the parameters, at each boundary until the engine's own first optimizer step,
//   and after it only if that step left every version counter unchanged (a
//   "version-blind" optimizer, such as LibTorch's SGD).
// - A fingerprint is a 64-bit hash of the bytes on the CPU (one pass over memory, no
//   ATen op), so any change is seen. On a GPU it is the bits of each tensor's L2 norm
//   (one _foreach_norm and one host sync per comparison, at the boundary only: one for
//   the gradients, one more for a version-blind optimizer's parameters), so a change
//   that keeps every norm (a permutation) is missed there.
#pragma once

#include <stepwise/guard_rails.h>

#include <torch/nn/module.h>
#include <torch/types.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace stepwise::detail {

/// The names of the model's trainable parameters, in Precision's order (the order of
/// model_params() and optimizer_params()).
std::vector<std::string> trainable_names(torch::nn::Module& model);

/// What the guard rails of NOTE: [leftover calls] remember about some tensors.
struct TensorMarks {
  std::vector<const c10::TensorImpl*> impls;  // null: undefined
  std::vector<uint32_t> versions;
};

/// The three leftover-call checks of one engine.
class LeftoverChecks {
 public:
  /// `names[i]` names `grad_params[i]` (the model's trainable parameters, whose
  /// .grad backward() fills) and `updated[i]` (what the optimizer updates: the same
  /// tensors in fp32, the fp32 masters in fp16/bf16) is that of `grad_params[updated_index[i]]`
  /// (under ZeRO stage 1, a rank updates its own share only).
  LeftoverChecks(const GuardRailOptions& options, std::vector<std::string> names,
                 std::vector<torch::Tensor> grad_params, std::vector<torch::Tensor> updated,
                 std::vector<size_t> updated_index);

  /// Check 1, when backward() starts.
  void before_backward(int64_t micro_steps) const;
  /// Records the gradients after backward(); `ends_window`: the next step() is a
  /// boundary, so their norms are recorded too.
  void after_backward(bool ends_window);
  /// Checks 2 and 3, when step() or flush() starts; `boundary`: it will update.
  void before_step(int64_t micro_steps, bool boundary);
  /// Records gradients and parameters after a boundary; `applied`: the optimizer stepped.
  void after_boundary(bool applied);

 private:
  TensorMarks grad_marks() const;
  TensorMarks param_marks() const;
  std::vector<uint64_t> grad_fingerprints() const;
  std::vector<uint64_t> param_fingerprints() const;

  bool check_cleared_;
  bool check_changed_;
  bool check_params_;
  std::vector<std::string> names_;
  std::vector<torch::Tensor> grad_params_;
  std::vector<torch::Tensor> updated_;
  std::vector<size_t> updated_index_;
  TensorMarks grads_;
  TensorMarks params_;
  std::vector<uint64_t> window_end_grad_prints_;  // after the backward() ending a window
  std::vector<uint64_t> param_prints_;            // after the last boundary (version-blind only)
  bool calibrated_ = false;                       // the first applied step has been seen
  bool version_blind_ = false;                    // the optimizer updates through .data()
};

}  // namespace stepwise::detail
