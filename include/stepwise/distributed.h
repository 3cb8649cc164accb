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

namespace torch::autograd {
struct Node;
}  // namespace torch::autograd

namespace stepwise {

namespace distributed {

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

  /// An all-reduce in flight (all_reduce_sum_start): wait() for it before reading the
  /// tensor; destroying it without wait() waits (errors then are only logged).
  class Pending {
   public:
    ~Pending();
    Pending(const Pending&) = delete;
    Pending& operator=(const Pending&) = delete;

   private:
    friend class Context;
    struct Impl;
    explicit Pending(std::unique_ptr<Impl> impl);
    std::unique_ptr<Impl> impl_;
  };
  /// Starts summing `tensor` over all ranks, in place, and returns at once (the backend
  /// works on its own threads or stream). `tensor` must be on device(); every rank must
  /// start the same collectives in the same order. `what` names it in errors.
  std::unique_ptr<Pending> all_reduce_sum_start(torch::Tensor& tensor, const std::string& what);
  /// Waits for `pending` (DistributedError naming the rank that is gone, as
  /// all_reduce_sum, when it fails or passes the timeout).
  void wait(Pending& pending);
  /// In place: `tensor` becomes rank `root`'s value on every rank.
  void broadcast(torch::Tensor& tensor, int64_t root, const std::string& what);
  /// Every rank's `tensor` (same shape on all ranks), indexed by rank.
  std::vector<torch::Tensor> all_gather(const torch::Tensor& tensor, const std::string& what);
  /// Waits until every rank calls it.
  void barrier(const std::string& what);

 private:
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
/// This process's rank (0 without a group).
int64_t rank();
/// Number of ranks (1 without a group).
int64_t world_size();
/// A barrier (so no rank closes while others still reduce), then leaves the group.
void shutdown();

/// Averages gradients over the ranks; flashlight's two-method reducer interface.
/// The engine calls add() for every parameter, then finalize(), at the
/// accumulation boundary only; the other hooks let a reducer own the gradients'
/// storage and overlap its communication with backward (BucketedReducer does).
class GradientReducer {
 public:
  virtual ~GradientReducer() = default;
  /// Queues `param`'s gradient (an undefined gradient counts as zeros).
  virtual void add(torch::Tensor& param) = 0;
  /// Reduces everything queued: afterwards every rank holds the same gradients, the
  /// mean over the ranks divided by mean_factor() (the mean, or the sum when
  /// mean_factor() is 1/W).
  virtual void finalize() = 0;
  /// add() for each of `params`, then finalize().
  void reduce(std::vector<torch::Tensor>& params);
  /// All-reduce calls so far (one per bucket per boundary; 0 when W == 1).
  virtual int64_t all_reduce_calls() const = 0;
  /// Time spent in all-reduce calls so far (waiting for them, when they overlap).
  virtual std::chrono::nanoseconds all_reduce_time() const = 0;

  /// Called once, when `params` (the model's trainable parameters) have their final
  /// dtype and device: a reducer may make their gradients views of its own storage.
  virtual void attach(std::vector<torch::Tensor>& params) { (void)params; }
  /// Before each backward(): whether it is the last of its window (the next step() is
  /// the boundary), so that a reducer may start reducing during it.
  virtual void before_backward(bool last_of_window) { (void)last_of_window; }
  /// After each backward(): what started during it has finished.
  virtual void after_backward() {}
  /// What the engine multiplies the reduced gradients by for their mean: 1 when
  /// finalize() averaged, 1/W when it summed (the engine folds it into the unscale).
  virtual double mean_factor() const { return 1.0; }
  /// After the optimizer step set the gradients to none (or a checkpoint load set
  /// them): a reducer that owns their storage points them back to it, keeping the
  /// values they have (none: zeros).
  virtual void restore_grads() {}
};

/// NOTE: [bucket views] Sums gradients in flat buckets of at most `bucket_size`
/// elements, one all-reduce per bucket, in the reverse order of the parameters (the
/// order backward produces them, as PyTorch DDP). Once attached, every parameter's
/// `.grad` IS a view into its bucket: backward() accumulates into the bucket, nothing
/// is copied in or out (except bf16 on Gloo, which sums a float copy), and during the
/// backward() that ends a window, each bucket's all-reduce starts as soon as its last
/// gradient is in, on c10d's own threads, while backward goes on; backward() returns
/// when they are done, step() starts the buckets still waiting (a parameter this rank's
/// loss did not reach is reduced as zeros) and waits. finalize() sums; the engine
/// multiplies by mean_factor() = 1/W in the unscale that follows. A no-op when
/// `context` is null or W == 1. Unattached (the reducer used on its own), finalize()
/// copies into and out of its buffers and divides by W, as before.
class BucketedReducer : public GradientReducer {
 public:
  /// `bucket_size` in elements (> 0); a larger tensor gets a bucket of its own.
  BucketedReducer(std::shared_ptr<Context> context, int64_t bucket_size);
  ~BucketedReducer() override;
  void add(torch::Tensor& param) override;
  void finalize() override;
  int64_t all_reduce_calls() const override { return calls_; }
  std::chrono::nanoseconds all_reduce_time() const override { return time_; }
  void attach(std::vector<torch::Tensor>& params) override;
  void before_backward(bool last_of_window) override;
  void after_backward() override;
  double mean_factor() const override;
  void restore_grads() override;
  /// Number of buckets `params` occupy (what one boundary costs in all-reduce calls).
  int64_t num_buckets(const std::vector<torch::Tensor>& params) const;
  /// All-reduce calls started during a backward() so far (overlapped with it).
  int64_t overlapped_calls() const { return overlapped_; }

