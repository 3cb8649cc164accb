// stepwise::fused: argument checks, then the backend the tensors' device picks.
#include "fused.h"
#include <stepwise/errors.h>

#include "check.h"
#include "fused_backends.h"

#include <torch/torch.h>

#include <stdexcept>

namespace stepwise::fused {

namespace {

bool kernel_dtype(torch::ScalarType t) {
  return t == torch::kFloat || t == torch::kHalf || t == torch::kBFloat16;
}

// Every tensor: defined and on the device of the first; for the CUDA kernels also
// contiguous and fp32/fp16/bf16 (the ATen backend takes any layout and float type).
// Returns the backend for that device.
Backend check_list(const char* op, const char* name, const std::vector<torch::Tensor>& list,
                   const torch::Device& device) {
  const Backend backend = backend_for(device);
  for (size_t i = 0; i < list.size(); ++i) {
    const auto& t = list[i];
    STEPWISE_CHECK(t.defined(), std::invalid_argument, "stepwise::fused::", op, ": ", name, "[", i,
                   "] is an undefined tensor; pass only tensors that exist");
    STEPWISE_CHECK(t.device() == device, std::invalid_argument, "stepwise::fused::", op, ": ", name,
                   "[", i, "] is on ", t.device(), " but the first tensor is on ", device,
                   "; put all tensors of one call on one device");
    STEPWISE_CHECK(t.is_floating_point(), std::invalid_argument, "stepwise::fused::", op, ": ",
                   name, "[", i, "] has dtype ", t.scalar_type(), "; use floating-point tensors");
    if (backend == Backend::kCuda) {
      STEPWISE_CHECK(kernel_dtype(t.scalar_type()), std::invalid_argument, "stepwise::fused::", op,
                     ": ", name, "[", i, "] has dtype ", t.scalar_type(),
                     "; the CUDA kernels take float, half or bfloat16");
      STEPWISE_CHECK(t.is_contiguous(), std::invalid_argument, "stepwise::fused::", op, ": ", name,
                     "[", i, "] is not contiguous; pass t.contiguous()");
    }
  }
  return backend;
}

void check_same_shape(const char* name, const std::vector<torch::Tensor>& list,
                      const std::vector<torch::Tensor>& params, bool fp32_only) {
  STEPWISE_CHECK(list.size() == params.size(), std::invalid_argument,
                 "stepwise::fused::adamw_step: ", name, " has ", list.size(),
                 " tensors but params has ", params.size(), "; pass one per parameter");
  for (size_t i = 0; i < list.size(); ++i) {
    STEPWISE_CHECK(list[i].defined() && list[i].numel() == params[i].numel(), std::invalid_argument,
                   "stepwise::fused::adamw_step: ", name, "[", i, "] has ",
                   list[i].defined() ? list[i].numel() : 0, " elements but params[", i, "] has ",
                   params[i].numel(), "; element i of every list belongs to parameter i");
    STEPWISE_CHECK(!fp32_only || list[i].scalar_type() == torch::kFloat, std::invalid_argument,
                   "stepwise::fused::adamw_step: ", name, "[", i, "] has dtype ",
                   list[i].scalar_type(), "; weights and moments must be float (fp32 masters)");
  }
}

}  // namespace

bool cuda_kernels_built() { return detail::cuda::built(); }

Backend backend_for(const torch::Device& device) {
  if (device.is_cpu()) return Backend::kCpu;
  STEPWISE_CHECK(device.is_cuda(), std::invalid_argument, "stepwise::fused: tensors on ", device,
                 " are not supported; use CPU or CUDA tensors");
  STEPWISE_CHECK(detail::cuda::built(), std::invalid_argument,
                 "stepwise::fused: the tensors are on ", device,
                 ", but stepwise was built without CUDA kernels; configure against a CUDA "
                 "LibTorch (CMAKE_PREFIX_PATH, see docs/cuda.md)");
  return Backend::kCuda;
}

torch::Tensor unscale_and_check(const std::vector<torch::Tensor>& tensors, double inv_scale) {
  if (tensors.empty()) return torch::zeros({}, torch::kFloat);
  const auto backend = check_list("unscale_and_check", "tensors", tensors, tensors[0].device());
  return backend == Backend::kCpu ? detail::cpu::unscale_and_check(tensors, inv_scale)
                                  : detail::cuda::unscale_and_check(tensors, inv_scale);
}

torch::Tensor global_norm(const std::vector<torch::Tensor>& tensors) {
  if (tensors.empty()) return torch::zeros({}, torch::kFloat);
  const auto backend = check_list("global_norm", "tensors", tensors, tensors[0].device());
  return backend == Backend::kCpu ? detail::cpu::global_norm(tensors)
                                  : detail::cuda::global_norm(tensors);
}

void adamw_step(const AdamWTensors& tensors, const AdamWStep& step,
                const torch::Tensor& found_inf) {
  const auto& params = tensors.params;
  if (params.empty()) return;
  STEPWISE_CHECK(step.step() >= 1, std::invalid_argument, "stepwise::fused::adamw_step: step is ",
                 step.step(), "; it counts updates and is 1 on the first");
  const auto device = params[0].device();
  const auto backend = check_list("adamw_step", "params", params, device);
  check_list("adamw_step", "grads", tensors.grads, device);
  check_list("adamw_step", "exp_avg", tensors.exp_avg, device);
  check_list("adamw_step", "exp_avg_sq", tensors.exp_avg_sq, device);
  check_list("adamw_step", "model_copies", tensors.model_copies, device);
  check_same_shape("params", params, params, true);
  check_same_shape("grads", tensors.grads, params, false);
  check_same_shape("exp_avg", tensors.exp_avg, params, true);
  check_same_shape("exp_avg_sq", tensors.exp_avg_sq, params, true);
  if (!tensors.model_copies.empty()) {
    check_same_shape("model_copies", tensors.model_copies, params, false);
  }
  if (found_inf.defined()) {
    STEPWISE_CHECK(found_inf.numel() == 1 && found_inf.scalar_type() == torch::kFloat &&
                       found_inf.device() == device,
                   std::invalid_argument,
                   "stepwise::fused::adamw_step: found_inf must be a one-element float tensor "
                   "on ",
                   device, " (what unscale_and_check returns); got ", found_inf.numel(),
                   " elements of ", found_inf.scalar_type(), " on ", found_inf.device());
  }
  if (backend == Backend::kCpu) {
    detail::cpu::adamw_step(tensors, step, found_inf);
  } else {
    detail::cuda::adamw_step(tensors, step, found_inf);
  }
}

}  // namespace stepwise::fused
