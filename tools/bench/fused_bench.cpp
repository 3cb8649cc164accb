// Fused AdamW(+unscale) throughput, as ratios against baselines measured in the same run:
//   1. stepwise::fused::adamw_step over a transformer-like list of tensors: fp32
//      masters and moments, fp16 gradients unscaled inside the update (grad_scale),
//      fp16 model copies written in the same pass: 28 bytes moved per element;
//   2. a device copy of one tensor (bytes read + written per second): the bandwidth
//      ceiling; the ratio fused / copy is the goal (>= 0.85 on a GPU);
//   3. LibTorch's per-tensor ops doing the same job: unscale to fp32 grads,
//      torch::optim::AdamW, copy to the model: the speed-up of fusing;
//   4. LibTorch's own fused Adam (at::_fused_adamw_, or at::_fused_adam_ with weight
//      decay 0 where only that exists), fp32 gradients, no model copy: time ratio.
//
//   fused_bench [--device cuda|cpu] [--melems N] [--reps R]
#include "fused.h"

#include <torch/cuda.h>
#include <torch/torch.h>

#if __has_include(<ATen/ops/_fused_adamw.h>)
#include <ATen/ops/_fused_adamw.h>
#define STEPWISE_BENCH_FUSED_OP at::_fused_adamw_
#define STEPWISE_BENCH_FUSED_NAME "at::_fused_adamw_"
#else
#include <ATen/ops/_fused_adam.h>
#define STEPWISE_BENCH_FUSED_OP at::_fused_adam_  // weight decay 0 below: same as AdamW
#define STEPWISE_BENCH_FUSED_NAME "at::_fused_adam_"
#endif

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  double melems = -1;  // millions of parameter elements; default by device
  int reps = 20;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const bool has_value = i + 1 < argc;
    if (arg == "--device" && has_value) {
      o.device = torch::Device(argv[++i]);
    } else if (arg == "--melems" && has_value) {
      o.melems = std::atof(argv[++i]);
    } else if (arg == "--reps" && has_value) {
      o.reps = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr,
                   "usage: fused_bench [--device cuda|cpu] [--melems N] [--reps R]\n"
                   "unknown or incomplete argument: %s\n",
                   arg.c_str());
      std::exit(2);
    }
  }
  if (o.melems <= 0) o.melems = o.device.is_cuda() ? 256 : 4;
  if (o.reps < 1) o.reps = 1;
  return o;
}

void sync(const torch::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize();
}

// Median seconds of `reps` runs of `f`, after two warm-up runs.
double time_median(const torch::Device& device, int reps, const std::function<void()>& f) {
  f();
  f();
  sync(device);
  std::vector<double> seconds;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
    f();
    sync(device);
    seconds.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  std::sort(seconds.begin(), seconds.end());
  return seconds[seconds.size() / 2];
}

// Tensor sizes like a transformer's: per layer four d*d and two d*4d matrices plus
// small vectors, layers added until the total reaches `total` elements.
std::vector<int64_t> model_sizes(int64_t total) {
  const int64_t d = total >= 64'000'000 ? 2048 : 256;
  std::vector<int64_t> sizes;
  int64_t sum = 0;
  while (sum < total) {
    for (int64_t n : {d * d, d * d, d * d, d * d, 4 * d * d, 4 * d * d, d, d, 4 * d, d, d, d}) {
      sizes.push_back(n);
      sum += n;
    }
  }
  sizes.push_back(1001);  // an odd tail: alignment
  return sizes;
}

}  // namespace

int run(const Options& o);

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  try {
    return run(o);
  } catch (const std::exception& e) {
    const std::string what = e.what();
    std::fprintf(stderr, "fused_bench: %s\n", what.substr(0, what.find('\n')).c_str());
    return 1;
  }
}

