// stepwise (internal): an optimizer's part of a checkpoint: its state and its parameter
// groups' options, saved to a LibTorch archive, checked against this optimizer before a
// load changes anything (NOTE: [optimizer state check]), then loaded.
#pragma once

#include <torch/optim/optimizer.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <functional>
#include <string>

namespace stepwise::detail {

/// Writes `optimizer`'s state, each group's size and each group's options into `archive`
/// (LibTorch 1.13's Optimizer::save leaves the options out).
void save_optimizer(const torch::optim::Optimizer& optimizer,
                    torch::serialize::OutputArchive& archive);

/// Why the state in `archive` (read from `file`) does not fit `optimizer`: another number
/// of groups or of parameters in a group, or a state entry whose tensors have another
/// shape or dtype than its parameter (`name_of` names a parameter in the message). Empty:
/// it fits. `optimizer` is as it was afterwards, whatever the archive holds.
std::string optimizer_mismatch(torch::optim::Optimizer& optimizer,
                               torch::serialize::InputArchive& archive, const std::string& file,
                               const std::function<std::string(const torch::Tensor&)>& name_of);

/// Loads the state and the options saved by save_optimizer into `optimizer`, replacing its
/// whole state.
void load_optimizer(torch::optim::Optimizer& optimizer, torch::serialize::InputArchive& archive);

}  // namespace stepwise::detail
