// stepwise (internal): loading what tools/deepspeed-to-stepwise converts from a DeepSpeed
// stage-0 checkpoint. see docs/checkpoints.md, "From a DeepSpeed checkpoint"
#pragma once

#include <ATen/core/Dict.h>
#include <ATen/core/ivalue.h>

#include <string>

#include "checkpoint/state.h"

namespace torch::optim {
class Optimizer;
}  // namespace torch::optim

namespace stepwise::detail {

/// The converted file as stepwise's own shared state: a boundary checkpoint without a
/// window (`micro_steps` = global_steps x `gas`).
SharedState from_deepspeed(const c10::impl::GenericDict& ds, const std::string& file, int64_t gas,
                           const std::string& precision);
/// Why the converted Adam/AdamW state `saved` does not fit `optimizer` (empty: it fits).
std::string deepspeed_optimizer_mismatch(torch::optim::Optimizer& optimizer,
                                         const c10::IValue& saved);
/// Loads `saved` (checked by deepspeed_optimizer_mismatch) into `optimizer`: moments, step
/// counts and each group's lr, betas, eps and weight decay.
void apply_deepspeed_optimizer(torch::optim::Optimizer& optimizer, const c10::IValue& saved);

}  // namespace stepwise::detail
