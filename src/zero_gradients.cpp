#include "zero_gradients.h"

#include <torch/torch.h>

#include "check.h"
#include "collectives.h"
#include "ready_hooks.h"

#include <algorithm>

namespace stepwise::detail {

ShardedGradients::ShardedGradients(std::shared_ptr<distributed::Context> context,
                                   std::vector<int64_t> owners, int64_t bucket_size, bool overlap,
                                   double predivide)
    : context_(std::move(context)),
      owners_(std::move(owners)),
      bucket_size_(bucket_size),
      overlap_(overlap),
      predivide_(predivide) {
  TORCH_INTERNAL_ASSERT(context_ && bucket_size_ > 0, "ShardedGradients: no context or bucket");
}

ShardedGradients::~ShardedGradients() = default;

void ShardedGradients::attach(std::vector<torch::Tensor>& params) {
  TORCH_INTERNAL_ASSERT(params.size() == owners_.size(), "ShardedGradients: ", params.size(),
                        " parameters for ", owners_.size(), " owners");
  params_ = params;
  sums_.assign(params_.size(), torch::Tensor());
  fresh_.assign(params_.size(), true);
  taken_.assign(params_.size(), false);
  bucket_of_.assign(params_.size(), 0);
  // NOTE: [stage 2 gradients] layout: backward's order, a new bucket at each change of
  // owner, dtype or device and before `bucket_size` elements would be exceeded.
  for (size_t k = params_.size(); k-- > 0;) {
    const auto& p = params_[k];
    const bool fresh = buckets_.empty() || buckets_.back().owner != owners_[k] ||
                       params_[buckets_.back().params.front()].scalar_type() != p.scalar_type() ||
                       params_[buckets_.back().params.front()].device() != p.device() ||
                       buckets_.back().numel + p.numel() > bucket_size_;
    if (fresh) {
      buckets_.emplace_back();
      buckets_.back().owner = owners_[k];
    }
    auto& b = buckets_.back();
    b.params.push_back(k);
    b.offsets.push_back(b.numel);
    b.numel += p.numel();
    bucket_of_[k] = buckets_.size() - 1;
  }
  hooks_ = std::make_unique<ReadyHooks>(params_, [this](size_t k) { gradient_ready(k); });
  restore_grads();
}

void ShardedGradients::before_backward(bool /*last_of_window*/) {
  TORCH_INTERNAL_ASSERT(in_flight_.empty(), "ShardedGradients: a reduce left in flight");
  armed_ = true;
  next_ = 0;
  taken_.assign(params_.size(), false);
  for (auto& b : buckets_) {
    b.ready = 0;
    release(b);
  }
}

// The buffers go round: a bucket takes a spare one that is large enough, or a new one of its
// own size, so training allocates none after its first micro-step.
void ShardedGradients::acquire(Bucket& b) {
  const auto& first = params_[b.params.front()];
  // bf16 on the CPU: as fp32, rounded once, into the owner's sum.
  const auto options = first.options().dtype(distributed::detail::wire_dtype(first));
  for (auto it = spare_.begin(); it != spare_.end(); ++it) {
    if (it->scalar_type() == options.dtype().toScalarType() && it->device() == first.device() &&
        it->numel() >= b.numel) {
      b.storage = std::move(*it);
      spare_.erase(it);
      b.buffer = b.storage.narrow(0, 0, b.numel);
      b.buffer.zero_();
      return;
    }
  }
  b.storage = torch::zeros({b.numel}, options);
  b.buffer = b.storage.narrow(0, 0, b.numel);
}

void ShardedGradients::release(Bucket& b) {
  if (b.storage.defined()) spare_.push_back(std::move(b.storage));
  b.storage = torch::Tensor();
  b.buffer = torch::Tensor();
}

void ShardedGradients::gradient_ready(size_t index) {
  if (!armed_ || taken_[index]) return;
  take(index);
  reduce_ready();
}

void ShardedGradients::take(size_t index) {
  torch::NoGradGuard no_grad;
  auto& b = buckets_[bucket_of_[index]];
  if (!b.buffer.defined()) acquire(b);
  torch::Tensor& grad = params_[index].mutable_grad();
  if (grad.defined()) {
    size_t slot = 0;
    while (b.params[slot] != index) ++slot;
    b.buffer.narrow(0, b.offsets[slot], params_[index].numel()).copy_(grad.reshape({-1}));
    grad = torch::Tensor();  // the point of stage 2: this rank keeps no other gradient
  }
  taken_[index] = true;
  b.ready += 1;
}

void ShardedGradients::reduce_ready() {
  while (next_ < buckets_.size() && buckets_[next_].ready == buckets_[next_].params.size()) {
    start(next_);
    next_ += 1;
  }
}

void ShardedGradients::start(size_t index) {
  auto& b = buckets_[index];
  if (predivide_ != 1.0) b.buffer.mul_(1.0 / predivide_);  // see NOTE: [predivide]
  b.pending = distributed::detail::reduce_sum_start(*context_, b.buffer, b.owner,
                                                    "ZeRO stage 2's gradients");
  calls_ += 1;
  in_flight_.push_back(index);
  if (!overlap_ || in_flight_.size() > kInFlight) finish_oldest();
}

void ShardedGradients::finish_oldest() {
  torch::NoGradGuard no_grad;
  auto& b = buckets_[in_flight_.front()];
  in_flight_.pop_front();
  const auto start = std::chrono::steady_clock::now();
  distributed::detail::wait(*context_, *b.pending);
  time_ += std::chrono::steady_clock::now() - start;
  b.pending.reset();
  if (b.owner == context_->rank()) {
    for (size_t slot = 0; slot < b.params.size(); ++slot) {
      const size_t k = b.params[slot];
      const auto& p = params_[k];
      auto sum = b.buffer.narrow(0, b.offsets[slot], p.numel()).view(p.sizes());
      if (!sums_[k].defined()) {
        sums_[k] = sum.to(p.scalar_type(), /*non_blocking=*/false, /*copy=*/true);
      } else if (fresh_[k]) {
        sums_[k].copy_(sum);  // the first micro-step of a window, into last window's memory
      } else {
        sums_[k].add_(sum);
      }
      fresh_[k] = false;
    }
  }
  release(b);
}

void ShardedGradients::after_backward() {
  if (!armed_) return;
  // What no hook saw: parameters the loss did not reach (zeros) or that are not leaves.
  for (size_t k = 0; k < params_.size(); ++k) {
    if (!taken_[k]) take(k);
  }
  reduce_ready();
  while (!in_flight_.empty()) finish_oldest();
  TORCH_INTERNAL_ASSERT(next_ == buckets_.size(), "ShardedGradients: a bucket left unreduced");
  armed_ = false;
}

void ShardedGradients::finalize() {
  for (size_t k = 0; k < params_.size(); ++k) {
    if (owners_[k] != context_->rank()) continue;
    params_[k].mutable_grad() =
        sums_[k].defined() && !fresh_[k] ? sums_[k] : torch::zeros_like(params_[k]);
  }
}

void ShardedGradients::show_grads() {
  for (size_t k = 0; k < params_.size(); ++k) {
    if (owners_[k] == context_->rank() && sums_[k].defined() && !fresh_[k]) {
      params_[k].mutable_grad() = sums_[k];
    }
  }
}

double ShardedGradients::mean_factor() const {
  return predivide_ / static_cast<double>(context_->world_size());
}

void ShardedGradients::abort_backward() {
  while (!in_flight_.empty()) {
    auto& b = buckets_[in_flight_.front()];
    in_flight_.pop_front();
    try {
      distributed::detail::wait(*context_, *b.pending);
    } catch (...) {  // the backward's own error is the one to report
    }
    b.pending.reset();
  }
  for (auto& b : buckets_) release(b);
  for (auto& p : params_) {
    if (p.grad().defined()) p.mutable_grad() = torch::Tensor();
  }
  armed_ = false;
}

void ShardedGradients::restore_grads() {
  for (size_t k = 0; k < params_.size(); ++k) {
    torch::Tensor& grad = params_[k].mutable_grad();
    if (owners_[k] != context_->rank()) {
      sums_[k] = torch::Tensor();
    } else if (grad.defined()) {
      sums_[k] = grad.detach();
      fresh_[k] = false;
    } else {
      fresh_[k] = true;  // none: the next window starts from nothing, in the same memory
    }
    grad = torch::Tensor();
  }
}

}  // namespace stepwise::detail
