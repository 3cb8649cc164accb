#include "checkpoint/zip.h"

#include <c10/util/StringUtil.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

namespace stepwise::detail {

// NOTE: [zip structure check] LibTorch reads its archives with miniz built without the
// CRC checks, and takes each entry's data offset from the entry's local header. So a
// damaged local header (its name or extra-field length) makes it read an entry's bytes
// from the wrong place, silently, and a checksum sidecar rewritten after the damage
// cannot tell. LibTorch's writer (PyTorchStreamWriter) puts every entry's data (stored,
// or deflated for TorchScript's code) at a multiple of 64 bytes (kFieldAlignment); the checks below
// hold for every archive it writes and fail for such damage. They read the headers only (a few
// bytes per entry), not the data.

namespace {

constexpr uint32_t kLocalSignature = 0x04034b50;
constexpr uint32_t kCentralSignature = 0x02014b50;
constexpr uint32_t kEndSignature = 0x06054b50;
constexpr uint32_t kEnd64Signature = 0x06064b50;
constexpr uint32_t kEnd64LocatorSignature = 0x07064b50;
constexpr size_t kLocalHeader = 30, kCentralHeader = 46, kEndRecord = 22;
constexpr uint64_t kAlignment = 64;

uint64_t le(const unsigned char* p, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

struct Entry {
  std::string name;
  uint64_t size = 0;           // its bytes in the file (compressed, if it is)
  uint64_t header_offset = 0;  // of its local header
};

}  // namespace

std::string zip_structure_problem(const unsigned char* data, size_t size) {
  if (size < kEndRecord) return "too short for a zip archive";
  // The end record: the last 22 bytes, or earlier when the archive has a comment.
  size_t end = size - kEndRecord;
  const size_t lowest = size > kEndRecord + 0xffff ? size - kEndRecord - 0xffff : 0;
  while (le(data + end, 4) != kEndSignature) {
    if (end == lowest) return "no zip end record";
    --end;
  }
  uint64_t entries = le(data + end + 10, 2);
  uint64_t directory_size = le(data + end + 12, 4);
  uint64_t directory = le(data + end + 16, 4);
  if (entries == 0xffff || directory_size == 0xffffffff || directory == 0xffffffff) {
    if (end < 20 || le(data + end - 20, 4) != kEnd64LocatorSignature) {
      return "a zip64 archive without its end-record locator";
    }
    const uint64_t end64 = le(data + end - 20 + 8, 8);
    if (end64 + 56 > size || le(data + end64, 4) != kEnd64Signature) {
      return "a zip64 archive whose end record is not where its locator says";
    }
    entries = le(data + end64 + 32, 8);
    directory_size = le(data + end64 + 40, 8);
    directory = le(data + end64 + 48, 8);
  }
  if (directory > size || directory_size > size - directory) {
    return "its central directory lies outside the file";
  }
  std::vector<Entry> all;
  uint64_t at = directory;
  for (uint64_t i = 0; i < entries; ++i) {
    if (at + kCentralHeader > directory + directory_size || le(data + at, 4) != kCentralSignature) {
      return c10::str("central directory entry ", i, " is damaged");
    }
    const uint64_t method = le(data + at + 10, 2);  // 0 stored, 8 deflated
    if (method != 0 && method != 8) {
      return c10::str("central directory entry ", i, " has compression method ", method);
    }
    Entry e;
    e.size = le(data + at + 20, 4);  // compressed: what the file holds
    uint64_t uncompressed = le(data + at + 24, 4);
    e.header_offset = le(data + at + 42, 4);
    const uint64_t name = le(data + at + 28, 2), extra = le(data + at + 30, 2),
                   comment = le(data + at + 32, 2);
    if (at + kCentralHeader + name + extra + comment > directory + directory_size) {
      return c10::str("central directory entry ", i, " runs past the directory");
    }
    e.name.assign(reinterpret_cast<const char*>(data + at + kCentralHeader), name);
    // zip64: the 32-bit fields that are all ones are in the extra field, in this order.
    for (uint64_t x = at + kCentralHeader + name; x + 4 <= at + kCentralHeader + name + extra;) {
      const uint64_t id = le(data + x, 2), length = le(data + x + 2, 2);
      if (id == 0x0001) {
        uint64_t field = x + 4;
        const auto next = [&](uint64_t& value) {
          if (value == 0xffffffff && field + 8 <= x + 4 + length) {
            value = le(data + field, 8);
            field += 8;
          }
        };
        next(uncompressed);
        next(e.size);
        next(e.header_offset);
      }
      x += 4 + length;
    }
    if (method == 0 && uncompressed != e.size) return c10::str("entry ", e.name, " has two sizes");
    all.push_back(std::move(e));
    at += kCentralHeader + name + extra + comment;
  }
  std::sort(all.begin(), all.end(),
            [](const Entry& a, const Entry& b) { return a.header_offset < b.header_offset; });
  for (size_t i = 0; i < all.size(); ++i) {
    const Entry& e = all[i];
    const uint64_t limit = i + 1 < all.size() ? all[i + 1].header_offset : directory;
    if (e.header_offset + kLocalHeader > limit ||
        le(data + e.header_offset, 4) != kLocalSignature) {
      return c10::str("the local header of entry ", e.name, " is not where the directory says");
    }
    const uint64_t name = le(data + e.header_offset + 26, 2),
                   extra = le(data + e.header_offset + 28, 2);
    const uint64_t start = e.header_offset + kLocalHeader + name + extra;
    if (name != e.name.size() ||
        std::memcmp(data + e.header_offset + kLocalHeader, e.name.data(), name) != 0) {
      return c10::str("the local header of entry ", e.name, " names another entry");
    }
    if (start % kAlignment != 0 || start > limit || e.size > limit - start) {
      return c10::str("the data of entry ", e.name, " is not where LibTorch writes it (offset ",
                      start, ", ", e.size, " bytes, next entry at ", limit, ")");
    }
  }
  return "";
}

}  // namespace stepwise::detail