int run(const Options& o) {
  torch::NoGradGuard no_grad;
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat).device(o.device);
  const auto sizes = model_sizes(static_cast<int64_t>(o.melems * 1e6));
  int64_t elems = 0;
  stepwise::fused::AdamWTensors t;
  std::vector<torch::Tensor> grads32;
  for (int64_t n : sizes) {
    elems += n;
    t.params.push_back(torch::randn({n}, f32));
    t.grads.push_back(torch::randn({n}, f32).mul_(1024).to(torch::kHalf));
    t.exp_avg.push_back(torch::zeros({n}, f32));
    t.exp_avg_sq.push_back(torch::zeros({n}, f32));
    t.model_copies.push_back(t.params.back().to(torch::kHalf));
    grads32.push_back(t.grads.back().to(torch::kFloat));
  }
  std::printf("fused_bench: %s, %zu tensors, %.1f M elements, median of %d\n",
              o.device.str().c_str(), sizes.size(), elems / 1e6, o.reps);

  // 1. stepwise fused: 4+4 p, 2 g, 4+4 m, 4+4 v, 2 copy = 28 bytes an element.
  int64_t step = 0;
  const double fused_s = time_median(o.device, o.reps, [&] {
    stepwise::fused::adamw_step(t, stepwise::fused::AdamWStep()
                                       .lr(1e-4)
                                       .weight_decay(0.01)
                                       .grad_scale(1.0 / 1024)
                                       .step(++step));
  });
  const double fused_bytes = 28.0 * elems;

  // 2. Copy bandwidth: one tensor of the same bytes as the fused step moves (read + write).
  auto src = torch::randn({static_cast<int64_t>(fused_bytes / 8)}, f32);
  auto dst = torch::empty_like(src);
  const double copy_s = time_median(o.device, o.reps, [&] { dst.copy_(src); });
  const double copy_bytes = 2.0 * src.numel() * 4;

  // 3. LibTorch's per-tensor ops for the same job.
  std::vector<torch::Tensor> params;
  for (const auto& p : t.params) params.push_back(p.clone());
  torch::optim::AdamW per_tensor(params, torch::optim::AdamWOptions(1e-4).weight_decay(0.01));
  const double per_tensor_s = time_median(o.device, o.reps, [&] {
    for (size_t i = 0; i < params.size(); ++i) {
      params[i].mutable_grad() = t.grads[i].to(torch::kFloat).mul_(1.0 / 1024);
    }
    per_tensor.step();
    for (size_t i = 0; i < params.size(); ++i) t.model_copies[i].copy_(params[i]);
  });

  // 4. LibTorch's fused Adam (fp32 grads, no model copy: 28 bytes an element as well).
  double torch_fused_s = -1;
  std::string torch_fused_note;
  try {
    std::vector<torch::Tensor> steps;
    for (size_t i = 0; i < sizes.size(); ++i) steps.push_back(torch::zeros({}, f32));
    const auto scale = torch::full({}, 1024.0, f32);
    torch_fused_s = time_median(o.device, o.reps, [&] {
      STEPWISE_BENCH_FUSED_OP(t.params, grads32, t.exp_avg, t.exp_avg_sq, {}, steps, 1e-4, 0.9,
                              0.999, 0.0, 1e-8, false, false, scale, c10::nullopt);
    });
  } catch (const std::exception& e) {
    torch_fused_note = std::string(e.what()).substr(0, 120);
  }

  const auto gbs = [](double bytes, double s) { return bytes / s / 1e9; };
  std::printf("  copy (baseline)        %8.3f ms  %8.1f GB/s\n", copy_s * 1e3,
              gbs(copy_bytes, copy_s));
  std::printf("  stepwise fused AdamW   %8.3f ms  %8.1f GB/s  = %.2f of copy bandwidth\n",
              fused_s * 1e3, gbs(fused_bytes, fused_s),
              gbs(fused_bytes, fused_s) / gbs(copy_bytes, copy_s));
  std::printf("  LibTorch per-tensor    %8.3f ms  -> stepwise fused is %.2fx faster\n",
              per_tensor_s * 1e3, per_tensor_s / fused_s);
  if (torch_fused_s > 0) {
    std::printf("  %-22s %8.3f ms  -> stepwise fused takes %.2fx its time\n",
                STEPWISE_BENCH_FUSED_NAME, torch_fused_s * 1e3, fused_s / torch_fused_s);
  } else {
    std::printf("  %-22s not available here: %s\n", STEPWISE_BENCH_FUSED_NAME,
                torch_fused_note.c_str());
  }
  return 0;
}
