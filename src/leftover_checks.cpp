#include "leftover_checks.h"

#include <stepwise/accumulation.h>
#include <stepwise/errors.h>

#include <ATen/ATen.h>

#include <utility>

namespace stepwise::detail {

namespace {

TensorMarks marks_of(const std::vector<torch::Tensor>& tensors, bool grads) {
  TensorMarks m;
  m.impls.reserve(tensors.size());
  m.versions.reserve(tensors.size());
  for (const auto& t : tensors) {
    const torch::Tensor& x = grads ? t.grad() : t;
    m.impls.push_back(x.defined() ? x.unsafeGetTensorImpl() : nullptr);
    m.versions.push_back(x.defined() ? x._version() : 0);
  }
  return m;
}

// The first index whose identity or version differs, or -1; `what` says how.
int64_t first_change(const TensorMarks& before, const TensorMarks& now, const char** what) {
  for (size_t i = 0; i < now.impls.size(); ++i) {
    if (now.impls[i] == before.impls[i] && now.versions[i] == before.versions[i]) continue;
    *what = now.impls[i] == nullptr    ? "cleared (set to none)"
            : before.impls[i] == nullptr ? "created outside backward()"
            : now.impls[i] != before.impls[i] ? "replaced by another tensor (as Module::zero_grad() does)"
                                              : "changed in place (zeroed or scaled)";
    return static_cast<int64_t>(i);
  }
  return -1;
}

// Per-tensor L2 norms as one tensor (undefined when there are none).
torch::Tensor norms_of(const std::vector<torch::Tensor>& tensors) {
  if (tensors.empty()) return {};
  return torch::stack(at::_foreach_norm(tensors, 2)).to(torch::kFloat);
}

// The first index whose norm differs bit for bit (so a nan equals itself), or -1.
int64_t first_norm_change(const torch::Tensor& before, const torch::Tensor& now) {
  if (!before.defined() || !now.defined() || before.sizes() != now.sizes()) return -1;
  const auto differs = before.view(torch::kInt).ne(now.view(torch::kInt));
  if (!differs.any().item<bool>()) return -1;
  return differs.nonzero()[0][0].item<int64_t>();
}

std::string guide(const char* key) {
  return c10::str("See ", kCadenceDocs, ", pitfall 5. To do this on purpose set \"stepwise\": {\"",
                  key, "\": false}.");
}

}  // namespace

LeftoverChecks::LeftoverChecks(const StepwiseOptions& options, std::vector<std::string> names,
                               std::vector<torch::Tensor> grad_params,
                               std::vector<torch::Tensor> updated)
    : check_cleared_(options.check_grads_cleared),
      check_changed_(options.check_grads_changed),
      check_params_(options.check_params_changed),
      names_(std::move(names)),
      grad_params_(std::move(grad_params)),
      updated_(std::move(updated)) {
  grads_ = grad_marks();
  if (check_params_) {
    params_ = param_marks();
    param_norms_ = param_norms();  // until the first step shows whether versions suffice
  }
}

TensorMarks LeftoverChecks::grad_marks() const { return marks_of(grad_params_, true); }
TensorMarks LeftoverChecks::param_marks() const { return marks_of(updated_, false); }

torch::Tensor LeftoverChecks::grad_norms() const {
  std::vector<torch::Tensor> grads;
  grads.reserve(grad_params_.size());
  for (const auto& p : grad_params_) {
    if (p.grad().defined()) grads.push_back(p.grad());
  }
  return norms_of(grads);
}

torch::Tensor LeftoverChecks::param_norms() const { return norms_of(updated_); }

int64_t LeftoverChecks::param_of_defined_grad(int64_t n) const {
  for (size_t i = 0; n >= 0 && i < grad_params_.size(); ++i) {
    if (grad_params_[i].grad().defined() && n-- == 0) return static_cast<int64_t>(i);
  }
  return -1;
}

void LeftoverChecks::before_backward(int64_t micro_steps) const {
  if (!check_cleared_) return;
  const char* what = "";
  const int64_t i = first_change(grads_, grad_marks(), &what);
  STEPWISE_CHECK(i < 0, UsageError, "the gradient of parameter \"", names_[i], "\" was ", what,
                 " between two micro-steps of an accumulation window (found by the backward() "
                 "at micro_steps ",
                 micro_steps,
                 "): remove the zero_grad() call (model->zero_grad() or optimizer.zero_grad()) "
                 "from your loop. engine.step() sets the gradients to none after each optimizer "
                 "step; clearing them inside a window throws away the micro-batches accumulated "
                 "so far. ",
                 guide("check_grads_cleared"));
}

void LeftoverChecks::after_backward(bool ends_window) {
  if (!check_cleared_ && !check_changed_) return;
  grads_ = grad_marks();
  window_end_grad_norms_ = ends_window && check_changed_ ? grad_norms() : torch::Tensor();
}

void LeftoverChecks::before_step(int64_t micro_steps, bool boundary) const {
  if (check_changed_) {
    const char* what = "";
    int64_t i = first_change(grads_, grad_marks(), &what);
    if (i < 0 && boundary && window_end_grad_norms_.defined()) {
      i = param_of_defined_grad(first_norm_change(window_end_grad_norms_, grad_norms()));
      what = "scaled through .data() (as clip_grad_norm_ does)";
    }
    STEPWISE_CHECK(i < 0, UsageError, "the gradient of parameter \"", names_[i], "\" was ", what,
                   " between engine.backward() and engine.step() (at micro_steps ", micro_steps,
                   "): remove the call that changes .grad there (clip_grad_norm_, zero_grad() or "
                   "your own scaling) from your loop. At the boundary engine.step() averages "
                   "over the ranks, unscales and clips to \"gradient_clipping\" itself, in that "
                   "order. ",
                   guide("check_grads_changed"));
  }
  if (check_params_) {
    const char* what = "";
    int64_t i = first_change(params_, param_marks(), &what);
    if (i < 0 && boundary && param_norms_.defined()) i = first_norm_change(param_norms_, param_norms());
    STEPWISE_CHECK(i < 0, UsageError, "parameter \"", names_[i],
                   "\" was updated outside the engine since its last optimizer step (found at "
                   "micro_steps ",
                   micro_steps,
                   "): remove your optimizer.step() call (or other update of the weights) from "
                   "your loop. engine.step() steps the optimizer at each accumulation boundary, "
                   "so the weights were updated twice. ",
                   guide("check_params_changed"));
  }
}

void LeftoverChecks::after_boundary(bool applied) {
  if (check_cleared_ || check_changed_) grads_ = grad_marks();
  window_end_grad_norms_ = torch::Tensor();
  if (!check_params_) return;
  TensorMarks now = param_marks();
  if (applied && !calibrated_) {
    // NOTE: [leftover calls]: an optimizer whose step moves no version counter updates
    // through .data(); only norms can see a second update then.
    version_blind_ = now.versions == params_.versions && now.impls == params_.impls;
    calibrated_ = true;
  }
  params_ = std::move(now);
  param_norms_ = !calibrated_ || version_blind_ ? param_norms() : torch::Tensor();
}

}  // namespace stepwise::detail
