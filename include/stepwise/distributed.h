// stepwise: data parallelism over LibTorch's c10d (Gloo on CPU, NCCL on CUDA).
//
// Usage {.cpp .fragment context="loader"}:
//
//   // Started by `tools/launch -n 2 -- ./train` (torchrun's RANK, WORLD_SIZE, ...),
//   // initialize() joins the group; without those variables the world is this process.
//   auto engine = stepwise::initialize(model, stepwise::Config::from_file("ds_config.json"));
//   int64_t rank = stepwise::distributed::rank();  // 0 .. world_size() - 1
//   for (size_t i = rank; i < loader.size(); i += stepwise::distributed::world_size()) {
//     engine.backward(torch::mse_loss(model->forward(loader[i].data), loader[i].target));
//     engine.step();  // at the boundary: gradients averaged over the ranks
//   }
//   if (stepwise::distributed::is_initialized()) stepwise::distributed::shutdown();
//
// At the accumulation boundary (never in between), engine.step() sums every
// gradient over the W ranks through flat buckets and divides by W, so every
// rank steps with the same mean gradient; the gradient norm used for clipping
// is therefore global. initialize() broadcasts rank 0's parameters and checks
// that every rank has the same batch sizes and parameter shapes.
#pragma once

#include <torch/arg.h>
#include <torch/types.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace stepwise {

namespace distributed {

namespace detail {
struct ContextAccess;  // the engine's own collectives (src/collectives.h)
}  // namespace detail

/// A collective failed or timed out, a rank is missing, or the ranks disagree
/// (configuration, parameter shapes). The message names the rank(s) and the timeout.
class DistributedError : public std::runtime_error {
 public:
  /// Builds the error from its full message.
  explicit DistributedError(const std::string& message) : std::runtime_error(message) {}
};

/// The c10d backend: Gloo (CPU tensors) or NCCL (CUDA tensors, needs a CUDA LibTorch).
enum class Backend { kGloo, kNccl };

/// How to join the group. Unset fields come from torchrun's environment
/// variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT).
struct InitOptions {
  /// This process's rank in 0..world_size-1 (default: $RANK).
  TORCH_ARG(std::optional<int64_t>, rank) = std::nullopt;
  /// Number of processes (default: $WORLD_SIZE, or 1 when unset).
  TORCH_ARG(std::optional<int64_t>, world_size) = std::nullopt;
  /// Rank on this machine (default: $LOCAL_RANK, or the rank).
  TORCH_ARG(std::optional<int64_t>, local_rank) = std::nullopt;
  /// Host of rank 0's rendezvous store (default: $MASTER_ADDR, or 127.0.0.1).
  TORCH_ARG(std::optional<std::string>, master_addr) = std::nullopt;
  /// Port of the rendezvous store (default: $MASTER_PORT, or 29500).
  TORCH_ARG(std::optional<int64_t>, master_port) = std::nullopt;
  /// The backend. Unset: chosen by device, as PyTorch's "cpu:gloo,cuda:nccl": when
  /// stepwise::initialize joins the group, NCCL if the model's parameters are on CUDA
  /// (needs a CUDA-enabled LibTorch), Gloo otherwise; a plain init() takes Gloo.
  TORCH_ARG(std::optional<Backend>, backend) = std::nullopt;
  /// Limit on the rendezvous (all ranks arrive) and on every collective.
  TORCH_ARG(std::chrono::milliseconds, timeout) = std::chrono::minutes(5);
};

/// A joined process group: rank, size and the collectives stepwise uses.
/// Created by distributed::init; one per process.
class Context {
 public:
  /// Joins the group described by `options` (blocks until all ranks arrive or
  /// the timeout passes: DistributedError naming the ranks that did not arrive).
  explicit Context(const InitOptions& options);
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  /// This process's rank.
  int64_t rank() const { return rank_; }
  /// Number of ranks W.
  int64_t world_size() const { return world_size_; }
  /// Rank on this machine.
  int64_t local_rank() const { return local_rank_; }
  /// The collective timeout.
  std::chrono::milliseconds timeout() const { return timeout_; }
  /// "gloo" or "nccl".
  std::string backend_name() const;
  /// Where the backend's tensors live: the CPU for Gloo, `cuda:LOCAL_RANK` for NCCL.
  /// The collectives below move a tensor that lives elsewhere there and back, so the
  /// small checks (flags, hashes, counts) work on either backend.
  torch::Device device() const;

  /// In place: `tensor` becomes the sum over all ranks. `what` names it in errors.
  void all_reduce_sum(torch::Tensor& tensor, const std::string& what);

  /// In place: `tensor` becomes rank `root`'s value on every rank.
  void broadcast(torch::Tensor& tensor, int64_t root, const std::string& what);
  /// Every rank's `tensor` (same shape on all ranks), indexed by rank.
  std::vector<torch::Tensor> all_gather(const torch::Tensor& tensor, const std::string& what);
  /// Waits until every rank calls it.
  void barrier(const std::string& what);

 private:
  friend struct detail::ContextAccess;
  [[noreturn]] void fail(const std::string& what, const std::exception& cause);

  struct Impl;
  std::unique_ptr<Impl> impl_;
  int64_t rank_ = 0;
  int64_t world_size_ = 1;
  int64_t local_rank_ = 0;
  std::chrono::milliseconds timeout_{};
};

/// Joins the process group (torchrun's variables fill unset options) and makes
/// it the one stepwise::initialize uses. Throws DistributedError if already initialized.
std::shared_ptr<Context> init(const InitOptions& options = {});
/// Whether init() was called (and shutdown() not yet).
bool is_initialized();
/// The group set by init(), or null.
std::shared_ptr<Context> default_context();
/// This process's rank in the group that init() (or stepwise::initialize) joined; 0
/// without a group, so 0 on every rank before the group is joined.
int64_t rank();
/// Number of ranks in that group; 1 without a group (before it is joined, too).
int64_t world_size();
/// A barrier (so no rank closes while others still reduce), then leaves the group.
void shutdown();

/// What stepwise::initialize does for data parallelism: joins the group from
/// the environment when WORLD_SIZE is set and init() was not called, with the
/// backend of `params_device` (NCCL for CUDA, Gloo otherwise); returns W.
int64_t world_size_for_engine(const torch::Device& params_device = torch::kCPU);

}  // namespace distributed
}  // namespace stepwise
