// Support code for the extracted docs blocks (snippets/extract.py writes the sources).
//
// Capture: while a fragment runs, std::cout goes to a buffer that is written to the file
// named by $STEPWISE_SNIPPET_OUTPUT, so snippets/run_block.py can compare it with the
// page's expected output block (doctest's own report stays on the real stdout).
#pragma once

#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>

namespace stepwise_snippets {

class Capture {
 public:
  Capture() : old_(std::cout.rdbuf(buffer_.rdbuf())) {}
  ~Capture() {
    std::cout.flush();
    std::cout.rdbuf(old_);
    if (const char* path = std::getenv("STEPWISE_SNIPPET_OUTPUT")) {
      std::ofstream(path, std::ios::binary) << buffer_.str();
    }
  }
  Capture(const Capture&) = delete;
  Capture& operator=(const Capture&) = delete;

 private:
  std::ostringstream buffer_;
  std::streambuf* old_;
};

}  // namespace stepwise_snippets
