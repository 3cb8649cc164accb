#include <stepwise/errors.h>
#include <stepwise/precision.h>

#include "check.h"
#include "fused.h"
#include "option_checks.h"
#include "precision_policy.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace stepwise {

namespace {

// fp32: the optimizer steps the model's own parameters; nothing to cast, copy or scale.
class Fp32 final : public Precision {
 public:
  explicit Fp32(torch::nn::Module& model) : Precision(model) {}
  const char* name() const override { return "fp32"; }
  bool has_masters() const override { return false; }
  void attach(torch::optim::Optimizer& /*optimizer*/) override {}
  void copy_to_model() override {}
};

// Casts the floating-point tensors only, as PyTorch's module.half() does: Module::to(dtype)
// would also turn integer buffers (BatchNorm's num_batches_tracked) into half.
torch::nn::Module& cast_floating(torch::nn::Module& model, torch::Dtype dtype) {
  torch::NoGradGuard no_grad;
  for (auto& p : model.parameters()) {
    if (p.is_floating_point()) p.set_data(p.to(dtype));
  }
  for (auto& b : model.buffers()) {
    if (b.is_floating_point()) b.set_data(b.to(dtype));
  }
  return model;
}

// bf16 (and fp16's base): a half-width model, fp32 master copies that the optimizer steps.
class MasterCopies : public Precision {
 public:
  MasterCopies(torch::nn::Module& model, torch::Dtype dtype, const char* name)
      : Precision(cast_floating(model, dtype)), name_(name) {
    torch::NoGradGuard no_grad;
    master_.clear();
    for (const auto& p : model_) {
      master_.push_back(p.detach().to(torch::kFloat).clone().requires_grad_(true));
    }
  }
  const char* name() const override { return name_; }
  bool has_masters() const override { return true; }

  void attach(torch::optim::Optimizer& optimizer) override {
    // NOTE: [fused write-back] an optimizer that WritesModelCopies (a FusedAdamW) writes
    // the rounded new weights into the half/bf16 model in the same pass as the update;
    // copy_to_model() then has nothing left to do.
    auto* writer = dynamic_cast<WritesModelCopies*>(&optimizer);
    if (writer == nullptr) return;
    std::vector<torch::Tensor> copies;  // in the optimizer's order, which a client chose
    for (const auto& group : optimizer.param_groups()) {
      for (const auto& master : group.params()) copies.push_back(model_[index_of(master)].detach());
    }
    writer->set_model_copies(std::move(copies));
    writes_back_ = true;
  }

  void copy_to_model() override {
    if (writes_back_) return;
    torch::NoGradGuard no_grad;
    for (size_t k = 0; k < owned_.size(); ++k) {
      model_[owned_[k]].detach().copy_(master_[k].detach());
    }
  }

 private:
  const char* name_;
  bool writes_back_ = false;
};

// The ops a transformer needs that this LibTorch cannot run in Half on the CPU (LibTorch
// 1.13 has none of these four; later versions add some), tried on 2x2 tensors.
std::vector<std::string> half_ops_missing_on_cpu() {
  torch::NoGradGuard no_grad;
  const auto x = torch::ones({2, 2}, torch::kHalf);
  const std::pair<const char*, std::function<void()>> probes[] = {
      {"matmul", [&] { torch::matmul(x, x); }},
      {"LayerNorm", [&] { torch::layer_norm(x, {2}); }},
      {"softmax", [&] { torch::softmax(x, -1); }},
      {"GELU", [&] { torch::gelu(x); }},
  };
  std::vector<std::string> missing;
  for (const auto& [name, probe] : probes) {
    try {
      probe();
    } catch (const c10::Error&) {
      missing.emplace_back(name);
    }
  }
  return missing;
}

// One warning at initialize when fp16 parameters live on the CPU and this LibTorch lacks
// Half CPU kernels a model commonly needs: the failure would otherwise come from inside
// LibTorch at the first forward() ("LayerNormKernelImpl" not implemented for 'Half').
void warn_about_half_on_cpu(const std::vector<torch::Tensor>& params) {
  const bool on_cpu =
      std::any_of(params.begin(), params.end(), [](const auto& p) { return p.is_cpu(); });
  if (!on_cpu) return;
  // What this LibTorch's kernels can do does not change while it runs: probed once.
  static const std::vector<std::string> missing = half_ops_missing_on_cpu();
  if (missing.empty()) return;
  TORCH_WARN("fp16 with parameters on the CPU: this LibTorch has no Half CPU kernels for: ",
             detail::join(missing),
             ", so a model that uses one fails in forward() (\"... not implemented for 'Half'\"). "
             "On the CPU train in bf16 (\"bf16\": {\"enabled\": true}); fp16 needs the model "
             "on CUDA");
}

// fp16: master copies, and the loss scaler that the backward loss is multiplied by.
class Fp16 final : public MasterCopies {
 public:
  Fp16(torch::nn::Module& model, const LossScalerOptions& options)
      : MasterCopies(model, torch::kHalf, "fp16"), scaler_(options) {
    warn_about_half_on_cpu(model_params());
  }
  double loss_scale() const override { return scaler_.scale(); }
  const LossScaler* scaler() const override { return &scaler_; }
  LossScaler* scaler() override { return &scaler_; }
  // In fp32: (loss / GAS) * S could overflow half before the cast.
  torch::Tensor scale_loss(const torch::Tensor& loss) const override {
    return loss.to(torch::kFloat) * scaler_.scale();
  }
  void finish_boundary(bool overflow) override { scaler_.update(overflow); }

