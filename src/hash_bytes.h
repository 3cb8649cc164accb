// stepwise (internal): 64-bit hashes of bytes, for the checkpoint checksums and the guard
// rails' CPU fingerprints: xxHash's XXH3 (Debian's libxxhash-dev), inlined from its header,
// so the library links nothing more and a user's project needs nothing of it.
#pragma once

#define XXH_INLINE_ALL
#include <xxhash.h>

#include <cstddef>
#include <cstdint>

namespace stepwise::detail {

/// The name a checksum sidecar gives its hash (NOTE: [checkpoint checksums]).
inline constexpr const char* kHashName = "xxh3";

/// XXH3-64 fed in pieces of any size: the hash of their concatenation.
class StreamingHash {
 public:
  StreamingHash() { XXH3_64bits_reset(&state_); }
  /// Adds `n` bytes.
  void update(const void* data, size_t n) { XXH3_64bits_update(&state_, data, n); }
  /// The hash of everything added.
  uint64_t finish() const { return XXH3_64bits_digest(&state_); }

 private:
  XXH3_state_t state_;
};

/// XXH3-64 of `n` bytes.
inline uint64_t hash_bytes(const void* data, size_t n) { return XXH3_64bits(data, n); }

}  // namespace stepwise::detail
