// Test support: a fresh, empty folder under the test's temporary directory, removed
// with everything in it when the object goes.
#pragma once

#include <gtest/gtest.h>

#include <stdlib.h>

#include <string>

#include "support/remove_tree.h"

namespace stepwise::testing {

class ScratchDir {
 public:
  explicit ScratchDir(const std::string& prefix) {
    std::string pattern = ::testing::TempDir() + "/" + prefix + "-XXXXXX";
    if (mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed: " + pattern);
    path_ = pattern;
  }
  ~ScratchDir() { remove_tree(path_); }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  /// The folder.
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace stepwise::testing
