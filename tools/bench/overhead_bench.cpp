// Engine overhead: the same training through stepwise and as the equivalent
// hand-written LibTorch loop, alternating in one process; prints the median
// time ratio (stepwise / hand-written) per MLP width, and the cost of the
// leftover-call guard rails (stepwise with them / without them). Then the same ratio
// over a tensor-count sweep: a deep, narrow model (DEPTH x (Linear 16->16 + LayerNorm)),
// AdamW, clipping, GAS 2, guard rails on, with 32, 256 and 1024 parameter tensors: the
// engine's per-tensor cost. Not a test.
//
//   overhead_bench [--reps N] [--steps N] [--sweep-only]
#include <stepwise/stepwise.h>

#include <benchmark/benchmark.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

namespace {

constexpr int64_t kMicroBatch = 16;
constexpr double kLr = 1e-3;
constexpr double kClip = 1.0;
constexpr int64_t kWarmup = 100;

// What one comparison trains: a model, its input width and the GAS.
struct Setup {
  std::function<torch::nn::Sequential()> make;
  int64_t in;
  int64_t gas;
};

Setup mlp(int64_t width) {
  return {[width] {
            torch::manual_seed(0);
            return torch::nn::Sequential(torch::nn::Linear(width, width), torch::nn::ReLU(),
                                         torch::nn::Linear(width, width), torch::nn::ReLU(),
                                         torch::nn::Linear(width, 1));
          },
          width, 4};
}

// 4 parameter tensors a layer (the Linear's weight and bias, the LayerNorm's).
Setup deep_narrow(int64_t tensors) {
  return {[tensors] {
            torch::manual_seed(0);
            torch::nn::Sequential model;
            for (int64_t d = 0; d < tensors / 4; ++d) {
              model->push_back(torch::nn::Linear(16, 16));
              model->push_back(torch::nn::LayerNorm(torch::nn::LayerNormOptions({16})));
            }
            return model;
          },
          16, 2};
}

std::string config_json(int64_t gas, bool guard_rails) {
  const char* off = guard_rails ? "" : R"("stepwise": {"check_grads_cleared": false,
      "check_grads_changed": false, "check_params_changed": false}, )";
  return c10::str("{", off, R"("train_micro_batch_size_per_gpu": )", kMicroBatch,
                  R"(, "gradient_accumulation_steps": )", gas, R"(, "gradient_clipping": )", kClip,
                  R"(, "steps_per_print": 1000000000,
      "optimizer": {"type": "AdamW", "params": {"lr": )",
                  kLr, R"(}},
      "scheduler": {"type": "WarmupLR", "params": {"warmup_max_lr": )",
                  kLr, R"(, "warmup_num_steps": )", kWarmup, R"(}}})");
}

using Clock = std::chrono::steady_clock;

// The loss of a micro-batch: a deep, narrow model's output is as wide as its input.
torch::Tensor loss_of(torch::nn::Sequential& model, const torch::Tensor& x,
                      const torch::Tensor& y) {
  auto out = model->forward(x);
  return torch::mse_loss(out.size(1) == 1 ? out : out.mean(1, /*keepdim=*/true), y);
}

double run_stepwise(const Setup& setup, int64_t steps, const torch::Tensor& x,
                    const torch::Tensor& y, bool guard_rails = true) {
  auto model = setup.make();
  auto engine = stepwise::initialize(
      model, stepwise::Config::from_string(config_json(setup.gas, guard_rails)));
  const auto start = Clock::now();
  for (int64_t t = 0; t < steps * setup.gas; ++t) {
    auto xb = x.slice(0, (t % 8) * kMicroBatch, (t % 8 + 1) * kMicroBatch);
    auto yb = y.slice(0, (t % 8) * kMicroBatch, (t % 8 + 1) * kMicroBatch);
    benchmark::DoNotOptimize(engine.backward(loss_of(model, xb, yb)));
    engine.step();
  }
  return std::chrono::duration<double>(Clock::now() - start).count();
}

double run_by_hand(const Setup& setup, int64_t steps, const torch::Tensor& x,
                   const torch::Tensor& y) {
  auto model = setup.make();
  torch::optim::AdamW optimizer(model->parameters(),
                                torch::optim::AdamWOptions(kLr).weight_decay(0.0));
  auto set_lr = [&](int64_t lbi) {  // WarmupLR, log warmup from 0 to kLr
    const double gamma =
        lbi >= kWarmup ? 1.0 : std::log(static_cast<double>(lbi + 1)) / std::log(double(kWarmup));
    for (auto& g : optimizer.param_groups()) g.options().set_lr(kLr * gamma);
  };
  set_lr(0);
  int64_t applied = 0;
  const auto start = Clock::now();
  for (int64_t t = 0; t < steps * setup.gas; ++t) {
    auto xb = x.slice(0, (t % 8) * kMicroBatch, (t % 8 + 1) * kMicroBatch);
    auto yb = y.slice(0, (t % 8) * kMicroBatch, (t % 8 + 1) * kMicroBatch);
    auto loss = loss_of(model, xb, yb) / static_cast<double>(setup.gas);
    loss.backward();
    benchmark::DoNotOptimize(loss.detach());
    if ((t + 1) % setup.gas == 0) {
      torch::nn::utils::clip_grad_norm_(model->parameters(), kClip);
      optimizer.step();
      optimizer.zero_grad();
      set_lr(++applied);
    }
  }
  return std::chrono::duration<double>(Clock::now() - start).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

struct Result {
  double stepwise_ms, hand_ms, ratio, rails;
};

// Alternates the two (and which goes first), so drift affects both sides alike.
Result compare(const Setup& setup, int64_t reps, int64_t steps, bool rails) {
  auto x = torch::randn({8 * kMicroBatch, setup.in});
  auto y = torch::randn({8 * kMicroBatch, 1});
  run_stepwise(setup, 5, x, y);  // warm-up both paths
  run_by_hand(setup, 5, x, y);
  std::vector<double> ratios, sw, hand, off;
  for (int64_t r = 0; r < reps; ++r) {
    double a, b;
    if (r % 2 == 0) {
      a = run_stepwise(setup, steps, x, y);
      b = run_by_hand(setup, steps, x, y);
    } else {
      b = run_by_hand(setup, steps, x, y);
      a = run_stepwise(setup, steps, x, y);
    }
    sw.push_back(a);
    hand.push_back(b);
    ratios.push_back(a / b);
    if (rails) off.push_back(a / run_stepwise(setup, steps, x, y, /*guard_rails=*/false));
  }
  return {1e3 * median(sw) / steps, 1e3 * median(hand) / steps, median(ratios),
          rails ? median(off) : 0.0};
}

}  // namespace

int main(int argc, char** argv) {
  int64_t reps = 15, steps = 50;
  bool sweep_only = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--sweep-only") sweep_only = true;
    if (i + 1 < argc && arg == "--reps") reps = std::stoll(argv[i + 1]);
    if (i + 1 < argc && arg == "--steps") steps = std::stoll(argv[i + 1]);
  }
  std::printf(
      "overhead: stepwise vs hand-written LibTorch loop; micro-batch %lld, AdamW, clipping, "
      "WarmupLR; %lld reps x %lld optimizer steps, alternating\n",
      (long long)kMicroBatch, (long long)reps, (long long)steps);
  if (!sweep_only) {
    for (int64_t width : {64, 512}) {
      const Result r = compare(mlp(width), reps, steps, /*rails=*/true);
      std::printf(
          "MLP width %4lld, GAS 4: stepwise %.3f ms/step, hand-written %.3f ms/step, median "
          "ratio %.3fx; guard rails on / off %.3fx\n",
          (long long)width, r.stepwise_ms, r.hand_ms, r.ratio, r.rails);
    }
  }
  for (int64_t tensors : {32, 256, 1024}) {
    const Result r = compare(deep_narrow(tensors), reps, steps, /*rails=*/true);
    std::printf(
        "deep narrow, %4lld tensors, GAS 2: stepwise %.3f ms/step, hand-written %.3f ms/step, "
        "median ratio %.3fx; guard rails on / off %.3fx\n",
        (long long)tensors, r.stepwise_ms, r.hand_ms, r.ratio, r.rails);
  }
  return 0;
}
