// stepwise::fused on CUDA tensors: LibTorch tensors -> TensorViews -> the kernels of
// src/cuda/kernels.h, on LibTorch's current stream. Nothing here waits
// for the device: flags and norms are returned as device tensors.
#include "kernels.h"

#include "../fused_backends.h"
#include "torch_stream.h"

#include <torch/torch.h>

#include <cmath>

namespace stepwise::fused::detail::cuda {

namespace kernels = stepwise::cuda;

namespace {

kernels::DType dtype_of(const torch::Tensor& t) {
  switch (t.scalar_type()) {
    case torch::kFloat:
      return kernels::DType::kFloat32;
    case torch::kHalf:
      return kernels::DType::kFloat16;
    case torch::kBFloat16:
      return kernels::DType::kBFloat16;
    default:
      break;
  }
  // src/fused.cpp admits only these three; anything else reaching here is our bug.
  TORCH_INTERNAL_ASSERT(false, "fused CUDA op got a ", t.scalar_type(),
                        " tensor: src/fused.cpp should have refused it");
}

std::vector<kernels::TensorView> views(const std::vector<torch::Tensor>& list) {
  std::vector<kernels::TensorView> out;
  out.reserve(list.size());
  for (const auto& t : list) out.push_back({t.data_ptr(), t.numel(), dtype_of(t)});
  return out;
}

}  // namespace

bool built() { return true; }

torch::Tensor unscale_and_check(const std::vector<torch::Tensor>& tensors, double inv_scale) {
  DeviceScope scope(tensors.front().device());
  auto found = torch::zeros({}, tensors.front().options().dtype(torch::kFloat));
  const auto v = views(tensors);
  kernels::unscale_and_check(v.data(), v.size(), static_cast<float>(inv_scale),
                             found.data_ptr<float>(), scope.stream());
  return found;
}

torch::Tensor global_norm(const std::vector<torch::Tensor>& tensors) {
  DeviceScope scope(tensors.front().device());
  const auto v = views(tensors);
  const auto options = tensors.front().options().dtype(torch::kFloat);
  auto workspace = torch::empty({kernels::global_norm_workspace(v.data(), v.size())}, options);
  auto norm = torch::empty({}, options);
  kernels::global_norm(v.data(), v.size(), workspace.data_ptr<float>(), norm.data_ptr<float>(),
                       scope.stream());
  return norm;
}

void adamw_step(const AdamWTensors& tensors, const AdamWStep& step,
                const torch::Tensor& found_inf) {
  DeviceScope scope(tensors.params.front().device());
  const auto params = views(tensors.params);
  const auto grads = views(tensors.grads);
  const auto exp_avg = views(tensors.exp_avg);
  const auto exp_avg_sq = views(tensors.exp_avg_sq);
  const auto copies = views(tensors.model_copies);
  kernels::AdamLists lists;
  lists.params = params.data();
  lists.grads = grads.data();
  lists.exp_avg = exp_avg.data();
  lists.exp_avg_sq = exp_avg_sq.data();
  lists.model_copies = copies.empty() ? nullptr : copies.data();
  kernels::AdamHyper hyper;
  hyper.lr = static_cast<float>(step.lr());
  hyper.beta1 = static_cast<float>(step.beta1());
  hyper.beta2 = static_cast<float>(step.beta2());
  hyper.eps = static_cast<float>(step.eps());
  hyper.weight_decay = static_cast<float>(step.weight_decay());
  hyper.decoupled = step.decoupled();
  hyper.step = step.step();
  hyper.bias_correction = step.bias_correction();
  hyper.grad_scale = static_cast<float>(step.grad_scale());
  kernels::adamw(lists, params.size(), hyper,
                 found_inf.defined() ? found_inf.data_ptr<float>() : nullptr, scope.stream());
}

}  // namespace stepwise::fused::detail::cuda
