// GradientReducer: flat-bucket all-reduce of gradients at the accumulation
// boundary, and what initialize() checks across ranks.
#include <stepwise/config.h>
#include <stepwise/distributed.h>
#include <stepwise/errors.h>

#include <torch/torch.h>

#include <functional>
#include <sstream>

namespace stepwise::distributed {

void GradientReducer::reduce(std::vector<torch::Tensor>& params) {
  for (auto& p : params) add(p);
  finalize();
}

BucketedReducer::BucketedReducer(std::shared_ptr<Context> context, int64_t bucket_size)
    : context_(std::move(context)), bucket_size_(bucket_size) {
  STEPWISE_CHECK(bucket_size_ > 0, ConfigError, "stepwise.reduce_bucket_size must be > 0, got ",
                 bucket_size_);
}

// NOTE: [undefined gradients] A parameter the loss did not reach has no
// gradient on this rank but may have one on another; every rank must put the
// same tensors in the same buckets, so it is reduced as zeros.
void BucketedReducer::add(torch::Tensor& param) {
  if (!context_ || context_->world_size() == 1) return;
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
  flush();
  bucket_in_step_ = 0;
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
  // Gloo (LibTorch 1.13) has no bfloat16 all-reduce ("Invalid scalar type"): a bf16
  // bucket on the CPU is summed as fp32, then rounded back into the gradients.
  const auto dtype = first.scalar_type() == torch::kBFloat16 && first.device().is_cpu()
                         ? torch::kFloat
                         : first.scalar_type();
  if (!bucket.defined() || bucket.numel() != pending_numel_ || bucket.scalar_type() != dtype ||
      bucket.device() != first.device()) {
    bucket = torch::empty({pending_numel_}, first.options().dtype(dtype));
  }
  int64_t at = 0;
  for (const auto& g : pending_) {
    bucket.narrow(0, at, g.numel()).view_as(g).copy_(g);
    at += g.numel();
  }
  const auto start = std::chrono::steady_clock::now();
  context_->all_reduce_sum(
      bucket, c10::str("gradient bucket ", ++bucket_in_step_, " (", bucket.numel(), " elements)"));
  time_ += std::chrono::steady_clock::now() - start;
  calls_ += 1;
  bucket.div_(static_cast<double>(context_->world_size()));
  int64_t offset = 0;
  for (auto& g : pending_) {
    g.copy_(bucket.narrow(0, offset, g.numel()).view_as(g));
    offset += g.numel();
  }
  pending_.clear();
  pending_numel_ = 0;
}

int64_t BucketedReducer::num_buckets(const std::vector<torch::Tensor>& params) const {
  int64_t buckets = 0;
  int64_t numel = 0;
  c10::optional<torch::ScalarType> kind;
  for (const auto& p : params) {
    if (!kind || *kind != p.scalar_type() || numel + p.numel() > bucket_size_) {
      if (kind) buckets += 1;
      numel = 0;
    }
    kind = p.scalar_type();
    numel += p.numel();
  }
  return kind ? buckets + 1 : 0;
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
                       const BatchSizes& sizes, int64_t bucket_size) {
  const std::string shapes = shapes_of(params);
  const int64_t shape_hash = static_cast<int64_t>(std::hash<std::string>{}(shapes) >> 1);
  int64_t numel = 0;
  for (const auto& p : params) numel += p.numel();
  const std::vector<std::string> names = {"gradient_accumulation_steps",
                                          "train_micro_batch_size_per_gpu",
                                          "train_batch_size",
                                          "stepwise.reduce_bucket_size",
                                          "number of trainable parameters",
                                          "number of trainable elements",
                                          "parameter shapes (hash)"};
  auto mine =
      torch::tensor({sizes.gradient_accumulation_steps, sizes.micro_batch, sizes.train_batch_size,
                     bucket_size, static_cast<int64_t>(params.size()), numel, shape_hash},
                    torch::kLong);
  auto all = context.all_gather(mine, "the configuration fingerprint");
  for (int64_t r = 1; r < context.world_size(); ++r) {
    for (size_t i = 0; i < names.size(); ++i) {
      const int64_t first = all[0][i].item<int64_t>();
      const int64_t other = all[r][i].item<int64_t>();
      if (first == other) continue;
      const std::string values = i == 6 ? c10::str("rank 0 and rank ", r, " differ")
                                        : c10::str(first, " on rank 0, ", other, " on rank ", r);
      throw DistributedError(c10::str("stepwise::initialize: the ranks disagree on the ", names[i],
                                      " (", values,
                                      "). Every rank must run the same model with the same "
                                      "config; this rank (",
                                      context.rank(), ") has parameter shapes ", shapes));
    }
  }
}

}  // namespace

std::unique_ptr<GradientReducer> make_gradient_reducer(std::vector<torch::Tensor>& params,
                                                       const Config& config,
                                                       const BatchSizes& sizes) {
  auto context = default_context();
  const int64_t bucket_size = config.stepwise.reduce_bucket_size;
  auto reducer = std::make_unique<BucketedReducer>(context, bucket_size);
  if (!context || context->world_size() == 1) return reducer;
  check_ranks_agree(*context, params, sizes, bucket_size);
  // All ranks start from rank 0's parameters (one broadcast per parameter, once).
  torch::NoGradGuard no_grad;
  for (auto& p : params) {
    context->broadcast(p, /*root=*/0, "the initial parameters");
  }
  return reducer;
}

}  // namespace stepwise::distributed
