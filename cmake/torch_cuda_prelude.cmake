# Before find_package(Torch): what a CUDA LibTorch's config (PyTorch's wheels) needs
# that it does not find by itself. Harmless with Debian's CPU LibTorch.
#  - Torch 2.1 .. ~2.7 link CUDA::nvToolsExt, which CUDA 12.9+ toolkits no longer
#    ship; NVTX 3 (headers only) is what replaces it.
#  - TORCH_CUDA_ARCH_LIST: without it, a machine without a visible GPU makes the
#    config guess the architectures.
#  - One toolkit: the one of CMAKE_CUDA_COMPILER when given (tools/gpu-check passes
#    it), so Torch's "two conflicting CUDA versions" check cannot trip.
if(CMAKE_CUDA_COMPILER AND NOT CUDAToolkit_ROOT)
  get_filename_component(_nvcc_bin "${CMAKE_CUDA_COMPILER}" DIRECTORY)
  get_filename_component(CUDAToolkit_ROOT "${_nvcc_bin}" DIRECTORY)
endif()
find_package(CUDAToolkit QUIET)
if(CUDAToolkit_FOUND)
  set(USE_SYSTEM_NVTX ON)
  if(NOT TARGET CUDA::nvToolsExt AND TARGET CUDA::nvtx3)
    add_library(CUDA::nvToolsExt INTERFACE IMPORTED GLOBAL)  # GLOBAL: a parent project sees it
    target_link_libraries(CUDA::nvToolsExt INTERFACE CUDA::nvtx3)
  endif()
  if(NOT DEFINED ENV{TORCH_CUDA_ARCH_LIST})
    set(ENV{TORCH_CUDA_ARCH_LIST} "9.0")
  endif()
endif()
