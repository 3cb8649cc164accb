#include "leftover_checks.h"

#include "accumulator.h"
#include "check.h"
#include "hash_bytes.h"

#include <stepwise/errors.h>

#include <ATen/ATen.h>

#include <cstring>
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
    // Module::zero_grad() replaces the gradient (LibTorch 1.13: detach + zero) or sets
    // it to none (2.x: set_to_none = true by default): one wording for both.
    *what = before.impls[i] != nullptr && now.impls[i] != before.impls[i]
                ? "cleared or replaced by another tensor (as zero_grad() does)"
            : before.impls[i] == nullptr ? "created outside backward()"
                                         : "changed in place (zeroed or scaled)";
    return static_cast<int64_t>(i);
  }
  return -1;
}

// One fingerprint per tensor (0 for an undefined one): a hash of the bytes on the CPU;
// elsewhere the bits of the L2 norm, from one _foreach_norm and one host sync.
std::vector<uint64_t> fingerprints(const std::vector<torch::Tensor>& tensors) {
  std::vector<uint64_t> out(tensors.size(), 0);
  std::vector<size_t> on_device;
  std::vector<torch::Tensor> device_tensors;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const torch::Tensor& t = tensors[i];
    if (!t.defined() || t.layout() != torch::kStrided) continue;  // sparse: not fingerprinted
    if (!t.device().is_cpu()) {
      on_device.push_back(i);
      device_tensors.push_back(t);
      continue;
    }
    const torch::Tensor c = t.is_contiguous() ? t : t.contiguous();
    out[i] = hash_bytes(c.data_ptr(), c.nbytes());
  }
  if (!device_tensors.empty()) {
    const auto norms =
        torch::stack(at::_foreach_norm(device_tensors, 2)).to(torch::kDouble).cpu().contiguous();
    for (size_t j = 0; j < on_device.size(); ++j) {
      std::memcpy(&out[on_device[j]], norms.data_ptr<double>() + j, sizeof(uint64_t));
    }
  }
  return out;
}

// The first index whose fingerprint differs, or -1 (also when either was not taken).
int64_t first_fingerprint_change(const std::vector<uint64_t>& before,
                                 const std::vector<uint64_t>& now) {
  if (before.size() != now.size()) return -1;
  for (size_t i = 0; i < now.size(); ++i) {
    if (before[i] != now[i]) return static_cast<int64_t>(i);
  }
  return -1;
}

std::string guide(const char* key) {
  return c10::str("See ", kCadenceDocs, ", pitfall 5. To do this on purpose set \"stepwise\": {\"",
                  key, "\": false}.");
}

}  // namespace

std::vector<std::string> trainable_names(torch::nn::Module& model) {
  std::vector<std::string> names;
  for (const auto& item : model.named_parameters()) {
    if (item.value().requires_grad()) names.push_back(item.key());
  }
  return names;
}

LeftoverChecks::LeftoverChecks(const GuardRailOptions& options, std::vector<std::string> names,
                               std::vector<torch::Tensor> grad_params,
                               std::vector<torch::Tensor> updated,
                               std::vector<size_t> updated_index)
    : check_cleared_(options.check_grads_cleared()),
      check_changed_(options.check_grads_changed()),
      check_params_(options.check_params_changed()),
      names_(std::move(names)),
      grad_params_(std::move(grad_params)),
      updated_(std::move(updated)),
      updated_index_(std::move(updated_index)) {
  grads_ = grad_marks();
  if (check_params_) {
    params_ = param_marks();
    param_prints_ = param_fingerprints();  // until the first step shows whether versions suffice
  }
}

TensorMarks LeftoverChecks::grad_marks() const { return marks_of(grad_params_, true); }
TensorMarks LeftoverChecks::param_marks() const { return marks_of(updated_, false); }

std::vector<uint64_t> LeftoverChecks::grad_fingerprints() const {
  std::vector<torch::Tensor> grads;
  grads.reserve(grad_params_.size());
  for (const auto& p : grad_params_) grads.push_back(p.grad());
  return fingerprints(grads);
}

std::vector<uint64_t> LeftoverChecks::param_fingerprints() const { return fingerprints(updated_); }

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
  window_end_grad_prints_ =
      ends_window && check_changed_ ? grad_fingerprints() : std::vector<uint64_t>();
}

void LeftoverChecks::before_step(int64_t micro_steps, bool boundary) {
  if (check_changed_) {
    const char* what = "";
    int64_t i = first_change(grads_, grad_marks(), &what);
    if (i < 0 && boundary && !window_end_grad_prints_.empty()) {
      i = first_fingerprint_change(window_end_grad_prints_, grad_fingerprints());
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
    if (i < 0 && boundary && !param_prints_.empty()) {
      i = first_fingerprint_change(param_prints_, param_fingerprints());
    }
    STEPWISE_CHECK(i < 0, UsageError, "parameter \"", names_[updated_index_[i]],
                   "\" was updated outside the engine since its last optimizer step (found at "
                   "micro_steps ",
                   micro_steps,
                   "): remove your optimizer.step() call (or other update of the weights) from "
                   "your loop. engine.step() steps the optimizer at each accumulation boundary, "
                   "so the weights were updated twice. ",
                   guide("check_params_changed"));
  }
  // Check 1 compares with the gradients as step() found them, so a change allowed here
  // (check_grads_changed off) is not refused again at the next backward().
  if (check_cleared_) grads_ = grad_marks();
}

void LeftoverChecks::after_boundary(bool applied) {
  if (check_cleared_ || check_changed_) grads_ = grad_marks();
  window_end_grad_prints_.clear();
  if (!check_params_) return;
  TensorMarks now = param_marks();
  if (applied && !calibrated_) {
    // NOTE: [leftover calls]: an optimizer whose step moves no version counter updates
    // through .data(); only fingerprints can see a second update then.
    version_blind_ = now.versions == params_.versions && now.impls == params_.impls;
    calibrated_ = true;
  }
  params_ = std::move(now);
  param_prints_ = !calibrated_ || version_blind_ ? param_fingerprints() : std::vector<uint64_t>();
}

}  // namespace stepwise::detail
