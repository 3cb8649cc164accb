// What a CUDA build of LibTorch generates here (a CPU build's headers lack it), so that
// the CUDA-only sources compile against Debian's CPU LibTorch headers in the CI check
// (stepwise_cuda_only_sources_check in CMakeLists.txt, a target only a build against a
// CPU LibTorch has).
#pragma once
#define C10_CUDA_BUILD_SHARED_LIBS
