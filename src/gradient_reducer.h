// stepwise (internal): the gradient reducer: how the engine averages gradients over the
// ranks at the accumulation boundary, in flat buckets, one all-reduce each; the engine
// divides by W in the unscale that follows (NOTE: [bucket views]). Its options are
// public (<stepwise/gradient_reducer.h>).
#pragma once

#include <stepwise/distributed.h>
#include <stepwise/gradient_reducer.h>

#include <torch/types.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace stepwise::detail {
class ReadyHooks;
}  // namespace stepwise::detail

namespace stepwise::distributed {

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
  /// Instead of after_backward(), when the backward() threw.
  virtual void abort_backward() {}
  /// What the engine multiplies the reduced gradients by for their mean: 1 when
  /// finalize() averaged, 1/W when it summed (the engine folds it into the unscale).
  virtual double mean_factor() const { return 1.0; }
  /// After the optimizer step set the gradients to none (or a checkpoint load set
  /// them): a reducer that owns their storage points them back to it, keeping the
  /// values they have (none: zeros).
  virtual void restore_grads() {}
  /// Before a checkpoint reads the gradients of a window: a reducer that keeps them
  /// elsewhere puts them on `.grad`, until restore_grads().
  virtual void show_grads() {}
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
  /// `bucket_size` in elements (> 0); a larger tensor gets a bucket of its own. Each
  /// bucket is divided by `predivide` (> 0) before its all-reduce and by W / predivide
  /// after it (NOTE: [predivide]).
  BucketedReducer(std::shared_ptr<Context> context, int64_t bucket_size, double predivide = 1.0);
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
  void flush();
  void adopt(size_t index);   // `index`'s gradient is its bucket view again
  void launch_ready();        // starts complete buckets, in order
  void launch(size_t index);  // starts bucket `index`'s all-reduce
  void wait(Bucket& bucket);

  std::shared_ptr<Context> context_;
  int64_t bucket_size_;
  double predivide_;
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
  std::unique_ptr<stepwise::detail::ReadyHooks> hooks_;
  bool armed_ = false;
  bool in_backward_ = false;
  size_t next_launch_ = 0;
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

}  // namespace stepwise::distributed
