// The plumbing shared by the multi-tensor kernels: host-side argument checks, a
// planner that packs a list of tensors into as few launches as the kernel-parameter
// budget allows, the block -> (tensor, chunk) lookup, and fp16/bf16 load/store helpers.
//
// NOTE: [multi-tensor apply] a model has hundreds of parameters, most of them small:
// one launch per parameter would cost more in launch overhead than the arithmetic, so
// each op takes whole lists of tensors and covers them in as few launches as the
// kernel-parameter budget allows (the scheme of apex's multi_tensor_apply).
//
// One block handles one chunk of kChunkSize elements of one tensor. A launch's
// metadata (TensorListMeta) holds up to kMaxTensors tensors; tensor slot s owns the
// consecutive blocks [first_block[s], first_block[s + 1]) and its first one handles
// chunk first_chunk[s] of the tensor, so a tensor cut by a full launch continues in
// the next launch with a non-zero first_chunk. Blocks are numbered in list order, so
// chunk_offset + blockIdx.x is the chunk's index over the whole list (global_norm's
// workspace slot). Per-element code is __host__ __device__ where it can be, so the
// same functor can be exercised on the host.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "kernels.h"

// `#pragma unroll` for the device pass only: the host compiler warns about it
// (-Wunknown-pragmas) in __host__ __device__ code.
#ifdef __CUDA_ARCH__
#define STEPWISE_UNROLL _Pragma("unroll")
#else
#define STEPWISE_UNROLL
#endif

namespace stepwise::cuda::detail {

constexpr int kBlockSize = 512;
// Bounds one launch (2048 chunks = 128 Mi elements): large enough that launch
// overhead and the last wave's tail are negligible, small enough that int32 block
// indices never overflow.
constexpr int64_t kMaxBlocksPerLaunch = 2048;
// Kernel parameters are limited to 4 KB on every architecture we might meet; the
// functor gets kFunctorBudget of it, the metadata the rest.
constexpr size_t kParamLimit = 4096;
constexpr size_t kFunctorBudget = 256;

constexpr int max_tensors_for_depth(int depth) {
  // Per tensor: depth addresses + depth dtype bytes + numel + first_chunk + first_block.
  return static_cast<int>((kParamLimit - kFunctorBudget - 64) / (9 * depth + 20));
}

template <int kDepthArg>
struct TensorListMeta {
  static constexpr int kDepth = kDepthArg;
  static constexpr int kMaxTensors = max_tensors_for_depth(kDepthArg);
  void* addresses[kDepth][kMaxTensors];
  int64_t numel[kMaxTensors];
  int64_t first_chunk[kMaxTensors];
  int32_t first_block[kMaxTensors];
  uint8_t dtypes[kDepth][kMaxTensors];
  int32_t num_tensors;
  int64_t chunk_offset;
};

/// The piece of work of one block.
struct ChunkRef {
  int tensor;      // slot in the launch's metadata
  int64_t start;   // first element of the chunk inside the tensor
  int64_t length;  // elements in the chunk, 1..kChunkSize
};

template <int kDepth>
__host__ __device__ inline ChunkRef locate_chunk(const TensorListMeta<kDepth>& meta, int block) {
  // Largest slot whose first block is <= block; first_block[0] == 0 and the values
  // strictly increase (every slot owns at least one block), so the search is exact.
  int lo = 0;
  int hi = meta.num_tensors - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (meta.first_block[mid] <= block) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  const int64_t chunk = meta.first_chunk[lo] + (block - meta.first_block[lo]);
  ChunkRef ref;
  ref.tensor = lo;
  ref.start = chunk * kChunkSize;
  const int64_t rest = meta.numel[lo] - ref.start;
  ref.length = rest < kChunkSize ? rest : kChunkSize;
  return ref;
}

// ---- element conversions (all arithmetic is fp32) ----

template <typename T>
__host__ __device__ inline float to_float(T x);
template <>
__host__ __device__ inline float to_float<float>(float x) {
  return x;
}
template <>
__host__ __device__ inline float to_float<__half>(__half x) {
  return __half2float(x);
}
template <>
__host__ __device__ inline float to_float<__nv_bfloat16>(__nv_bfloat16 x) {
  return __bfloat162float(x);
}

// Round to nearest even, as torch's .to(kHalf/kBFloat16) does.
template <typename T>
__host__ __device__ inline T from_float(float x);
template <>
__host__ __device__ inline float from_float<float>(float x) {
  return x;
}
template <>
__host__ __device__ inline __half from_float<__half>(float x) {
  return __float2half_rn(x);
}
template <>
__host__ __device__ inline __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

__host__ __device__ inline bool is_finite(float x) { return fabsf(x) <= 3.402823466e+38f; }

__host__ __device__ inline bool is_aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15u) == 0;
}

