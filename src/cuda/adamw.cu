// adamw: one fused Adam/AdamW step (torch 1.13's torch::optim::Adam/AdamW formulas),
// optionally writing the new weights to model copies in the same pass.
#include "multi_tensor_apply.cuh"

namespace stepwise::cuda {
namespace detail {

/// Per-step scalars, derived on the host in double and rounded to float once, as
/// torch does when it applies a double scalar to a float tensor.
struct AdamScalars {
  float beta1;
  float one_minus_beta1;
  float beta2;
  float one_minus_beta2;
  float eps;
  float weight_decay;
  float decay_factor;  // 1 - lr * wd (decoupled)
  float step_size;     // lr / (1 - beta1^step)
  float sqrt_bc2;      // sqrt(1 - beta2^step)
  float grad_scale;
  bool decoupled;
};

template <bool kHasCopies>
struct AdamFunctor {
  AdamScalars s;
  const float* found_inf;

  __host__ __device__ void update(float& p, float grad, float& m, float& v) const {
    float g = grad * s.grad_scale;
    if (s.decoupled) {
      p = p * s.decay_factor;
    } else if (s.weight_decay != 0.0f) {  // torch skips the add when wd == 0
      g = g + s.weight_decay * p;
    }
    m = s.beta1 * m + s.one_minus_beta1 * g;
    v = s.beta2 * v + s.one_minus_beta2 * g * g;
    const float denom = sqrtf(v) / s.sqrt_bc2 + s.eps;
    p = p - s.step_size * (m / denom);
  }

  // C is the copies' element type (unused, and copy null, without copies).
  template <typename G, typename C>
  __host__ __device__ void run_typed(float* p, const G* g, float* m, float* v, C* copy,
                                     int64_t length, int tid, int threads) const {
    // 4 elements a step: one 16-byte access for the fp32 lists, 8 bytes for 16-bit ones.
    constexpr int kVec = 4;
    const bool aligned = is_aligned16(p) && is_aligned16(g) && is_aligned16(m) && is_aligned16(v) &&
                         (!kHasCopies || is_aligned16(copy));
    if (aligned && length % kVec == 0) {
      for (int64_t i = static_cast<int64_t>(tid) * kVec; i < length;
           i += static_cast<int64_t>(threads) * kVec) {
        float pp[kVec], gg[kVec], mm[kVec], vv[kVec];
        load_pack<kVec>(p + i, pp);
        load_pack<kVec>(g + i, gg);
        load_pack<kVec>(m + i, mm);
        load_pack<kVec>(v + i, vv);
        STEPWISE_UNROLL
        for (int k = 0; k < kVec; ++k) update(pp[k], gg[k], mm[k], vv[k]);
        store_pack<kVec>(p + i, pp);
        store_pack<kVec>(m + i, mm);
        store_pack<kVec>(v + i, vv);
        if constexpr (kHasCopies) store_pack<kVec>(copy + i, pp);
      }
    } else {
      for (int64_t i = tid; i < length; i += threads) {
        float pp = p[i];
        float mm = m[i];
        float vv = v[i];
        update(pp, to_float(g[i]), mm, vv);
        p[i] = pp;
        m[i] = mm;
        v[i] = vv;
        if constexpr (kHasCopies) copy[i] = from_float<C>(pp);
      }
    }
  }

  template <typename C>
  __host__ __device__ void dispatch_grad(DType grad_type, float* p, const void* g, float* m,
                                         float* v, C* copy, int64_t length, int tid,
                                         int threads) const {
    switch (grad_type) {
      case DType::kFloat32:
        run_typed(p, static_cast<const float*>(g), m, v, copy, length, tid, threads);
        break;
      case DType::kFloat16:
        run_typed(p, static_cast<const __half*>(g), m, v, copy, length, tid, threads);
        break;
      case DType::kBFloat16:
        run_typed(p, static_cast<const __nv_bfloat16*>(g), m, v, copy, length, tid, threads);
        break;
    }
  }

