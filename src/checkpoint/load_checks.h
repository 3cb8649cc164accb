// stepwise (internal): the checks a load runs before it changes anything, each named for
// what it checks. A failed check throws CheckpointError naming the file, what is wrong and
// the fix. see NOTE: [checkpoint phases]
#pragma once

#include <torch/nn/module.h>
#include <torch/types.h>

#include "checkpoint/protocol.h"

#include <string>
#include <utility>
#include <vector>

namespace stepwise::detail {

/// `value` (saved as `what` "`name`" in `file`) has the shape of `target`, and its dtype
/// (or, for floating point, is floating point too).
void check_fits(const std::string& name, const torch::Tensor& value, const torch::Tensor& target,
                const char* what, const std::string& file);

/// A window in progress resumes only in the setup it was saved in: the same world size,
/// gradient_accumulation_steps and precision.
void check_window_setup(const ReadCheckpoint& c, const Setup& now);

/// This rank's window file comes from the same save as the shared file (the same
/// micro-step), and, when the window is continued, holds as many backward() calls.
void check_window_matches_shared(const ReadCheckpoint& c);

/// The model's parameters and buffers and how they are stored.
struct ModelTensors {
  /// Every parameter and buffer, by name.
  std::vector<std::pair<std::string, torch::Tensor>> all;
  /// The trainable parameters' names, as the model's tensors and as the optimizer's
  /// (the fp32 masters under fp16/bf16; the same tensors under fp32; undefined for a
  /// parameter whose master another rank keeps, under ZeRO stage 1).
  std::vector<std::string> trainable_names;
  std::vector<torch::Tensor> model_params;
  std::vector<torch::Tensor> masters;
};

/// (target, value) for every tensor a load copies.
using Copies = std::vector<std::pair<torch::Tensor, torch::Tensor>>;

/// Every parameter and buffer of the model is in the checkpoint with its shape and dtype,
/// and it holds no others (both only with `strict`); each trainable one has its fp32
/// master when the file has masters. Returns the copies: masters from the masters, the
/// model's tensors from the weights.
Copies weights_to_load(const ReadCheckpoint& c, const ModelTensors& model, bool strict);

/// The pending gradients name trainable parameters and fit them. Returns them by
/// trainable index (undefined: none), on the parameters' devices.
std::vector<torch::Tensor> window_grads_to_load(const ReadCheckpoint& c, const ModelTensors& model);

/// The scheduler's saved lrs are one per parameter group.
void check_scheduler_groups(const ReadCheckpoint& c, size_t groups);

}  // namespace stepwise::detail
