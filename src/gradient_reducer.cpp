// GradientReducer: flat-bucket all-reduce of gradients at the accumulation
// boundary, and what initialize() checks across ranks.
#include "gradient_reducer.h"
#include <stepwise/errors.h>

#include "check.h"
#include "collectives.h"
#include "option_checks.h"
#include "ready_hooks.h"

#include <torch/torch.h>

#include <cmath>
#include <functional>
#include <mutex>
#include <sstream>

namespace stepwise::distributed {

void GradientReducer::reduce(std::vector<torch::Tensor>& params) {
  for (auto& p : params) add(p);
  finalize();
}

// What a bucket is when attached (see NOTE: [bucket views]).
struct BucketedReducer::Bucket {
  torch::Tensor buffer;        // the parameters' gradients are views into it
  torch::Tensor wire;          // what c10d sums: `buffer`, or a float copy (bf16 on Gloo)
  std::vector<size_t> params;  // indices into params_
  size_t ready = 0;            // gradients in, during an armed backward
  std::unique_ptr<detail::PendingCollective> pending;  // the all-reduce in flight
};

namespace {

// NOTE: [bucket views] layout: the indices of `params` in each bucket, in reverse
// registration order (backward's), a new bucket at each change of dtype or device and
// before `bucket_size` elements would be exceeded.
std::vector<std::vector<size_t>> bucket_layout(const std::vector<torch::Tensor>& params,
                                               int64_t bucket_size) {
  std::vector<std::vector<size_t>> buckets;
  int64_t numel = 0;
  for (size_t k = params.size(); k-- > 0;) {
    const auto& p = params[k];
    const auto& last = buckets.empty() ? p : params[buckets.back().front()];
    if (buckets.empty() || last.scalar_type() != p.scalar_type() || last.device() != p.device() ||
        numel + p.numel() > bucket_size) {
      buckets.emplace_back();
      numel = 0;
    }
    buckets.back().push_back(k);
    numel += p.numel();
  }
  return buckets;
}

}  // namespace

// NOTE: [predivide] DeepSpeed's allreduce_bucket (engine.py) averages a bucket in one of
// two ways: by default (postscale) it multiplies by 1/f, sums, and multiplies by f/W
// unless f == W; with prescale_gradients it multiplies by 1/W and sums. Both are the
// mean; they round differently. Here f == W stands for prescale, the division before the
// sum happens in the bucket, and the one after it is mean_factor() = f/W, folded into the
// unscale when attached (or a multiply in flush() when not).
BucketedReducer::BucketedReducer(std::shared_ptr<Context> context, int64_t bucket_size,
                                 double predivide)
    : context_(std::move(context)), bucket_size_(bucket_size), predivide_(predivide) {
  STEPWISE_CHECK_OPTION(bucket_size_ > 0, "bucket_size", "must be > 0, got ", bucket_size_);
  STEPWISE_CHECK_OPTION(std::isfinite(predivide_) && predivide_ > 0.0, "gradient_predivide_factor",
                        "must be a finite number > 0, got ", predivide_);
}

BucketedReducer::~BucketedReducer() = default;

void BucketedReducer::attach(std::vector<torch::Tensor>& params) {
  if (!context_ || context_->world_size() == 1 || !params_.empty()) return;
  torch::NoGradGuard no_grad;
  params_ = params;
  views_.resize(params_.size());
  bucket_of_.resize(params_.size());
  for (auto& indices : bucket_layout(params_, bucket_size_)) {
    auto& b = *buckets_.emplace_back(std::make_unique<Bucket>());
    b.params = std::move(indices);
    int64_t total = 0;
    for (size_t k : b.params) {
      total += params_[k].numel();
      bucket_of_[k] = buckets_.size() - 1;
    }
    b.buffer = torch::zeros({total}, params_[b.params.front()].options());
    b.wire = detail::wire_dtype(b.buffer) == b.buffer.scalar_type()
                 ? b.buffer
                 : torch::empty({total}, b.buffer.options().dtype(detail::wire_dtype(b.buffer)));
    int64_t at = 0;
    for (size_t k : b.params) {
      views_[k] = b.buffer.narrow(0, at, params_[k].numel()).view(params_[k].sizes());
      at += params_[k].numel();
      adopt(k);
    }
  }
  // One hook per parameter (not a leaf: none, and reduced at step()).
  hooks_ = std::make_unique<stepwise::detail::ReadyHooks>(params_,
                                                          [this](size_t k) { gradient_ready(k); });
}

void BucketedReducer::adopt(size_t k) {
  const torch::Tensor& grad = params_[k].grad();
  if (grad.defined() && grad.is_same(views_[k])) return;
  torch::NoGradGuard no_grad;
  if (grad.defined() && grad.data_ptr() == views_[k].data_ptr()) {
    params_[k].mutable_grad() = views_[k];
    return;
  }
  // Set elsewhere (a load, or a caller who replaced .grad): its values move in, once.
  if (grad.defined()) {
    views_[k].copy_(grad);
  } else {
    views_[k].zero_();
  }
  params_[k].mutable_grad() = views_[k];
}

void BucketedReducer::before_backward(bool last_of_window) {
  armed_ = !params_.empty() && last_of_window;
  in_backward_ = true;
}

void BucketedReducer::gradient_ready(size_t k) {
  if (!armed_ || k >= params_.size()) return;
  adopt(k);
  Bucket& b = *buckets_[bucket_of_[k]];
  if (++b.ready == b.params.size()) launch_ready();
}

void BucketedReducer::launch_ready() {
  // Every rank must start the same all-reduces in the same order: bucket i only after
  // buckets 0..i-1, whatever order this rank's backward fills them in.
  while (next_launch_ < buckets_.size() &&
         buckets_[next_launch_]->ready == buckets_[next_launch_]->params.size()) {
    launch(next_launch_++);
  }
}

void BucketedReducer::launch(size_t index) {
  Bucket& b = *buckets_[index];
  if (!b.wire.is_same(b.buffer)) b.wire.copy_(b.buffer);
  if (predivide_ != 1.0) b.wire.mul_(1.0 / predivide_);  // see NOTE: [predivide]
  const auto start = std::chrono::steady_clock::now();
  b.pending = detail::all_reduce_sum_start(
      *context_, b.wire,
      c10::str("gradient bucket ", index + 1, " (", b.wire.numel(), " elements)"));
  time_ += std::chrono::steady_clock::now() - start;
  calls_ += 1;
  if (in_backward_) overlapped_ += 1;
}

void BucketedReducer::wait(Bucket& b) {
  if (!b.pending) return;  // not started, or already waited for
  const auto start = std::chrono::steady_clock::now();
  detail::wait(*context_, *b.pending);
  time_ += std::chrono::steady_clock::now() - start;
  b.pending.reset();
  if (!b.wire.is_same(b.buffer)) b.buffer.copy_(b.wire);
}

void BucketedReducer::after_backward() {
  in_backward_ = false;
  if (!armed_) return;
  // The buckets started during backward are done before backward() returns, so what the
  // caller sees between backward() and step() (and the guard rails' fingerprints) stays.
  for (size_t i = 0; i < next_launch_; ++i) wait(*buckets_[i]);
}

// NOTE: [undefined gradients] A parameter the loss did not reach has no
// gradient on this rank but may have one on another; every rank must put the
// same tensors in the same buckets, so it is reduced as zeros.
void BucketedReducer::add(torch::Tensor& param) {
  if (!context_ || context_->world_size() == 1) return;
  if (!params_.empty()) return;  // attached: finalize() reduces every bucket
  torch::Tensor grad = param.grad();
  if (!grad.defined()) {
    param.mutable_grad() = torch::zeros_like(param);
    grad = param.grad();
  }
  const bool other_kind =
      !pending_.empty() && (pending_.front().scalar_type() != grad.scalar_type() ||
                            pending_.front().device() != grad.device());
  if (other_kind || (!pending_.empty() && pending_numel_ + grad.numel() > bucket_size_)) flush();
  pending_.push_back(grad);
  pending_numel_ += grad.numel();
}

void BucketedReducer::finalize() {
  if (!params_.empty()) {
    torch::NoGradGuard no_grad;
    for (size_t k = 0; k < params_.size(); ++k) adopt(k);
    for (auto& b : buckets_) b->ready = b->params.size();  // unreached: reduced as zeros
    launch_ready();
    for (auto& b : buckets_) {
      wait(*b);
      b->ready = 0;
    }
    next_launch_ = 0;
    armed_ = false;
    return;
  }
  flush();
  bucket_in_step_ = 0;
}

double BucketedReducer::mean_factor() const {
  // Attached (only with a context and W > 1), finalize() sums; unattached, flush() divides.
  return params_.empty() ? 1.0 : predivide_ / static_cast<double>(context_->world_size());
}

void BucketedReducer::restore_grads() {
  for (size_t k = 0; k < params_.size(); ++k) adopt(k);
}

void BucketedReducer::flush() {
  if (pending_.empty()) return;
  torch::NoGradGuard no_grad;
  // NOTE: [persistent buckets] Each bucket's flat buffer is kept and reused at
  // every boundary: Gloo registers a buffer's memory per call, and a fresh
  // allocation each step spent ~1.8x longer in c10d (data_parallel_bench, 5.3 MB).
  const size_t index = static_cast<size_t>(bucket_in_step_);
  if (buffers_.size() <= index) buffers_.resize(index + 1);
  torch::Tensor& bucket = buffers_[index];
  const auto& first = pending_.front();
  const auto dtype = detail::wire_dtype(first);
  if (!bucket.defined() || bucket.numel() != pending_numel_ || bucket.scalar_type() != dtype ||
      bucket.device() != first.device()) {
    bucket = torch::empty({pending_numel_}, first.options().dtype(dtype));
  }
  int64_t at = 0;
  for (const auto& g : pending_) {
    bucket.narrow(0, at, g.numel()).view_as(g).copy_(g);
    at += g.numel();
  }
  if (predivide_ != 1.0) bucket.mul_(1.0 / predivide_);  // see NOTE: [predivide]
  const auto start = std::chrono::steady_clock::now();
  context_->all_reduce_sum(
      bucket, c10::str("gradient bucket ", ++bucket_in_step_, " (", bucket.numel(), " elements)"));
  time_ += std::chrono::steady_clock::now() - start;
  calls_ += 1;
  const auto world = static_cast<double>(context_->world_size());
  if (predivide_ == 1.0) {
    bucket.div_(world);
  } else if (predivide_ != world) {
    bucket.mul_(predivide_ / world);
  }
  int64_t offset = 0;
  for (auto& g : pending_) {
    g.copy_(bucket.narrow(0, offset, g.numel()).view_as(g));
    offset += g.numel();
  }
  pending_.clear();
  pending_numel_ = 0;
}

int64_t BucketedReducer::num_buckets(const std::vector<torch::Tensor>& params) const {
  return static_cast<int64_t>(bucket_layout(params, bucket_size_).size());
}

namespace {

std::string shapes_of(const std::vector<torch::Tensor>& params) {
  std::ostringstream out;
  for (size_t i = 0; i < params.size(); ++i) out << (i ? ", " : "") << params[i].sizes();
  return out.str();
}

// NOTE: [rank fingerprint] Ranks that disagree on GAS or on the model would
// deadlock or silently average unrelated tensors; a few integers gathered from
// every rank at initialize() catch it with a message naming the rank.
void check_ranks_agree(Context& context, const std::vector<torch::Tensor>& params,
                       std::vector<RankCheck> checks) {
  const std::string shapes = shapes_of(params);
  const int64_t shape_hash = static_cast<int64_t>(std::hash<std::string>{}(shapes) >> 1);
  int64_t numel = 0;
  for (const auto& p : params) numel += p.numel();
  checks.push_back({"number of trainable parameters", static_cast<int64_t>(params.size())});
  checks.push_back({"number of trainable elements", numel});
  checks.push_back({"parameter shapes (hash)", shape_hash});  // last: see `hashed` below
  std::vector<int64_t> values;
  for (const auto& c : checks) values.push_back(c.value);
  auto all =
      context.all_gather(torch::tensor(values, torch::kLong), "the configuration fingerprint");
  for (int64_t r = 1; r < context.world_size(); ++r) {
    for (size_t i = 0; i < checks.size(); ++i) {
      const int64_t first = all[0][i].item<int64_t>();
      const int64_t other = all[r][i].item<int64_t>();
      if (first == other) continue;
      const bool hashed = i + 1 == checks.size();
      const std::string values = hashed ? c10::str("rank 0 and rank ", r, " differ")
                                        : c10::str(first, " on rank 0, ", other, " on rank ", r);
      throw DistributedError(c10::str("stepwise::initialize: the ranks disagree on the ",
                                      checks[i].name, " (", values,
                                      "). Every rank must run the same model with the same "
                                      "config; this rank (",
                                      context.rank(), ") has parameter shapes ", shapes));
    }
  }
}

}  // namespace

std::unique_ptr<GradientReducer> make_gradient_reducer(std::vector<torch::Tensor>& params,
                                                       const ReducerOptions& options,
                                                       std::vector<RankCheck> must_agree) {
  auto context = default_context();
  const double world = context ? static_cast<double>(context->world_size()) : 1.0;
  auto reducer = std::make_unique<BucketedReducer>(
      context, options.bucket_size(),
      options.prescale_gradients() ? world : options.gradient_predivide_factor());
  if (!context || context->world_size() == 1) return reducer;
  check_ranks_agree(*context, params, std::move(must_agree));
  // All ranks start from rank 0's parameters (one broadcast per parameter, once).
  torch::NoGradGuard no_grad;
  for (auto& p : params) {
    context->broadcast(p, /*root=*/0, "the initial parameters");
  }
  return reducer;
}

}  // namespace stepwise::distributed