  template <typename Meta>
  __host__ __device__ void run(const Meta& meta, int block, int tid, int threads) const {
    // The skip is decided here, on the device: no host sync, no memory touched.
    if (found_inf != nullptr && *found_inf != 0.0f) return;
    const ChunkRef c = locate_chunk(meta, block);
    const int t = c.tensor;
    float* p = static_cast<float*>(meta.addresses[0][t]) + c.start;
    const DType grad_type = static_cast<DType>(meta.dtypes[1][t]);
    const void* g = meta.addresses[1][t];
    float* m = static_cast<float*>(meta.addresses[2][t]) + c.start;
    float* v = static_cast<float*>(meta.addresses[3][t]) + c.start;
    // g is offset by c.start in run_typed's element type, hence the per-type casts.
    switch (grad_type) {
      case DType::kFloat32:
        g = static_cast<const float*>(g) + c.start;
        break;
      case DType::kFloat16:
        g = static_cast<const __half*>(g) + c.start;
        break;
      case DType::kBFloat16:
        g = static_cast<const __nv_bfloat16*>(g) + c.start;
        break;
    }
    if constexpr (kHasCopies) {
      void* copy = meta.addresses[4][t];
      switch (static_cast<DType>(meta.dtypes[4][t])) {
        case DType::kFloat32:
          dispatch_grad(grad_type, p, g, m, v, static_cast<float*>(copy) + c.start, c.length, tid,
                        threads);
          break;
        case DType::kFloat16:
          dispatch_grad(grad_type, p, g, m, v, static_cast<__half*>(copy) + c.start, c.length, tid,
                        threads);
          break;
        case DType::kBFloat16:
          dispatch_grad(grad_type, p, g, m, v, static_cast<__nv_bfloat16*>(copy) + c.start,
                        c.length, tid, threads);
          break;
      }
    } else {
      dispatch_grad(grad_type, p, g, m, v, static_cast<float*>(nullptr), c.length, tid, threads);
    }
  }
};

AdamScalars make_adam_scalars(const AdamHyper& h) {
  if (h.step < 1) throw_bad("adamw", "step must be >= 1, got " + std::to_string(h.step));
  if (!(h.beta1 >= 0.0f && h.beta1 < 1.0f)) {
    throw_bad("adamw", "beta1 must be in [0, 1), got " + std::to_string(h.beta1));
  }
  if (!(h.beta2 >= 0.0f && h.beta2 < 1.0f)) {
    throw_bad("adamw", "beta2 must be in [0, 1), got " + std::to_string(h.beta2));
  }
  const double beta1 = h.beta1;
  const double beta2 = h.beta2;
  const double bc1 = h.bias_correction ? 1.0 - std::pow(beta1, static_cast<double>(h.step)) : 1.0;
  const double bc2 = h.bias_correction ? 1.0 - std::pow(beta2, static_cast<double>(h.step)) : 1.0;
  AdamScalars s;
  s.beta1 = h.beta1;
  s.one_minus_beta1 = static_cast<float>(1.0 - beta1);
  s.beta2 = h.beta2;
  s.one_minus_beta2 = static_cast<float>(1.0 - beta2);
  s.eps = h.eps;
  s.weight_decay = h.weight_decay;
  s.decay_factor = static_cast<float>(1.0 - static_cast<double>(h.lr) * h.weight_decay);
  s.step_size = static_cast<float>(h.lr / bc1);
  s.sqrt_bc2 = static_cast<float>(std::sqrt(bc2));
  s.grad_scale = h.grad_scale;
  s.decoupled = h.decoupled;
  return s;
}

// Everything is checked before the first launch, so a bad call changes nothing.
void check_adam_lists(const AdamLists& lists, size_t count) {
  constexpr const char* kWhat = "adamw";
  const TensorView* all[5] = {lists.params, lists.grads, lists.exp_avg, lists.exp_avg_sq,
                              lists.model_copies};
  const char* names[5] = {"params", "grads", "exp_avg", "exp_avg_sq", "model_copies"};
  for (int l = 0; l < 5; ++l) {
    if (l == 4 && all[l] == nullptr) break;  // model copies are optional
    validate_list(kWhat, names[l], all[l], count);
    for (size_t i = 0; i < count; ++i) {
      const std::string where = std::string(names[l]) + "[" + std::to_string(i) + "]";
      if (all[l][i].numel != all[0][i].numel) {
        throw_bad(kWhat, where + " has numel " + std::to_string(all[l][i].numel) + " but params[" +
                             std::to_string(i) + "] has " + std::to_string(all[0][i].numel));
      }
      const bool must_be_fp32 = l == 0 || l == 2 || l == 3;
      if (must_be_fp32 && all[l][i].dtype != DType::kFloat32) {
        throw_bad(kWhat, where + " must be fp32, got dtype " +
                             std::to_string(static_cast<int>(all[l][i].dtype)));
      }
    }
  }
}

}  // namespace detail

void adamw(const AdamLists& lists, size_t count, const AdamHyper& hyper, const float* found_inf,
           void* stream) {
  constexpr const char* kWhat = "adamw";
  detail::check_adam_lists(lists, count);
  const detail::AdamScalars scalars = detail::make_adam_scalars(hyper);
  if (lists.model_copies != nullptr) {
    const detail::AdamFunctor<true> functor{scalars, found_inf};
    const TensorView* const all[5] = {lists.params, lists.grads, lists.exp_avg, lists.exp_avg_sq,
                                      lists.model_copies};
    detail::for_each_launch<5>(all, count, [&](const detail::TensorListMeta<5>& meta, int blocks) {
      detail::launch_multi_tensor(meta, blocks, functor, stream, kWhat);
    });
  } else {
    const detail::AdamFunctor<false> functor{scalars, found_inf};
    const TensorView* const all[4] = {lists.params, lists.grads, lists.exp_avg, lists.exp_avg_sq};
    detail::for_each_launch<4>(all, count, [&](const detail::TensorListMeta<4>& meta, int blocks) {
      detail::launch_multi_tensor(meta, blocks, functor, stream, kWhat);
    });
  }
}

}  // namespace stepwise::cuda
