# NOTE: [Clang first] Included before project(): a top-level configure that names no C++
# compiler (no -DCMAKE_CXX_COMPILER, no CXX in the environment) compiles with clang++ when
# it is installed (tools/bootstrap installs it), else with the system's c++ (GCC).
# Measured on fresh builds of this project on 2 cores (.ninja_log): GCC spends 1,302 s of
# CPU, Clang 580 s (the build phase: 623-706 s with GCC in CI's runs, 295 s with Clang on a
# quiet machine). GCC's precompiled header holds LibTorch's parsed headers, but every TU
# still instantiates the templates they use (9.4 s for an empty main after
# <torch/torch.h>); Clang's (CMake builds it with -fpch-instantiate-templates) holds the
# instantiations too.
# GCC on request: -DSTEPWISE_PREFER_CLANG=OFF, or CXX=g++, on the first configure of a
# build folder (a configured folder keeps its compiler). The library is the same C++17
# either way, and a user's project links it with either (packaging:consumer builds one
# with the system's c++).
# Under add_subdirectory the parent project chose; a toolchain file chooses itself.
if(NOT CMAKE_SOURCE_DIR STREQUAL CMAKE_CURRENT_SOURCE_DIR)
  return()
endif()
option(STEPWISE_PREFER_CLANG "A fresh top-level configure uses clang++ when it is installed"
       ON)
if(STEPWISE_PREFER_CLANG AND NOT DEFINED CMAKE_CXX_COMPILER AND NOT DEFINED ENV{CXX}
   AND NOT DEFINED CMAKE_TOOLCHAIN_FILE)
  find_program(STEPWISE_CLANGXX NAMES clang++)
  if(STEPWISE_CLANGXX)
    set(CMAKE_CXX_COMPILER "${STEPWISE_CLANGXX}")
  endif()
endif()
