// stepwise: the CUDA multi-tensor kernels, as a raw-pointer host API.
//
// What src/cuda/fused_cuda.cpp does for stepwise::fused on CUDA tensors:
//
// Usage {.cpp .no-compile reason="device memory and a stream (tests/cuda/)"}:
//
//   using namespace stepwise::cuda;
//   std::vector<TensorView> grads = {{g0_ptr, g0_numel, DType::kFloat16}, ...};
//   unscale_and_check(grads.data(), grads.size(), 1.0f / S, found_inf_dev, stream);
//   global_norm(grads.data(), grads.size(), workspace_dev, norm_dev, stream);
//   adamw(lists, count, hyper, found_inf_dev, stream);  // a no-op on device if *found_inf
//
// Every pointer is device memory; every call only enqueues work on `stream` (a
// cudaStream_t passed as void*; null is the legacy default stream) and never
// synchronizes with the host. Tensors are contiguous, of any size (0 and odd sizes
// included) and any alignment: 16-byte aligned tensors take a vectorized path.
// This header includes no CUDA header, so code built without CUDA can include it;
// the definitions live in src/cuda/*.cu (library stepwise_cuda_kernels).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace stepwise {
namespace cuda {

/// Element type of a tensor the kernels read or write.
enum class DType : int { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };

/// One contiguous device tensor: its first element, its element count and type.
struct TensorView {
  /// Device address of element 0 (may be null when numel == 0).
  void* data = nullptr;
  /// Number of elements (>= 0).
  int64_t numel = 0;
  /// Element type.
  DType dtype = DType::kFloat32;
};

/// Elements one thread block handles per launch slot (a chunk); tensors longer than
/// this span several chunks, and lists longer than a launch's metadata span launches.
constexpr int64_t kChunkSize = 65536;

/// Whether a CUDA device is usable from this process; if not and `why` is given, the
/// CUDA runtime's reason ("no CUDA-capable device is detected", ...).
bool device_available(std::string* why = nullptr);

/// Throws std::runtime_error naming `what` and the CUDA error if the last launch failed.
void check_launch(const char* what);

/// (a) Multiplies every element of every tensor by `inv_scale`, in place, and sets
/// `*found_inf` (a device float) to 1.0f if any element was inf or nan before scaling.
/// Never clears `*found_inf`: zero it before the first call of a step.
void unscale_and_check(const TensorView* tensors, size_t count, float inv_scale, float* found_inf,
                       void* stream);

/// Floats of device workspace global_norm() needs for these tensors (one per chunk).
int64_t global_norm_workspace(const TensorView* tensors, size_t count);

/// (b) The L2 norm over all elements of all tensors, accumulated in fp32, written to
/// `*out_norm` (a device float). Deterministic: per-chunk partial sums of squares go
/// to `workspace` (global_norm_workspace() floats), then one block reduces them in a
/// fixed order. An inf or nan element makes the norm inf or nan. Empty lists give 0.
void global_norm(const TensorView* tensors, size_t count, float* workspace, float* out_norm,
                 void* stream);

/// Hyper-parameters of one Adam/AdamW step (the formulas of torch::optim::Adam/AdamW).
struct AdamHyper {
  /// Learning rate.
  float lr = 1e-3f;
  /// First-moment decay.
  float beta1 = 0.9f;
  /// Second-moment decay.
  float beta2 = 0.999f;
  /// Added to the denominator.
  float eps = 1e-8f;
  /// Weight decay: decoupled (p *= 1 - lr * wd) when `decoupled`, else added to the
  /// gradient (g += wd * p) as torch::optim::Adam does.
  float weight_decay = 0.0f;
  /// AdamW (true) or Adam with L2 weight decay (false).
  bool decoupled = true;
  /// The step number after this update (1 on the first); gives the bias corrections.
  int64_t step = 1;
  /// Divide the moments by 1 - beta^step (true), or use them as they are (false, as
  /// DeepSpeed's FusedAdam with bias_correction false).
  bool bias_correction = true;
  /// Every gradient element is multiplied by this before use (1/S fuses the unscale).
  float grad_scale = 1.0f;
};

/// The tensor lists of one fused Adam/AdamW update; all of length `count`, and
/// element i of each list has the same numel.
struct AdamLists {
  /// fp32 master weights, updated in place.
  const TensorView* params = nullptr;
  /// Gradients: fp32, fp16 or bf16. Read only.
  const TensorView* grads = nullptr;
  /// fp32 first moments, updated in place.
  const TensorView* exp_avg = nullptr;
  /// fp32 second moments, updated in place.
  const TensorView* exp_avg_sq = nullptr;
  /// Optional (null): model copies (fp32, fp16 or bf16) that receive the new weights,
  /// rounded to their type, in the same pass.
  const TensorView* model_copies = nullptr;
};

/// (c) One fused Adam/AdamW step over all tensors. If `found_inf` is not null and
/// `*found_inf != 0` on the device, every block returns before touching memory: the
/// skip is decided on the device, with no host sync.
void adamw(const AdamLists& lists, size_t count, const AdamHyper& hyper, const float* found_inf,
           void* stream);

}  // namespace cuda
}  // namespace stepwise
