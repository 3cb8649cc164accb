// Data-parallel cost on this machine (W = 2 ranks forked from this process):
//   1. the reducer's all-reduce time per optimizer step (gradients as bucket views)
//      against one flat c10d all-reduce of the same bytes: the bucketing overhead;
//   2. the boundary micro-step (backward + step) with the all-reduces overlapped with
//      backward (stepwise.overlap_comm) against all of them in step();
//   3. the time of one optimizer step (GAS micro-steps + boundary) with W = 1
//      against W = 2 (same per-rank work: weak scaling, ideal ratio 1.0).
//
//   data_parallel_bench [--steps N] [--bucket ELEMENTS]
#include <stepwise/stepwise.h>

#include <nlohmann/json.hpp>

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <thread>
#include <tuple>

#include "gradient_reducer.h"  // internal: the reducer and its counters

#include "support/free_port.h"

namespace {

using stepwise::testing::free_port;

using Clock = std::chrono::steady_clock;
using Ms = std::chrono::duration<double, std::milli>;

struct Result {
  double step_ms = 0;         // per optimizer step, overlap on (the default)
  double step_ms_serial = 0;  // the same with stepwise.overlap_comm false
  double boundary_ms = 0;     // the boundary micro-step (backward + step), overlap on
  double boundary_ms_serial = 0;
  double reducer_ms = 0;   // per optimizer step, inside training (waits, rank skew)
  double isolated_ms = 0;  // the reducer alone, ranks synchronized by a barrier
  double flat_ms = 0;      // one flat all-reduce of the same bytes
  int64_t buckets = 0;
  int64_t elements = 0;
  int64_t overlapped = 0;  // all-reduces started during backward, per step
};

torch::nn::Sequential make_model() {
  torch::manual_seed(0);
  return torch::nn::Sequential(torch::nn::Linear(256, 1024), torch::nn::ReLU(),
                               torch::nn::Linear(1024, 1024), torch::nn::ReLU(),
                               torch::nn::Linear(1024, 1));
}

// Trains `steps` optimizer steps (GAS 2, mbs 32) after a warm-up: (step ms, boundary ms).
std::pair<double, double> train(int64_t steps, int64_t bucket, bool overlap, Result& r) {
  auto model = make_model();
  const int64_t gas = 2;
  const int64_t mbs = 32;
  auto engine = stepwise::initialize(
      model.ptr(),
      stepwise::Config::from_json(
          {{"train_micro_batch_size_per_gpu", mbs},
           {"gradient_accumulation_steps", gas},
           {"steps_per_print", 1000000},
           {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-4}}}}},
           {"stepwise", {{"reduce_bucket_size", bucket}, {"overlap_comm", overlap}}}}));
  auto x = torch::randn({mbs, 256});
  auto y = torch::randn({mbs, 1});
  Clock::duration boundary{};
  auto one_step = [&] {
    for (int64_t m = 0; m < gas; ++m) {
      const auto start = Clock::now();
      engine.backward(torch::mse_loss(model->forward(x), y));
      engine.step();
      if (m + 1 == gas) boundary += Clock::now() - start;
    }
  };
  one_step();  // warm-up (Gloo connects lazily, allocators)
  boundary = {};
  const auto& reducer = engine.gradient_reducer();
  const auto reduce_before = reducer.all_reduce_time();
  const auto* bucketed = dynamic_cast<const stepwise::distributed::BucketedReducer*>(&reducer);
  const int64_t overlapped_before = bucketed ? bucketed->overlapped_calls() : 0;
  const auto start = Clock::now();
  for (int64_t s = 0; s < steps; ++s) one_step();
  const double step_ms = Ms(Clock::now() - start).count() / steps;
  if (overlap) {
    r.reducer_ms = Ms(reducer.all_reduce_time() - reduce_before).count() / steps;
    r.overlapped = bucketed ? (bucketed->overlapped_calls() - overlapped_before) / steps : 0;
  }
  return {step_ms, Ms(boundary).count() / steps};
}

