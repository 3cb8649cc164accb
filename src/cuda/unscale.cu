// unscale_and_check: x *= inv_scale in place, and *found_inf = 1 if any x was inf/nan.
#include "multi_tensor_apply.cuh"

namespace stepwise::cuda {
namespace detail {

struct UnscaleFunctor {
  float inv_scale;
  float* found_inf;

  template <typename T>
  __host__ __device__ void run_typed(T* data, int64_t length, int tid, int threads) const {
    constexpr int kVec = 16 / static_cast<int>(sizeof(T));
    bool bad = false;
    if (is_aligned16(data) && length % kVec == 0) {
      for (int64_t i = static_cast<int64_t>(tid) * kVec; i < length;
           i += static_cast<int64_t>(threads) * kVec) {
        float x[kVec];
        load_pack<kVec>(data + i, x);
        STEPWISE_UNROLL
        for (int k = 0; k < kVec; ++k) {
          bad |= !is_finite(x[k]);  // checked before scaling, as the contract says
          x[k] *= inv_scale;
        }
        store_pack<kVec>(data + i, x);
      }
    } else {
      for (int64_t i = tid; i < length; i += threads) {
        const float x = to_float(data[i]);
        bad |= !is_finite(x);
        data[i] = from_float<T>(x * inv_scale);
      }
    }
    // Every writer stores the same value, so the race is benign; never cleared.
    if (bad) *found_inf = 1.0f;
  }

  template <typename Meta>
  __host__ __device__ void run(const Meta& meta, int block, int tid, int threads) const {
    const ChunkRef c = locate_chunk(meta, block);
    void* base = meta.addresses[0][c.tensor];
    switch (static_cast<DType>(meta.dtypes[0][c.tensor])) {
      case DType::kFloat32:
        run_typed(static_cast<float*>(base) + c.start, c.length, tid, threads);
        break;
      case DType::kFloat16:
        run_typed(static_cast<__half*>(base) + c.start, c.length, tid, threads);
        break;
      case DType::kBFloat16:
        run_typed(static_cast<__nv_bfloat16*>(base) + c.start, c.length, tid, threads);
        break;
    }
  }
};

}  // namespace detail

void unscale_and_check(const TensorView* tensors, size_t count, float inv_scale, float* found_inf,
                       void* stream) {
  constexpr const char* kWhat = "unscale_and_check";
  detail::validate_list(kWhat, "tensors", tensors, count);
  if (found_inf == nullptr) detail::throw_bad(kWhat, "found_inf is null");
  const detail::UnscaleFunctor functor{inv_scale, found_inf};
  const TensorView* const lists[1] = {tensors};
  detail::for_each_launch<1>(lists, count, [&](const detail::TensorListMeta<1>& meta, int blocks) {
    detail::launch_multi_tensor(meta, blocks, functor, stream, kWhat);
  });
}

}  // namespace stepwise::cuda
