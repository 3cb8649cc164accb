// stepwise (internal): a fast 64-bit hash of bytes, for fingerprints and checksums.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace stepwise::detail {

/// FNV-1a over 8-byte words, in 4 independent lanes so the multiplies overlap: any
/// change to the bytes changes it (with overwhelming probability), in one pass over
/// memory.
inline uint64_t hash_bytes(const unsigned char* data, size_t n) {
  constexpr uint64_t kPrime = 1099511628211ULL;
  uint64_t lane[4] = {14695981039346656037ULL, 1, 2, 3};
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    for (int k = 0; k < 4; ++k) {
      uint64_t word;
      std::memcpy(&word, data + i + 8 * k, 8);
      lane[k] = (lane[k] ^ word) * kPrime;
    }
  }
  for (; i < n; ++i) lane[0] = (lane[0] ^ data[i]) * kPrime;
  return ((lane[0] * kPrime ^ lane[1]) * kPrime ^ lane[2]) * kPrime ^ lane[3];
}

}  // namespace stepwise::detail
