// Test support: removes a folder and everything under it, without
// std::filesystem::remove_all (see NOTE: [no remove_all] in src/checkpoint/files.h:
// it crashes inside PyTorch 2.11's libtorch.so).
#pragma once

#include <ftw.h>
#include <stdio.h>

#include <string>

namespace stepwise::testing {

/// Removes `path` (a file or a folder, recursively); nothing when it does not exist.
inline void remove_tree(const std::string& path) {
  ::nftw(
      path.c_str(),
      [](const char* entry, const struct stat*, int, struct FTW*) { return ::remove(entry); }, 16,
      FTW_DEPTH | FTW_PHYS);
}

}  // namespace stepwise::testing
