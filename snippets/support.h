// Support code for the extracted docs blocks (snippets/extract.py writes the sources).
//
// Capture: while a fragment runs, its standard output (std::cout and printf alike, in the
// order written) goes to the file named by $STEPWISE_SNIPPET_OUTPUT, so
// snippets/run_block.py can compare it with the page's expected output block; doctest
// reports on stderr. The redirection is of file descriptor 1, so C stdio is captured too.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <stdexcept>
#include <string>

namespace stepwise_snippets {

class Capture {
 public:
  Capture() {
    const char* path = std::getenv("STEPWISE_SNIPPET_OUTPUT");
    if (path == nullptr) return;  // run by hand: the output stays on stdout
    flush();
    int fd = ::open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) throw std::runtime_error(std::string("cannot write ") + path);
    saved_ = ::dup(1);
    ::dup2(fd, 1);
    ::close(fd);
  }
  ~Capture() {
    if (saved_ < 0) return;
    flush();
    ::dup2(saved_, 1);
    ::close(saved_);
  }
  Capture(const Capture&) = delete;
  Capture& operator=(const Capture&) = delete;

 private:
  static void flush() {
    std::cout.flush();
    std::fflush(stdout);
  }
  int saved_ = -1;
};

}  // namespace stepwise_snippets
