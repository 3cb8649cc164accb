// global_norm: per-chunk sums of squares into a workspace, then one block adds them up
// in a fixed order. No float atomics, so the result is the same on every run.
#include "multi_tensor_apply.cuh"

namespace stepwise::cuda {
namespace detail {
namespace {

constexpr int kWarps = kBlockSize / 32;
static_assert(kBlockSize % 32 == 0 && kWarps <= 32, "block_sum assumes <= 32 full warps");

// This thread's sum of squares over its share of one chunk (fixed order).
template <typename T>
__host__ __device__ float thread_sum_squares(const T* data, int64_t length, int tid, int threads) {
  constexpr int kVec = 16 / static_cast<int>(sizeof(T));
  float sum = 0.0f;
  if (is_aligned16(data) && length % kVec == 0) {
    for (int64_t i = static_cast<int64_t>(tid) * kVec; i < length;
         i += static_cast<int64_t>(threads) * kVec) {
      float x[kVec];
      load_pack<kVec>(data + i, x);
      STEPWISE_UNROLL
      for (int k = 0; k < kVec; ++k) sum += x[k] * x[k];
    }
  } else {
    for (int64_t i = tid; i < length; i += threads) {
      const float x = to_float(data[i]);
      sum += x * x;
    }
  }
  return sum;
}

template <typename Meta>
__host__ __device__ float chunk_thread_sum(const Meta& meta, const ChunkRef& c, int tid,
                                           int threads) {
  const void* base = meta.addresses[0][c.tensor];
  switch (static_cast<DType>(meta.dtypes[0][c.tensor])) {
    case DType::kFloat32:
      return thread_sum_squares(static_cast<const float*>(base) + c.start, c.length, tid, threads);
    case DType::kFloat16:
      return thread_sum_squares(static_cast<const __half*>(base) + c.start, c.length, tid, threads);
    case DType::kBFloat16:
      return thread_sum_squares(static_cast<const __nv_bfloat16*>(base) + c.start, c.length, tid,
                                threads);
  }
  return 0.0f;
}

// Sum over the block, valid in thread 0; a fixed shuffle tree, so deterministic.
__device__ float block_sum(float v) {
  __shared__ float warp_sums[kWarps];
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int warp = static_cast<int>(threadIdx.x) >> 5;
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_down_sync(0xffffffffu, v, offset);
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  v = 0.0f;
  if (warp == 0) {
    v = lane < kWarps ? warp_sums[lane] : 0.0f;
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_down_sync(0xffffffffu, v, offset);
  }
  return v;
}

struct SumSquaresFunctor {
  float* partials;

  template <typename Meta>
  __device__ void run(const Meta& meta, int block, int tid, int threads) const {
    const ChunkRef c = locate_chunk(meta, block);
    const float sum = block_sum(chunk_thread_sum(meta, c, tid, threads));
    if (tid == 0) partials[meta.chunk_offset + block] = sum;
  }
};

__global__ void __launch_bounds__(kBlockSize)
    finish_norm_kernel(const float* partials, int64_t count, float* out_norm) {
  float sum = 0.0f;
  for (int64_t i = threadIdx.x; i < count; i += kBlockSize) sum += partials[i];
  sum = block_sum(sum);
  if (threadIdx.x == 0) *out_norm = sqrtf(sum);
}

}  // namespace
}  // namespace detail

int64_t global_norm_workspace(const TensorView* tensors, size_t count) {
  detail::validate_list("global_norm_workspace", "tensors", tensors, count);
  int64_t chunks = 0;
  for (size_t i = 0; i < count; ++i) chunks += detail::chunks_of(tensors[i].numel);
  return chunks > 0 ? chunks : 1;
}

void global_norm(const TensorView* tensors, size_t count, float* workspace, float* out_norm,
                 void* stream) {
  constexpr const char* kWhat = "global_norm";
  detail::validate_list(kWhat, "tensors", tensors, count);
  if (workspace == nullptr) detail::throw_bad(kWhat, "workspace is null");
  if (out_norm == nullptr) detail::throw_bad(kWhat, "out_norm is null");
  const detail::SumSquaresFunctor functor{workspace};
  const TensorView* const lists[1] = {tensors};
  int64_t chunks = 0;
  detail::for_each_launch<1>(lists, count, [&](const detail::TensorListMeta<1>& meta, int blocks) {
    detail::launch_multi_tensor(meta, blocks, functor, stream, kWhat);
    chunks = meta.chunk_offset + blocks;
  });
  // Runs even for an empty list, so *out_norm is always written (0 then).
  detail::finish_norm_kernel<<<1, detail::kBlockSize, 0, static_cast<cudaStream_t>(stream)>>>(
      workspace, chunks, out_norm);
  check_launch(kWhat);
}

}  // namespace stepwise::cuda
