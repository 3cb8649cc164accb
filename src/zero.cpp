#include "zero.h"
#include <stepwise/errors.h>

#include <torch/torch.h>

#include "check.h"

#include <algorithm>
#include <numeric>

namespace stepwise::detail {

std::vector<int64_t> owners_by_size(const std::vector<int64_t>& numels, int64_t world_size) {
  const int64_t total = std::accumulate(numels.begin(), numels.end(), int64_t{0});
  std::vector<int64_t> owners(numels.size(), 0);
  int64_t rank = 0;
  int64_t before = 0;  // elements before parameter i
  for (size_t i = 0; i < numels.size(); ++i) {
    // Move on to the next rank when this parameter's middle lies past the current
    // rank's share: each boundary falls at the tensor edge nearest to r * total / W.
    while (rank + 1 < world_size && 2 * before + numels[i] > 2 * total * (rank + 1) / world_size) {
      rank += 1;
    }
    owners[i] = rank;
    before += numels[i];
  }
  return owners;
}

ZeroShards::ZeroShards(const distributed::ZeroOptions& options,
                       const std::vector<torch::Tensor>& params,
                       std::shared_ptr<distributed::Context> context)
    : options_(options), context_(std::move(context)) {
  STEPWISE_CHECK(options_.stage() >= 0 && options_.stage() <= 2, ConfigError,
                 "ZeroOptions().stage(", options_.stage(),
                 "): stepwise runs ZeRO stages 0, 1 and 2 (3 partitions the parameters "
                 "themselves, which it does not implement)");
  const int64_t world = context_ ? context_->world_size() : 1;
  sharded_ = options_.stage() >= 1 && world > 1;
  std::vector<int64_t> numels;
  for (const auto& p : params) numels.push_back(p.numel());
  owners_ = sharded_ ? owners_by_size(numels, world) : std::vector<int64_t>(params.size(), 0);
  const int64_t me = sharded_ ? context_->rank() : 0;
  for (size_t i = 0; i < owners_.size(); ++i) {
    if (owners_[i] == me) owned_.push_back(i);
  }
}

void ZeroShards::sum_over_ranks(torch::Tensor& t) const {
  if (sharded_) context_->all_reduce_sum(t, "ZeRO's gradient norms and overflow flag");
}

namespace {

// The same bytes as a type Gloo's broadcast takes (it copies them unchanged): bf16 goes as
// half (Gloo in LibTorch 1.13 has no bf16 or int16), the other widths as integers.
torch::Tensor as_bytes(const torch::Tensor& flat) {
  switch (flat.element_size()) {
    case 2:
      return flat.view(torch::kHalf);
    case 4:
      return flat.view(torch::kInt);
    case 8:
      return flat.view(torch::kLong);
    default:
      return flat.view(torch::kByte);
  }
}

}  // namespace

// NOTE: [gather buckets] A tensor of kInPlace elements or more, or one that fills a bucket
// alone, is broadcast in place, on its own: no copy of it is made (DeepSpeed gathers into
// its flat buffer in place too). Runs of smaller tensors of one owner and dtype are packed
// into one buffer of at most allgather_bucket_size elements, one broadcast each, so a model
// of many small tensors costs few calls and the copies stay small.
constexpr int64_t kInPlace = int64_t{1} << 20;

void ZeroShards::gather(const std::vector<torch::Tensor>& params) const {
  if (!sharded_) return;
  torch::NoGradGuard no_grad;
  const int64_t me = context_->rank();
  const int64_t in_place = std::min(kInPlace, options_.allgather_bucket_size());
  size_t i = 0;
  while (i < params.size()) {
    const int64_t owner = owners_[i];
    const std::string what = c10::str("ZeRO's gather of rank ", owner, "'s parameters");
    if (params[i].numel() >= in_place && params[i].is_contiguous()) {
      torch::Tensor bytes = as_bytes(params[i].detach().view({-1}));
      context_->broadcast(bytes, owner, what);
      calls_ += 1;
      i += 1;
      continue;
    }
    const auto dtype = params[i].scalar_type();
    size_t end = i;
    int64_t numel = 0;
    while (end < params.size() && owners_[end] == owner && params[end].scalar_type() == dtype &&
           params[end].numel() < in_place &&
           (end == i || numel + params[end].numel() <= options_.allgather_bucket_size())) {
      numel += params[end].numel();
      end += 1;
    }
    std::vector<torch::Tensor> flat;
    for (size_t k = i; k < end; ++k) flat.push_back(params[k].detach().reshape({-1}));
    torch::Tensor bucket =
        owner == me ? torch::cat(flat) : torch::empty({numel}, params[i].options());
    torch::Tensor bytes = as_bytes(bucket);
    context_->broadcast(bytes, owner, what);
    calls_ += 1;
    if (owner != me) {
      int64_t at = 0;
      for (size_t k = i; k < end; ++k) {
        const int64_t n = params[k].numel();
        params[k].detach().copy_(bucket.narrow(0, at, n).view(params[k].sizes()));
        at += n;
      }
    }
    i = end;
  }
}

}  // namespace stepwise::detail
