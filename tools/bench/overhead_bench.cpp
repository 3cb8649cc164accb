// Engine overhead: the same training through stepwise and as the equivalent
// hand-written LibTorch loop, alternating in one process; prints the median
// time ratio (stepwise / hand-written) per MLP width, and the cost of the
// leftover-call guard rails (stepwise with them / without them). Not a test.
//
//   overhead_bench [--reps N] [--steps N]
#include <stepwise/stepwise.h>

#include <benchmark/benchmark.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

namespace {

constexpr int64_t kMicroBatch = 16;
constexpr int64_t kGas = 4;
constexpr double kLr = 1e-3;
constexpr double kClip = 1.0;
constexpr int64_t kWarmup = 100;

torch::nn::Sequential make_mlp(int64_t width) {
  torch::manual_seed(0);
  return torch::nn::Sequential(torch::nn::Linear(width, width), torch::nn::ReLU(),
                               torch::nn::Linear(width, width), torch::nn::ReLU(),
                               torch::nn::Linear(width, 1));
}

std::string config_json(bool guard_rails) {
  const char* off = guard_rails ? "" : R"("stepwise": {"check_grads_cleared": false,
      "check_grads_changed": false, "check_params_changed": false}, )";
  return c10::str("{", off, R"("train_micro_batch_size_per_gpu": )", kMicroBatch,
                  R"(, "gradient_accumulation_steps": )", kGas, R"(, "gradient_clipping": )", kClip,
                  R"(, "steps_per_print": 1000000000,
      "optimizer": {"type": "AdamW", "params": {"lr": )",
                  kLr, R"(}},
      "scheduler": {"type": "WarmupLR", "params": {"warmup_max_lr": )",
                  kLr, R"(, "warmup_num_steps": )", kWarmup, R"(}}})");
}

using Clock = std::chrono::steady_clock;

double run_stepwise(int64_t width, int64_t steps, const torch::Tensor& x, const torch::Tensor& y,
                    bool guard_rails = true) {
  auto model = make_mlp(width);
  auto engine =
      stepwise::initialize(model, stepwise::Config::from_string(config_json(guard_rails)));
  const auto start = Clock::now();
  for (int64_t t = 0; t < steps * kGas; ++t) {
    auto xb = x.slice(0, (t % 8) * kMicroBatch, (t % 8 + 1) * kMicroBatch);
    auto yb = y.slice(0, (t % 8) * kMicroBatch, (t % 8 + 1) * kMicroBatch);
    auto loss = torch::mse_loss(model->forward(xb), yb);
    benchmark::DoNotOptimize(engine.backward(loss));
    engine.step();
  }
  return std::chrono::duration<double>(Clock::now() - start).count();
}

double run_by_hand(int64_t width, int64_t steps, const torch::Tensor& x, const torch::Tensor& y) {
  auto model = make_mlp(width);
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
  for (int64_t t = 0; t < steps * kGas; ++t) {
    auto xb = x.slice(0, (t % 8) * kMicroBatch, (t % 8 + 1) * kMicroBatch);
    auto yb = y.slice(0, (t % 8) * kMicroBatch, (t % 8 + 1) * kMicroBatch);
    auto loss = torch::mse_loss(model->forward(xb), yb) / static_cast<double>(kGas);
    loss.backward();
    benchmark::DoNotOptimize(loss.detach());
    if ((t + 1) % kGas == 0) {
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

}  // namespace

int main(int argc, char** argv) {
  int64_t reps = 15, steps = 50;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string arg = argv[i];
    if (arg == "--reps")
      reps = std::stoll(argv[i + 1]);
    else if (arg == "--steps")
      steps = std::stoll(argv[i + 1]);
  }
  std::printf(
      "overhead: stepwise vs hand-written LibTorch loop; micro-batch %lld, GAS %lld, "
      "AdamW, clipping, WarmupLR; %lld reps x %lld optimizer steps, alternating\n",
      (long long)kMicroBatch, (long long)kGas, (long long)reps, (long long)steps);
  for (int64_t width : {64, 512}) {
    auto x = torch::randn({8 * kMicroBatch, width});
    auto y = torch::randn({8 * kMicroBatch, 1});
    run_stepwise(width, 5, x, y);  // warm-up both paths
    run_by_hand(width, 5, x, y);
    std::vector<double> ratios, sw, hand, rails;
    for (int64_t r = 0; r < reps; ++r) {
      // Alternate which goes first, so drift affects both sides alike.
      double a, b;
      if (r % 2 == 0) {
        a = run_stepwise(width, steps, x, y);
        b = run_by_hand(width, steps, x, y);
      } else {
        b = run_by_hand(width, steps, x, y);
        a = run_stepwise(width, steps, x, y);
      }
      sw.push_back(a);
      hand.push_back(b);
      ratios.push_back(a / b);
      rails.push_back(a / run_stepwise(width, steps, x, y, /*guard_rails=*/false));
    }
    std::printf(
        "width %4lld: stepwise %.3f ms/step, hand-written %.3f ms/step, median ratio "
        "%.3fx; guard rails on / off %.3fx\n",
        (long long)width, 1e3 * median(sw) / steps, 1e3 * median(hand) / steps, median(ratios),
        median(rails));
  }
  return 0;
}
