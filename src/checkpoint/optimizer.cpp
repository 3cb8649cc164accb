#include "checkpoint/optimizer.h"

#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>
#include <torch/types.h>

#include "checkpoint/files.h"
#include "torch_compat.h"

#include <memory>
#include <utility>
#include <vector>

namespace stepwise::detail {

// LibTorch 1.13's Optimizer::load restores the state but not the parameter groups'
// options (lr, betas, momentum, ...), so they are saved beside it, group by group, with
// each group's size so that a load can check them before it changes anything.
void save_optimizer(const torch::optim::Optimizer& optimizer,
                    torch::serialize::OutputArchive& archive) {
  torch::serialize::OutputArchive state(archive.compilation_unit());
  optimizer.save(state);
  archive.write("state", state);
  const auto& groups = optimizer.param_groups();
  std::vector<int64_t> sizes;
  for (const auto& g : groups) sizes.push_back(static_cast<int64_t>(g.params().size()));
  archive.write("group_sizes", torch::tensor(sizes, torch::kLong));
  for (size_t i = 0; i < groups.size(); ++i) {
    torch::serialize::OutputArchive options(archive.compilation_unit());
    groups[i].options().serialize(options);
    archive.write(c10::str("options/", i), options);
  }
}

void load_optimizer(torch::optim::Optimizer& optimizer, torch::serialize::InputArchive& archive) {
  torch::serialize::InputArchive state;
  archive.read("state", state);
  // Optimizer::load only sets the parameters the archive has a state for: the state of a
  // parameter it lacks (never stepped when saved) must not survive from before the load.
  optimizer.state().clear();
  optimizer.load(state);
  auto& groups = optimizer.param_groups();
  for (size_t i = 0; i < groups.size(); ++i) {
    torch::serialize::InputArchive options;
    archive.read(c10::str("options/", i), options);
    groups[i].options().serialize(options);
  }
}

namespace {

using Named = std::vector<std::pair<const char*, torch::Tensor>>;

// The tensors of one parameter's state, for the state types of LibTorch's optimizers
// (FusedAdamW keeps AdamWParamState); another type's tensors are not known, so not checked.
Named state_tensors(const torch::optim::OptimizerParamState& state) {
  using namespace torch::optim;
  if (const auto* s = dynamic_cast<const AdamWParamState*>(&state)) {
    return {{"exp_avg", s->exp_avg()},
            {"exp_avg_sq", s->exp_avg_sq()},
            {"max_exp_avg_sq", s->max_exp_avg_sq()}};
  }
  if (const auto* s = dynamic_cast<const AdamParamState*>(&state)) {
    return {{"exp_avg", s->exp_avg()},
            {"exp_avg_sq", s->exp_avg_sq()},
            {"max_exp_avg_sq", s->max_exp_avg_sq()}};
  }
  if (const auto* s = dynamic_cast<const SGDParamState*>(&state)) {
    return {{"momentum_buffer", s->momentum_buffer()}};
  }
  if (const auto* s = dynamic_cast<const AdagradParamState*>(&state)) return {{"sum", s->sum()}};
  if (const auto* s = dynamic_cast<const RMSpropParamState*>(&state)) {
    return {{"square_avg", s->square_avg()},
            {"momentum_buffer", s->momentum_buffer()},
            {"grad_avg", s->grad_avg()}};
  }
  return {};
}

std::string group_size_mismatch(torch::optim::Optimizer& optimizer,
                                torch::serialize::InputArchive& archive, const std::string& file) {
  torch::Tensor sizes;
  reading(file, [&] { archive.read("group_sizes", sizes); });
  const auto& groups = optimizer.param_groups();
  if (sizes.numel() != static_cast<int64_t>(groups.size())) {
    return c10::str("it has ", sizes.numel(), " parameter groups, this optimizer ", groups.size());
  }
  for (size_t i = 0; i < groups.size(); ++i) {
    const int64_t saved = sizes[static_cast<int64_t>(i)].item<int64_t>();
    if (saved != static_cast<int64_t>(groups[i].params().size())) {
      return c10::str("its parameter group ", i, " has ", saved, " parameters, this optimizer's ",
                      groups[i].params().size());
    }
  }
  return "";
}

// The first state entry whose tensors do not fit their parameter, described; empty: none.
std::string state_mismatch(torch::optim::Optimizer& optimizer,
                           const std::function<std::string(const torch::Tensor&)>& name_of) {
  for (const auto& group : optimizer.param_groups()) {
    for (const auto& p : group.params()) {
      const auto it = optimizer.state().find(compat::state_key(optimizer, p));
      if (it == optimizer.state().end()) continue;
      for (const auto& [name, t] : state_tensors(*it->second)) {
        if (!t.defined() || (t.sizes() == p.sizes() && t.scalar_type() == p.scalar_type())) {
          continue;
        }
        return c10::str("the ", name, " of parameter \"", name_of(p), "\" is ", t.scalar_type(),
                        " of shape ", t.sizes(), ", the parameter ", p.scalar_type(), " of shape ",
                        p.sizes());
      }
    }
  }
  return "";
}

}  // namespace

// NOTE: [optimizer state check] LibTorch's Optimizer::load takes any state whose groups
// have as many parameters as the optimizer's: the state of another model's shapes loads,
// and the first step then fails inside an ATen op. So a load first loads the archive into
// the optimizer on trial, checks every state entry's tensors against its parameter (shape
// and dtype), and puts the optimizer's own state and options back, whatever it found.
std::string optimizer_mismatch(torch::optim::Optimizer& optimizer,
                               torch::serialize::InputArchive& archive, const std::string& file,
                               const std::function<std::string(const torch::Tensor&)>& name_of) {
  std::string problem = group_size_mismatch(optimizer, archive, file);
  if (!problem.empty()) return problem;
  auto& groups = optimizer.param_groups();
  std::vector<std::unique_ptr<torch::optim::OptimizerOptions>> options;
  for (auto& g : groups) options.push_back(g.options().clone());
  auto kept = std::move(optimizer.state());
  optimizer.state().clear();
  try {
    load_optimizer(optimizer, archive);
    problem = state_mismatch(optimizer, name_of);
  } catch (const std::exception& e) {
    const std::string what = e.what();
    problem = "it cannot be read: " + what.substr(0, what.find('\n'));
  }
  optimizer.state() = std::move(kept);
  for (size_t i = 0; i < groups.size(); ++i) groups[i].set_options(std::move(options[i]));
  return problem;
}

}  // namespace stepwise::detail