// kN elements moved by one load/store instruction (16 bytes for 4 floats or 8 halves).
template <typename T, int kN>
struct alignas(sizeof(T) * kN) Pack {
  T v[kN];
};

template <int kN, typename T>
__host__ __device__ inline void load_pack(const T* p, float (&out)[kN]) {
  const Pack<T, kN> pack = *reinterpret_cast<const Pack<T, kN>*>(p);
  STEPWISE_UNROLL
  for (int i = 0; i < kN; ++i) out[i] = to_float(pack.v[i]);
}

template <int kN, typename T>
__host__ __device__ inline void store_pack(T* p, const float (&in)[kN]) {
  Pack<T, kN> pack;
  STEPWISE_UNROLL
  for (int i = 0; i < kN; ++i) pack.v[i] = from_float<T>(in[i]);
  *reinterpret_cast<Pack<T, kN>*>(p) = pack;
}

// ---- host side ----

inline void throw_bad(const char* what, const std::string& detail) {
  throw std::runtime_error(std::string("stepwise::cuda::") + what + ": " + detail);
}

/// Checks one list before anything is enqueued, so a bad call leaves memory untouched.
inline void validate_list(const char* what, const char* list, const TensorView* views,
                          size_t count) {
  if (count > 0 && views == nullptr) {
    throw_bad(what, std::string(list) + " is null with count " + std::to_string(count));
  }
  for (size_t i = 0; i < count; ++i) {
    const TensorView& v = views[i];
    const std::string where = std::string(list) + "[" + std::to_string(i) + "]";
    if (v.numel < 0) throw_bad(what, where + " has negative numel " + std::to_string(v.numel));
    const int dtype = static_cast<int>(v.dtype);
    if (dtype < 0 || dtype > 2)
      throw_bad(what, where + " has unknown dtype " + std::to_string(dtype));
    if (v.numel > 0 && v.data == nullptr) {
      throw_bad(what, where + " has null data with numel " + std::to_string(v.numel));
    }
  }
}

/// Number of chunks (blocks) a tensor of `numel` elements needs.
inline int64_t chunks_of(int64_t numel) { return (numel + kChunkSize - 1) / kChunkSize; }

/// Packs lists[0..kDepth)[0..count) into metadata and calls launch(meta, blocks) each time
/// it fills up and once at the end. Element i of every list has lists[0][i].numel
/// elements (checked by the caller); empty tensors are skipped.
template <int kDepth, typename Launch>
void for_each_launch(const TensorView* const (&lists)[kDepth], size_t count, Launch&& launch,
                     int64_t max_blocks = kMaxBlocksPerLaunch) {
  using Meta = TensorListMeta<kDepth>;
  Meta meta{};
  meta.num_tensors = 0;
  meta.chunk_offset = 0;
  int64_t blocks = 0;
  auto flush = [&] {
    launch(static_cast<const Meta&>(meta), static_cast<int>(blocks));
    meta.chunk_offset += blocks;
    meta.num_tensors = 0;
    blocks = 0;
  };
  for (size_t t = 0; t < count; ++t) {
    const int64_t numel = lists[0][t].numel;
    if (numel == 0) continue;
    const int64_t chunks = chunks_of(numel);
    int64_t chunk = 0;
    while (chunk < chunks) {
      if (meta.num_tensors == Meta::kMaxTensors) flush();
      const int slot = meta.num_tensors++;
      for (int d = 0; d < kDepth; ++d) {
        meta.addresses[d][slot] = lists[d][t].data;
        meta.dtypes[d][slot] = static_cast<uint8_t>(lists[d][t].dtype);
      }
      meta.numel[slot] = numel;
      meta.first_chunk[slot] = chunk;
      meta.first_block[slot] = static_cast<int32_t>(blocks);
      const int64_t take = std::min(chunks - chunk, max_blocks - blocks);
      blocks += take;
      chunk += take;
      if (blocks == max_blocks) flush();
    }
  }
  if (blocks > 0) flush();
}

#ifdef __CUDACC__
template <typename Meta, typename Functor>
__global__ void __launch_bounds__(kBlockSize)
    multi_tensor_kernel(const __grid_constant__ Meta meta, const Functor functor) {
  functor.run(meta, static_cast<int>(blockIdx.x), static_cast<int>(threadIdx.x), kBlockSize);
}

template <typename Meta, typename Functor>
void launch_multi_tensor(const Meta& meta, int blocks, const Functor& functor, void* stream,
                         const char* what) {
  static_assert(sizeof(Functor) <= kFunctorBudget, "functor too large for kernel parameters");
  static_assert(sizeof(Meta) + sizeof(Functor) <= kParamLimit, "kernel parameters over 4 KB");
  multi_tensor_kernel<Meta, Functor>
      <<<blocks, kBlockSize, 0, static_cast<cudaStream_t>(stream)>>>(meta, functor);
  check_launch(what);
}
#endif

}  // namespace stepwise::cuda::detail
