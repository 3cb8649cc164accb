// stepwise (internal): a structure check of the zip archives LibTorch writes (pickle_save,
// torch::serialize), before LibTorch reads them. see NOTE: [zip structure check]
#pragma once

#include <cstddef>
#include <string>

namespace stepwise::detail {

/// Why the `size` bytes at `data` (the file `path`) are not a zip archive as LibTorch
/// writes it; empty when they are. Checks the end records, and for every entry of the
/// central directory that its local header is where the directory says, with the same
/// name, and that its data starts at a multiple of 64 bytes and ends before the next entry.
std::string zip_structure_problem(const unsigned char* data, size_t size);

}  // namespace stepwise::detail