  /// Called by the autograd hook of parameter `index` once its gradient is in.
  void gradient_ready(size_t index);

 private:
  struct Bucket;
  struct HookTarget;
  void flush();
  void adopt(size_t index);   // `index`'s gradient is its bucket view again
  void launch_ready();        // starts complete buckets, in order
  void launch(size_t index);  // starts bucket `index`'s all-reduce
  void wait(Bucket& bucket);

  std::shared_ptr<Context> context_;
  int64_t bucket_size_;
  std::vector<torch::Tensor> pending_;
  std::vector<torch::Tensor> buffers_;  // one flat buffer per bucket, reused
  int64_t pending_numel_ = 0;
  int64_t bucket_in_step_ = 0;
  int64_t calls_ = 0;
  int64_t overlapped_ = 0;
  std::chrono::nanoseconds time_{0};
  // Attached (see NOTE: [bucket views]):
  std::vector<torch::Tensor> params_;
  std::vector<torch::Tensor> views_;  // per parameter: its slice of its bucket
  std::vector<size_t> bucket_of_;     // per parameter
  std::vector<std::unique_ptr<Bucket>> buckets_;
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;  // the hooks' nodes
  std::shared_ptr<HookTarget> hook_target_;  // what the hooks call; cleared on destruction
  bool armed_ = false;
  bool in_backward_ = false;
  size_t next_launch_ = 0;
};

/// What stepwise::initialize does for data parallelism: joins the group from
/// the environment when WORLD_SIZE is set and init() was not called, with the
/// backend of `params_device` (NCCL for CUDA, Gloo otherwise); returns W.
int64_t world_size_for_engine(const torch::Device& params_device = torch::kCPU);

/// Options of the gradient reducer that stepwise::initialize builds (the config's
/// `"stepwise"` section: reduce_bucket_size, overlap_comm).
struct ReducerOptions {
  /// Elements per flat all-reduce bucket when W > 1 (> 0; DeepSpeed's stage-0 bucket
  /// is 500,000,000 elements and has no key).
  TORCH_ARG(int64_t, bucket_size) = 500000000;
  /// When W > 1, start each bucket's all-reduce during the backward() that ends the
  /// window, as soon as the bucket is full (DeepSpeed's overlap_comm); false: all at
  /// step() (NOTE: [bucket views]).
  TORCH_ARG(bool, overlap_comm) = true;
};

/// A value every rank must have the same of, and its name for the error.
struct RankCheck {
  /// What it is, as the user knows it ("gradient_accumulation_steps").
  std::string name;
  /// This rank's value.
  int64_t value = 0;
};

/// What stepwise::initialize does after resolving batch sizes: checks that all ranks
/// agree on `must_agree` and on `params`' count, size and shapes (DistributedError
/// naming the first differing value and rank), broadcasts rank 0's parameters, and
/// returns the reducer.
std::unique_ptr<GradientReducer> make_gradient_reducer(std::vector<torch::Tensor>& params,
                                                       const ReducerOptions& options,
                                                       std::vector<RankCheck> must_agree);

}  // namespace distributed
}  // namespace stepwise