Result run(int64_t steps, int64_t bucket) {
  torch::set_num_threads(1);
  Result r;
  std::tie(r.step_ms_serial, r.boundary_ms_serial) = train(steps, bucket, false, r);
  std::tie(r.step_ms, r.boundary_ms) = train(steps, bucket, true, r);
  auto model = make_model();
  std::vector<torch::Tensor> params = model->parameters();
  for (const auto& p : params) r.elements += p.numel();
  r.buckets = stepwise::distributed::BucketedReducer(nullptr, bucket).num_buckets(params);
  if (auto context = stepwise::distributed::default_context()) {
    // The reducer alone: gradients already in its buckets (attached), summed in place.
    for (auto& p : params) p.mutable_grad() = torch::ones_like(p);
    stepwise::distributed::BucketedReducer reducer(context, bucket);
    reducer.attach(params);
    reducer.reduce(params);
    context->barrier("before the isolated reducer");
    const auto reducer_start = Clock::now();
    for (int64_t s = 0; s < steps; ++s) reducer.reduce(params);
    r.isolated_ms = Ms(Clock::now() - reducer_start).count() / steps;
    auto flat = torch::ones({r.elements});
    context->all_reduce_sum(flat, "warm-up");
    context->barrier("before the flat all-reduce");
    const auto flat_start = Clock::now();
    for (int64_t s = 0; s < steps; ++s) context->all_reduce_sum(flat, "the flat buffer");
    r.flat_ms = Ms(Clock::now() - flat_start).count() / steps;
  }
  stepwise::distributed::shutdown();
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t steps = 20;
  int64_t bucket = 262144;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--steps") steps = std::stoll(argv[i + 1]);
    if (flag == "--bucket") bucket = std::stoll(argv[i + 1]);
  }
  // W = 2: two forked ranks; rank 0 writes its figures to a pipe.
  int fds[2];
  if (pipe(fds) != 0) return 1;
  const std::string port = std::to_string(free_port());
  pid_t pids[2];
  for (int r = 0; r < 2; ++r) {
    pids[r] = fork();
    if (pids[r] == 0) {
      setenv("RANK", std::to_string(r).c_str(), 1);
      setenv("WORLD_SIZE", "2", 1);
      setenv("MASTER_ADDR", "127.0.0.1", 1);
      setenv("MASTER_PORT", port.c_str(), 1);
      Result res = run(steps, bucket);
      if (r == 0 && write(fds[1], &res, sizeof(res)) != sizeof(res)) _exit(1);
      _exit(0);
    }
  }
  close(fds[1]);
  Result w2;
  const bool got = read(fds[0], &w2, sizeof(w2)) == sizeof(w2);
  for (pid_t pid : pids) waitpid(pid, nullptr, 0);
  if (!got) {
    std::cerr << "the W = 2 run failed\n";
    return 1;
  }
  const Result w1 = run(steps, bucket);
  std::printf("machine: %u hardware threads; W=2 runs 2 processes on them\n",
              std::thread::hardware_concurrency());
  std::printf("model: %lld parameters (%.1f MB fp32), bucket %lld elements -> %lld buckets\n",
              static_cast<long long>(w2.elements), w2.elements * 4 / 1e6,
              static_cast<long long>(bucket), static_cast<long long>(w2.buckets));
  std::printf(
      "all-reduce per step, W=2: reducer (gradients as bucket views) %.3f ms, one flat c10d "
      "all-reduce of the same bytes %.3f ms, ratio %.2f\n",
      w2.isolated_ms, w2.flat_ms, w2.isolated_ms / w2.flat_ms);
  std::printf(
      "  (inside training: %lld of %lld all-reduces a step start during backward; the reducer "
      "waits %.3f ms a step, rank skew included)\n",
      static_cast<long long>(w2.overlapped), static_cast<long long>(w2.buckets), w2.reducer_ms);
  std::printf(
      "boundary micro-step (backward + step), W=2: overlapped %.3f ms, all-reduce in step() "
      "%.3f ms, ratio %.2f\n",
      w2.boundary_ms, w2.boundary_ms_serial, w2.boundary_ms / w2.boundary_ms_serial);
  std::printf(
      "step time (GAS 2, mbs 32 per rank): W=1 %.3f ms, W=2 %.3f ms, ratio W2/W1 %.2f "
      "(1.0 = perfect weak scaling)\n",
      w1.step_ms, w2.step_ms, w2.step_ms / w1.step_ms);
}