 protected:
  bool skips_overflow() const override { return true; }

 private:
  LossScaler scaler_;
};

}  // namespace

std::unique_ptr<Precision> Precision::make(const PrecisionOptions& options,
                                           torch::nn::Module& model) {
  switch (options.mode()) {
    case PrecisionMode::kFp16:
      return std::make_unique<Fp16>(model, options.loss_scaler());
    case PrecisionMode::kBf16:
      return std::make_unique<MasterCopies>(model, torch::kBFloat16, "bf16");
    case PrecisionMode::kFp32:
      break;
  }
  return std::make_unique<Fp32>(model);
}

Precision::Precision(torch::nn::Module& model) {
  for (auto& p : model.parameters()) {
    if (p.requires_grad()) model_.push_back(p);
  }
  STEPWISE_CHECK(!model_.empty(), ConfigError,
                 "the model has no parameters that require grad; nothing to train");
  for (size_t i = 0; i < model_.size(); ++i) owned_.push_back(i);
  groups_ = {owned_};
  master_ = model_;
}

void Precision::shard(std::vector<size_t> owned,
                      std::function<void(torch::Tensor&)> sum_over_ranks) {
  std::vector<torch::Tensor> kept;
  for (const size_t i : owned) {
    const auto at = std::find(owned_.begin(), owned_.end(), i);
    TORCH_INTERNAL_ASSERT(at != owned_.end(), "Precision::shard: parameter ", i, " is not held");
    kept.push_back(master_[static_cast<size_t>(at - owned_.begin())]);
  }
  owned_ = std::move(owned);
  master_ = std::move(kept);  // the other masters are freed here
  sum_over_ranks_ = std::move(sum_over_ranks);
}

std::optional<size_t> Precision::find_index(const torch::Tensor& p) const {
  for (size_t i = 0; i < model_.size(); ++i) {
    if (model_[i].is_same(p)) return i;
  }
  for (size_t k = 0; k < owned_.size(); ++k) {
    if (master_[k].is_same(p)) return owned_[k];
  }
  return std::nullopt;
}

std::optional<std::vector<std::vector<size_t>>> Precision::members_of(
    const torch::optim::Optimizer& optimizer) const {
  std::vector<std::vector<size_t>> groups;
  for (const auto& group : optimizer.param_groups()) {
    std::vector<size_t> members;
    for (const auto& p : group.params()) {
      const auto i = find_index(p);
      if (!i) return std::nullopt;
      members.push_back(*i);
    }
    groups.push_back(std::move(members));
  }
  return groups;
}

size_t Precision::index_of(const torch::Tensor& p) const {
  if (const auto i = find_index(p)) return *i;
  throw ConfigError(c10::str(
      "the client optimizer holds a tensor of shape ", p.sizes(),
      " that is not a trainable parameter of the model; with ", name(),
      has_masters() ? " the engine replaces each of its parameters by that parameter's fp32 "
                      "master weight"
                    : " and ZeRO the engine keeps only this rank's share of them",
      ", so build the optimizer over the model's parameters (model->parameters())"));
}

void Precision::adopt(torch::optim::Optimizer& client) {
  // NOTE: [client optimizer masters] The user built the optimizer over the model's
  // parameters, before initialize cast them in place (set_data keeps each tensor's
  // identity): each is found by identity and replaced by its master, or leaves its group
  // when another rank owns it. A fresh optimizer keeps no state, so nothing else refers to
  // the half/bf16 tensors.
  // A tensor that is not a parameter: fp32 unsharded takes it; the checks below refuse it
  // otherwise.
  groups_ = members_of(client).value_or(std::vector<std::vector<size_t>>{});
  const bool sharded = static_cast<bool>(sum_over_ranks_);
  if (!has_masters() && !sharded) return;
  STEPWISE_CHECK(client.state().empty(), ConfigError, "the client optimizer has state already; ",
                 has_masters() ? c10::str("with ", name(),
                                          " the engine hands it the fp32 master weights, which "
                                          "that state does not belong to")
                               : std::string("with ZeRO the engine keeps only this "
                                             "rank's share of its parameters"),
                 ": pass an optimizer that has not stepped");
  for (auto& group : client.param_groups()) {
    std::vector<torch::Tensor> kept;
    for (const auto& p : group.params()) {
      const auto at = std::find(owned_.begin(), owned_.end(), index_of(p));
      if (at != owned_.end()) kept.push_back(master_[static_cast<size_t>(at - owned_.begin())]);
    }
    group.params() = std::move(kept);
  }
}

