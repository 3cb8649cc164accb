// stepwise (internal): a fast 64-bit hash of bytes, for fingerprints and checksums.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace stepwise::detail {

/// FNV-1a over 8-byte words, in 4 independent lanes so the multiplies overlap, each
/// product rotated so that its high bits reach the low bits of the next one (a multiply
/// alone only carries upward: two flips of a word's top bit would cancel), and the lanes
/// mixed at the end with MurmurHash3's finalizer. Any change to the bytes changes it
/// (with overwhelming probability), in one pass over memory. Fed in pieces of any size,
/// it gives the hash of their concatenation.
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
    for (size_t i = 0; i < fill_; ++i) l0 = rotl((l0 ^ block_[i]) * kPrime);
    uint64_t h = fmix(l0);
    for (int k = 1; k < 4; ++k) h = fmix(h ^ rotl(lane_[k]) ^ (h >> 29));
    return h;
  }

 private:
  static constexpr uint64_t kPrime = 1099511628211ULL;
  static uint64_t rotl(uint64_t x) { return (x << 27) | (x >> 37); }
  static uint64_t fmix(uint64_t x) {
    x = (x ^ (x >> 33)) * 0xff51afd7ed558ccdULL;
    x = (x ^ (x >> 33)) * 0xc4ceb9fe1a85ec53ULL;
    return x ^ (x >> 33);
  }
  void mix(const unsigned char* block) {
    for (int k = 0; k < 4; ++k) {
      uint64_t word;
      std::memcpy(&word, block + 8 * k, 8);
      lane_[k] = rotl((lane_[k] ^ word) * kPrime);
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
