// Host helpers for kernels_test.cpp: fp16/bf16 <-> float on the host (round to nearest
// even, written here so the reference does not depend on the code under test), device
// buffers, tensor lists, and comparisons. Plain C++ on the CUDA runtime API.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "cuda/kernels.h"

namespace kernels_test {

using stepwise::cuda::DType;
using stepwise::cuda::kChunkSize;
using stepwise::cuda::TensorView;

inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

inline float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline uint16_t float_to_half_bits(float f) {
  const uint32_t x = float_bits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t abs = x & 0x7FFFFFFFu;
  if (abs > 0x7F800000u) return static_cast<uint16_t>(sign | 0x7E00u);   // nan
  if (abs >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // >= 65520: inf
  if (abs >= 0x38800000u) {                                              // a normal half (>= 2^-14)
    const uint32_t mant = abs & 0x7FFFFFu;
    uint32_t h = ((((abs >> 23) - 127u + 15u) << 10) | (mant >> 13));
    const uint32_t rest = mant & 0x1FFFu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;  // a carry bumps the exponent
    return static_cast<uint16_t>(sign | h);
  }
  if (abs <= 0x33000000u) return static_cast<uint16_t>(sign);  // <= 2^-25 rounds to 0
  // Subnormal half: m * 2^-24 with m = value / 2^-24 = mant >> shift.
  const uint32_t exp = abs >> 23;  // 102..112 here
  const uint32_t mant = (abs & 0x7FFFFFu) | 0x800000u;
  const uint32_t shift = 126u - exp;  // 14..24
  uint32_t h = mant >> shift;
  const uint32_t rest = mant & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1u);
  if (rest > half || (rest == half && (h & 1u))) ++h;
  return static_cast<uint16_t>(sign | h);
}

inline float half_bits_to_float(uint16_t h) {
  const uint32_t sign = (static_cast<uint32_t>(h) & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  const uint32_t mant = h & 0x3FFu;
  if (exp == 0) {
    const float value = std::ldexp(static_cast<float>(mant), -24);  // exact
    return sign ? -value : value;
  }
  if (exp == 31) return bits_float(sign | 0x7F800000u | (mant << 13));
  return bits_float(sign | ((exp - 15u + 127u) << 23) | (mant << 13));
}

inline uint16_t float_to_bf16_bits(float f) {
  const uint32_t x = float_bits(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // nan
  return static_cast<uint16_t>((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);
}

inline float bf16_bits_to_float(uint16_t b) { return bits_float(static_cast<uint32_t>(b) << 16); }

inline size_t dtype_size(DType d) { return d == DType::kFloat32 ? 4 : 2; }

inline const char* dtype_name(DType d) {
  return d == DType::kFloat32 ? "fp32" : d == DType::kFloat16 ? "fp16" : "bf16";
}

/// x rounded to dtype d and back.
inline float round_to(DType d, float x) {
  if (d == DType::kFloat16) return half_bits_to_float(float_to_half_bits(x));
  if (d == DType::kBFloat16) return bf16_bits_to_float(float_to_bf16_bits(x));
  return x;
}

inline std::vector<unsigned char> encode(DType d, const std::vector<float>& values) {
  std::vector<unsigned char> bytes(values.size() * dtype_size(d));
  for (size_t i = 0; i < values.size(); ++i) {
    if (d == DType::kFloat32) {
      std::memcpy(&bytes[i * 4], &values[i], 4);
    } else {
      const uint16_t b =
          d == DType::kFloat16 ? float_to_half_bits(values[i]) : float_to_bf16_bits(values[i]);
      std::memcpy(&bytes[i * 2], &b, 2);
    }
  }
  return bytes;
}

inline std::vector<float> decode(DType d, const std::vector<unsigned char>& bytes) {
  std::vector<float> values(bytes.size() / dtype_size(d));
  for (size_t i = 0; i < values.size(); ++i) {
    if (d == DType::kFloat32) {
      std::memcpy(&values[i], &bytes[i * 4], 4);
    } else {
      uint16_t b;
      std::memcpy(&b, &bytes[i * 2], 2);
      values[i] = d == DType::kFloat16 ? half_bits_to_float(b) : bf16_bits_to_float(b);
    }
  }
  return values;
}

inline void cuda_ok(cudaError_t error, const char* what) {
  if (error != cudaSuccess) {
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(error));
  }
}

struct CudaFree {
  void operator()(void* p) const { cudaFree(p); }
};

/// A device tensor of `values.size()` elements of type d, starting `offset` elements
/// into its own allocation (offset 1 makes every access misaligned for 16-byte loads).
/// Empty tensors have a null data pointer, as the contract allows.
class DeviceTensor {
 public:
  DeviceTensor(DType d, const std::vector<float>& values, int64_t offset = 0) : dtype_(d) {
    view_.dtype = d;
    view_.numel = static_cast<int64_t>(values.size());
    if (values.empty()) return;
    void* base = nullptr;
    cuda_ok(cudaMalloc(&base, (values.size() + offset) * dtype_size(d)), "cudaMalloc");
    memory_.reset(base);
    view_.data = static_cast<unsigned char*>(base) + offset * dtype_size(d);
    upload(values);
  }
  void upload(const std::vector<float>& values) {
    const std::vector<unsigned char> bytes = encode(dtype_, values);
    cuda_ok(cudaMemcpy(view_.data, bytes.data(), bytes.size(), cudaMemcpyHostToDevice), "upload");
  }
  std::vector<unsigned char> bytes() const {
    std::vector<unsigned char> out(static_cast<size_t>(view_.numel) * dtype_size(dtype_));
    if (!out.empty()) {
      cuda_ok(cudaMemcpy(out.data(), view_.data, out.size(), cudaMemcpyDeviceToHost), "download");
    }
    return out;
  }
  std::vector<float> values() const { return decode(dtype_, bytes()); }
  const TensorView& view() const { return view_; }

 private:
  DType dtype_;
  TensorView view_;
  std::unique_ptr<void, CudaFree> memory_;
};

/// One device float (found_inf, the norm).
class DeviceScalar {
 public:
  explicit DeviceScalar(float value = 0.0f) {
    void* p = nullptr;
    cuda_ok(cudaMalloc(&p, sizeof(float)), "cudaMalloc");
    memory_.reset(p);
    set(value);
  }
  void set(float value) { cuda_ok(cudaMemcpy(get(), &value, 4, cudaMemcpyHostToDevice), "set"); }
  float value() const {
    float v = 0.0f;
    cuda_ok(cudaMemcpy(&v, memory_.get(), 4, cudaMemcpyDeviceToHost), "value");
    return v;
  }
  float* get() const { return static_cast<float*>(memory_.get()); }

 private:
  std::unique_ptr<void, CudaFree> memory_;
};

// Every device test starts with this: it skips, with the runtime's reason, without one.
#define REQUIRE_DEVICE()                         \
  std::string why;                               \
  if (!stepwise::cuda::device_available(&why)) { \
    GTEST_SKIP() << "no CUDA device: " << why;   \
  }

inline const std::vector<int64_t> kSizes = {0,
                                            1,
                                            2,
                                            3,
                                            7,
                                            31,
                                            127,
                                            1000,
                                            4097,
                                            kChunkSize - 1,
                                            kChunkSize,
                                            kChunkSize + 1,
                                            3 * kChunkSize + 5};
inline const DType kDtypes[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};
// A tensor larger than one launch (2048 chunks) so that it continues in a second one.
inline const int64_t kHuge = 2048 * kChunkSize + kChunkSize / 2 + 3;

inline std::vector<float> random_values(std::mt19937& rng, int64_t n, DType d, float lo = -2.0f,
                                        float hi = 2.0f) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = round_to(d, dist(rng));
  return v;
}

// 200 tensors: more than one launch holds (and a few over a chunk), some empty.
inline std::vector<int64_t> many_sizes(std::mt19937& rng) {
  std::uniform_int_distribution<int64_t> dist(1, 3000);
  std::vector<int64_t> sizes;
  for (int i = 0; i < 200; ++i) {
    sizes.push_back(i % 23 == 0 ? kChunkSize + i : i % 7 == 0 ? 0 : dist(rng));
  }
  return sizes;
}

/// A list of device tensors and its views.
struct TensorList {
  std::vector<std::vector<float>> host;
  std::vector<std::unique_ptr<DeviceTensor>> device;
  std::vector<TensorView> views;
  void add(DType d, std::vector<float> values, int64_t offset) {
    device.push_back(std::make_unique<DeviceTensor>(d, values, offset));
    views.push_back(device.back()->view());
    host.push_back(std::move(values));
  }
};

inline TensorList random_list(std::mt19937& rng, const std::vector<int64_t>& sizes, DType d,
                              int64_t offset, bool mix_dtypes = false, float lo = -2.0f,
                              float hi = 2.0f) {
  TensorList list;
  for (size_t i = 0; i < sizes.size(); ++i) {
    const DType di = mix_dtypes ? kDtypes[(static_cast<size_t>(d) + i) % 3] : d;
    list.add(di, random_values(rng, sizes[i], di, lo, hi), mix_dtypes ? (offset + i) % 2 : offset);
  }
  return list;
}

/// Where a test plants an inf/nan: (tensor, element) pairs of first/middle/last.
inline std::vector<std::pair<size_t, size_t>> special_positions(const std::vector<int64_t>& sizes) {
  std::vector<std::pair<size_t, size_t>> out;
  for (size_t t : {size_t{0}, sizes.size() / 2, sizes.size() - 1}) {
    const size_t n = static_cast<size_t>(sizes[t]);
    for (size_t e : {size_t{0}, n / 2, n - 1}) out.emplace_back(t, e);
  }
  return out;
}

inline ::testing::AssertionResult same_bits(const std::vector<float>& got,
                                            const std::vector<float>& want) {
  if (got.size() != want.size()) return ::testing::AssertionFailure() << "size differs";
  for (size_t i = 0; i < got.size(); ++i) {
    if (float_bits(got[i]) != float_bits(want[i])) {
      return ::testing::AssertionFailure()
             << "element " << i << ": got " << got[i] << ", want " << want[i];
    }
  }
  return ::testing::AssertionSuccess();
}

inline ::testing::AssertionResult all_near(const std::vector<float>& got,
                                           const std::vector<float>& want, double abs_tol,
                                           double rel_tol) {
  if (got.size() != want.size()) return ::testing::AssertionFailure() << "size differs";
  for (size_t i = 0; i < got.size(); ++i) {
    const double diff = std::fabs(static_cast<double>(got[i]) - want[i]);
    if (!(diff <= abs_tol + rel_tol * std::fabs(want[i]))) {
      return ::testing::AssertionFailure()
             << "element " << i << ": got " << got[i] << ", want " << want[i];
    }
  }
  return ::testing::AssertionSuccess();
}

inline void device_sync() { cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }

}  // namespace kernels_test
