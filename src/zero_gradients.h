// stepwise (internal): ZeRO stage 2's gradients: each micro-step's gradients summed into
// their owners as backward produces them, so that a rank keeps the accumulated gradients of
// its own parameters only. The engine uses it as its gradient reducer at stage 2.
#pragma once

#include <stepwise/distributed.h>

#include "gradient_reducer.h"

#include <torch/types.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "collectives.h"

namespace stepwise::detail {

class ReadyHooks;

/// NOTE: [stage 2 gradients] The parameters are laid out in buckets of at most
/// `bucket_size` elements in backward's order (the reverse of the model's), each holding
/// parameters of one owner (whole-tensor shards: NOTE: [whole-tensor shards]). During
/// every backward(), each parameter's gradient is copied into its bucket as soon as
/// autograd has produced it (a hook on its AccumulateGrad node) and dropped from `.grad`;
/// a complete bucket is summed into its owner (one c10d reduce) and the owner adds it to
/// its running sums; buckets go in order, the ones the loss did not reach (zeros) after
/// backward. With overlap_comm the reduce runs on the backend's threads while backward goes
/// on, kInFlight buckets at most; without, backward waits for it. So between micro-steps a
/// rank holds the sums of its own parameters only (in the same memory window after
/// window), and the buffers of the buckets being filled or reduced (one, kInFlight + 1 with
/// overlap, when backward produces the gradients in bucket order; more while an earlier
/// bucket waits for a parameter the loss reaches late), reused at every micro-step. The
/// predivide of NOTE: [predivide] applies to each micro-step's reduce. At the boundary finalize()
/// makes the sums the owned parameters' `.grad` (the others have none) and the engine divides by W
/// in the unscale (mean_factor()), as at stage 0. The sums differ from stage 0's by rounding at GAS
/// > 1: stage 0 adds a rank's micro-steps, then the ranks; stage 2 the other way round.
class ShardedGradients : public distributed::GradientReducer {
 public:
  /// `owners`: each trainable parameter's rank; `bucket_size` in elements (> 0);
  /// `overlap`: a bucket's reduce runs while backward goes on (at most kInFlight at once)
  /// instead of before it does.
  /// `predivide`: each bucket is multiplied by 1 / predivide before its reduce and the
  /// engine by predivide / W after (DeepSpeed's prescale_gradients: W; its
  /// gradient_predivide_factor: f; NOTE: [predivide]).
  ShardedGradients(std::shared_ptr<distributed::Context> context, std::vector<int64_t> owners,
                   int64_t bucket_size, bool overlap, double predivide);
  /// With overlap: the buckets whose reduces may be in flight at once (the memory that
  /// overlap costs: that many buckets).
  static constexpr size_t kInFlight = 1;
  ~ShardedGradients() override;
  void add(torch::Tensor& param) override { (void)param; }
  /// The owned sums become the owned parameters' `.grad`.
  void finalize() override;
  /// Reduce calls so far (one per bucket per micro-step).
  int64_t all_reduce_calls() const override { return calls_; }
  std::chrono::nanoseconds all_reduce_time() const override { return time_; }
  void attach(std::vector<torch::Tensor>& params) override;
  void before_backward(bool last_of_window) override;
  void after_backward() override;
  double mean_factor() const override;
  /// The owned parameters' `.grad` (none after a step; a checkpoint's window after a
  /// load; the sums after show_grads()) become the running sums, none keeping the sums'
  /// memory for the next window; every `.grad` is none.
  void restore_grads() override;
  void show_grads() override;
  /// A backward() that threw: waits for the reduces in flight and drops this micro-step's
  /// buckets (the sums keep the micro-steps before it), so the next backward() starts clean.
  void abort_backward() override;
  /// Called by the hook of parameter `index` once autograd has produced its gradient.
  void gradient_ready(size_t index);

 private:
  struct Bucket {
    std::vector<size_t> params;  // indices, backward's order
    std::vector<int64_t> offsets;
    int64_t numel = 0;
    int64_t owner = 0;
    size_t ready = 0;
    torch::Tensor buffer;   // this micro-step's, while it fills and is reduced
    torch::Tensor storage;  // what `buffer` is the start of (a spare one, reused)
    std::unique_ptr<distributed::detail::PendingCollective> pending;  // its reduce
  };
  void take(size_t index);  // copies .grad into its bucket and drops it
  void reduce_ready();      // starts the reduces of complete buckets, in order
  void start(size_t bucket);
  void finish_oldest();          // waits for the oldest reduce in flight and adds it up
  void acquire(Bucket& bucket);  // a zeroed buffer, a spare one if there is one
  void release(Bucket& bucket);  // its buffer becomes a spare

  std::shared_ptr<distributed::Context> context_;
  std::vector<int64_t> owners_;
  int64_t bucket_size_;
  bool overlap_;
  double predivide_;
  std::deque<size_t> in_flight_;      // buckets whose reduce started, oldest first
  std::vector<torch::Tensor> spare_;  // buffers no bucket holds now
  std::vector<torch::Tensor> params_;
  std::vector<torch::Tensor> sums_;  // per parameter: the window's sum (owned only)
  std::vector<bool> fresh_;          // whether sums_ holds nothing of this window yet
  std::vector<Bucket> buckets_;
  std::vector<size_t> bucket_of_;
  std::vector<bool> taken_;
  size_t next_ = 0;
  bool armed_ = false;
  int64_t calls_ = 0;
  std::chrono::nanoseconds time_{0};
  std::unique_ptr<ReadyHooks> hooks_;
};

}  // namespace stepwise::detail