torch::Tensor Precision::scale_loss(const torch::Tensor& loss) const {
  return loss.to(torch::kFloat);
}

GradientStats Precision::unscale_and_check(double factor) {
  torch::NoGradGuard no_grad;
  const double coef = grad_scale(factor);
  std::vector<torch::Tensor> grads;  // the optimizer's (fp32) gradients
  std::vector<size_t> indices;
  for (size_t k = 0; k < owned_.size(); ++k) {
    const size_t i = owned_[k];
    const auto& g = model_[i].grad();
    if (!g.defined()) continue;
    if (!master_[k].is_same(model_[i])) master_[k].mutable_grad() = g.to(torch::kFloat);
    grads.push_back(master_[k].grad());
    indices.push_back(i);
  }
  // NOTE: [one sync per step] unscale + inf/nan flag, then the norm, both fused over
  // all tensors and left on the device; one transfer brings both to the host. A norm
  // that overflows fp32 from finite gradients also counts as an fp16 overflow. fp32
  // and bf16 at a full boundary (coef 1) need neither the multiply nor the flag.
  torch::Tensor found_inf;
  if (skips_overflow() || coef != 1.0) found_inf = fused::unscale_and_check(grads, coef);
  return stats_of(grads, indices, found_inf);
}

GradientStats Precision::stats_of(const std::vector<torch::Tensor>& grads,
                                  const std::vector<size_t>& indices,
                                  const torch::Tensor& found_inf) {
  GradientStats stats;
  if (!sum_over_ranks_) {
    const auto norm = fused::global_norm(grads).reshape({1});
    const auto host =
        (found_inf.defined() ? torch::cat({norm, found_inf.reshape({1})}) : norm).to(torch::kCPU);
    stats.norm = host[0].item<double>();
    const bool flagged = found_inf.defined() && host[1].item<float>() != 0.0f;
    stats.overflow = skips_overflow() && (flagged || !std::isfinite(stats.norm));
    return stats;
  }
  // NOTE: [sharded norm] Each rank puts its tensors' squared norms (fp32, as
  // fused::global_norm computes them) at their indices, zeros elsewhere, and the flag
  // last; the all-reduce then adds exact zeros, and the host adds the squares in
  // parameter order as global_norm does on one rank: the same norm, bit for bit.
  const int64_t n = static_cast<int64_t>(model_.size());
  auto v = torch::zeros({n + 1}, model_.front().options().dtype(torch::kFloat));
  for (size_t j = 0; j < grads.size(); ++j) {
    v.select(0, static_cast<int64_t>(indices[j])).copy_(grads[j].to(torch::kFloat).norm().square());
  }
  if (found_inf.defined()) v.select(0, n).copy_(found_inf.reshape({}));
  sum_over_ranks_(v);
  const auto host = v.to(torch::kCPU);
  const float* h = host.data_ptr<float>();
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) sum += h[i];
  stats.norm = std::sqrt(sum);
  stats.overflow = skips_overflow() && (h[n] != 0.0f || !std::isfinite(stats.norm));
  return stats;
}

// NOTE: [folded unscale] With FusedAdamW, a boundary reads the gradients twice: once
// for the norm and the overflow flag together (an inf or nan anywhere makes the norm
// non-finite), then in the update, which multiplies them by factor / S times the clip
// coefficient. The unscale, the clip multiply and the fp32 copy of half gradients are
// not separate passes. With a power-of-two S and factor 1 the results are bitwise those
// of unscale-then-clip: scaling by 2^-k is exact, so the norm of the scaled gradients
// times 2^-k is the norm of the unscaled ones, and g * (2^-k c) rounds as (g 2^-k) c.
GradientStats Precision::check_unscaled(double factor) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> grads;  // the model's gradients, as backward() left them
  std::vector<size_t> indices;
  for (size_t k = 0; k < owned_.size(); ++k) {
    const size_t i = owned_[k];
    const auto& g = model_[i].grad();
    if (!g.defined()) continue;
    // The optimizer reads the half/bf16 gradient itself (its kernels take any dtype).
    if (!master_[k].is_same(model_[i])) master_[k].mutable_grad() = g;
    grads.push_back(g);
    indices.push_back(i);
  }
  GradientStats stats = stats_of(grads, indices, torch::Tensor());  // the one host sync
  stats.norm *= grad_scale(factor);
  stats.overflow = skips_overflow() && !std::isfinite(stats.norm);
  return stats;
}

void Precision::zero_grads() {
  for (auto& p : model_) p.mutable_grad() = torch::Tensor();
  for (auto& m : master_) m.mutable_grad() = torch::Tensor();
}

}  // namespace stepwise
