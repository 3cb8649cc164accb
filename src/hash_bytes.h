// stepwise (internal): a fast 64-bit hash of bytes, for fingerprints and checksums.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace stepwise::detail {

/// FNV-1a over 8-byte words, in 4 independent lanes so the multiplies overlap: any
/// change to the bytes changes it (with overwhelming probability), in one pass over
/// memory. Fed in pieces of any size, it gives the hash of their concatenation.
class StreamingHash {
 public:
  /// Adds `n` bytes.
  void update(const unsigned char* data, size_t n) {
    while (n > 0 && fill_ > 0) {  // complete a pending block first
      block_[fill_++] = *data++;
      --n;
      if (fill_ == 32) {
        mix(block_);
        fill_ = 0;
      }
    }
    for (; n >= 32; data += 32, n -= 32) mix(data);
    for (; n > 0; --n) block_[fill_++] = *data++;
  }
  /// The hash of everything added.
  uint64_t finish() const {
    uint64_t l0 = lane_[0];
    for (size_t i = 0; i < fill_; ++i) l0 = (l0 ^ block_[i]) * kPrime;
    return ((l0 * kPrime ^ lane_[1]) * kPrime ^ lane_[2]) * kPrime ^ lane_[3];
  }

 private:
  static constexpr uint64_t kPrime = 1099511628211ULL;
  void mix(const unsigned char* block) {
    for (int k = 0; k < 4; ++k) {
      uint64_t word;
      std::memcpy(&word, block + 8 * k, 8);
      lane_[k] = (lane_[k] ^ word) * kPrime;
    }
  }
  uint64_t lane_[4] = {14695981039346656037ULL, 1, 2, 3};
  unsigned char block_[32] = {};
  size_t fill_ = 0;
};

/// The StreamingHash of `n` bytes.
inline uint64_t hash_bytes(const unsigned char* data, size_t n) {
  StreamingHash h;
  h.update(data, n);
  return h.finish();
}

}  // namespace stepwise::detail
