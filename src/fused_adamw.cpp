#include <stepwise/errors.h>
#include <stepwise/fused_adamw.h>
#include "fused.h"

#include "check.h"
#include "optimizers_detail.h"

#include <torch/optim/serialize.h>
#include <torch/torch.h>

#include <map>
#include <stdexcept>

namespace stepwise {

FusedAdamW::FusedAdamW(std::vector<torch::Tensor> params, torch::optim::AdamWOptions options,
                       FusedAdamWMode mode)
    : FusedAdamW({torch::optim::OptimizerParamGroup(std::move(params))}, options, mode) {}

FusedAdamW::FusedAdamW(std::vector<torch::optim::OptimizerParamGroup> groups,
                       torch::optim::AdamWOptions defaults, FusedAdamWMode mode)
    : torch::optim::Optimizer(std::move(groups),
                              std::make_unique<torch::optim::AdamWOptions>(defaults)),
      mode_(mode) {
  for (size_t g = 0; g < param_groups_.size(); ++g) {
    const auto& options =
        static_cast<const torch::optim::AdamWOptions&>(param_groups_[g].options());
    STEPWISE_CHECK(!options.amsgrad(), std::invalid_argument,
                   "FusedAdamW does not implement amsgrad; use torch::optim::AdamW (in a config: "
                   "\"torch_adam\": true)");
    STEPWISE_CHECK(options.lr() >= 0.0, std::invalid_argument, "FusedAdamW: lr is ", options.lr(),
                   " in parameter group ", g, "; use a learning rate >= 0");
  }
  const auto all = all_params();
  for (size_t i = 0; i < all.size(); ++i) {
    STEPWISE_CHECK(all[i].is_contiguous(), std::invalid_argument, "FusedAdamW: parameter ", i,
                   " is not contiguous; the fused update writes parameters in place");
  }
}

std::vector<torch::Tensor> FusedAdamW::all_params() const {
  std::vector<torch::Tensor> out;
  for (const auto& group : param_groups_) {
    out.insert(out.end(), group.params().begin(), group.params().end());
  }
  return out;
}

void FusedAdamW::set_model_copies(std::vector<torch::Tensor> copies) {
  const auto params = all_params();
  STEPWISE_CHECK(copies.empty() || copies.size() == params.size(), std::invalid_argument,
                 "FusedAdamW::set_model_copies: got ", copies.size(), " tensors for ",
                 params.size(), " parameters; pass one per parameter, in order");
  for (size_t i = 0; i < copies.size(); ++i) {
    STEPWISE_CHECK(copies[i].numel() == params[i].numel() && copies[i].is_contiguous() &&
                       copies[i].device() == params[i].device(),
                   std::invalid_argument, "FusedAdamW::set_model_copies: copy ", i,
                   " must be a contiguous tensor of ", params[i].numel(), " elements on ",
                   params[i].device(), " (got ", copies[i].numel(), " on ", copies[i].device(),
                   ")");
  }
  copies_ = std::move(copies);
}

torch::Tensor FusedAdamW::step(LossClosure closure) { return update(closure, 1.0); }

torch::Tensor FusedAdamW::update(const LossClosure& closure, double grad_scale) {
  torch::NoGradGuard no_grad;
  torch::Tensor loss;
  if (closure) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  size_t index = 0;  // position in all_params(), for copies_
  for (auto& group : param_groups_) {
    const auto& options = static_cast<const torch::optim::AdamWOptions&>(group.options());
    // Parameters skipped in earlier steps lag behind; each step count is one launch.
    std::map<int64_t, fused::AdamWTensors> by_step;
    for (auto& p : group.params()) {
      const size_t at = index++;
      if (!p.grad().defined()) continue;
      auto& state = detail::adam_state(*this, p);  // contiguous: the kernels' layout
      state.step(state.step() + 1);
      auto& lists = by_step[state.step()];
      lists.params.push_back(p);
      lists.grads.push_back(p.grad().contiguous());
      lists.exp_avg.push_back(state.exp_avg());
      lists.exp_avg_sq.push_back(state.exp_avg_sq());
      if (!copies_.empty()) lists.model_copies.push_back(copies_[at]);
    }
    for (const auto& [step, lists] : by_step) {
      fused::adamw_step(lists,
                        fused::AdamWStep()
                            .lr(options.lr())
                            .betas(std::get<0>(options.betas()), std::get<1>(options.betas()))
                            .eps(options.eps())
                            .weight_decay(options.weight_decay())
                            .decoupled(mode_.decoupled())
                            .bias_correction(mode_.bias_correction())
                            .step(step)
                            .grad_scale(grad_scale));
      // The kernels write through raw pointers: tell autograd's version counters, as
      // an in-place ATen op would (and as NOTE: [leftover calls] relies on).
      for (const auto& p : lists.params) p.unsafeGetTensorImpl()->bump_version();
      for (const auto& c : lists.model_copies) c.unsafeGetTensorImpl()->bump_version();
    }
  }
  return loss;
}

void FusedAdamW::save(torch::serialize::OutputArchive& archive) const {
  torch::optim::serialize<torch::optim::AdamWParamState, torch::optim::AdamWOptions>(archive,
                                                                                     *this);
}

void FusedAdamW::load(torch::serialize::InputArchive& archive) {
  torch::optim::serialize<torch::optim::AdamWParamState, torch::optim::AdamWOptions>(archive,
                                                                                     *this);
}

}  // namespace stepwise
