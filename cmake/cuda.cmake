# Which CUDA parts this build has (see NOTE: [CUDA backends] in CMakeLists.txt):
#   STEPWISE_TORCH_CUDA        the LibTorch found is CUDA-enabled (PyTorch's own)
#   STEPWISE_HAS_CUDA_KERNELS  src/cuda/*.cu are compiled (nvcc found, or required)
#   STEPWISE_HAS_NCCL          the NCCL process group is compiled
if(TORCH_CUDA_LIBRARIES)
  set(STEPWISE_TORCH_CUDA ON)
else()
  set(STEPWISE_TORCH_CUDA OFF)
endif()

set(STEPWISE_HAS_CUDA_KERNELS OFF)
if(STEPWISE_TORCH_CUDA OR STEPWISE_CUDA_KERNELS STREQUAL "ON")
  set(_cuda_required ON)
else()
  set(_cuda_required OFF)
endif()
# AUTO with a CPU LibTorch: only for their own tests, since nothing links them then (a
# parent project that adds stepwise does not pay for nvcc; NOTE: [subproject defaults]).
if(STEPWISE_TORCH_CUDA OR STEPWISE_CUDA_KERNELS STREQUAL "ON"
   OR (STEPWISE_CUDA_KERNELS STREQUAL "AUTO" AND STEPWISE_BUILD_TESTS))
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    # sm_90 machine code (H100/H200) plus compute_90 PTX for newer GPUs to JIT. Set
    # on the kernel targets (src/cuda/CMakeLists.txt): a CUDA LibTorch's config sets
    # CMAKE_CUDA_ARCHITECTURES to OFF in our scope.
    set(STEPWISE_CUDA_ARCHITECTURES 90 CACHE STRING "CUDA_ARCHITECTURES of the kernels")
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES OR NOT CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES ${STEPWISE_CUDA_ARCHITECTURES})
    endif()
    enable_language(CUDA)
    # The C++ ABI of LibTorch for the host code nvcc compiles, too.
    string(REGEX MATCH "-D_GLIBCXX_USE_CXX11_ABI=[01]" _abi "${TORCH_CXX_FLAGS}")
    if(_abi)
      string(APPEND CMAKE_CUDA_FLAGS " ${_abi}")
    endif()
    find_package(CUDAToolkit REQUIRED)
    set(STEPWISE_HAS_CUDA_KERNELS ON)
  elseif(_cuda_required)
    message(FATAL_ERROR "stepwise: the CUDA kernels are required (STEPWISE_CUDA_KERNELS=ON "
                        "or a CUDA LibTorch) but no CUDA compiler was found; put nvcc on PATH "
                        "or set CMAKE_CUDA_COMPILER")
  endif()
endif()

set(STEPWISE_HAS_NCCL OFF)
if(STEPWISE_TORCH_CUDA)
  # PyTorch's wheels keep nccl.h in the nvidia-nccl package, not in the toolkit.
  execute_process(COMMAND python3 -c "import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__) if nvidia.nccl.__file__ else list(nvidia.nccl.__path__)[0])"
                  OUTPUT_VARIABLE _nccl_py OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  find_path(STEPWISE_NCCL_INCLUDE_DIR nccl.h
            HINTS $ENV{NCCL_HOME}/include ${_nccl_py}/include ${CUDAToolkit_INCLUDE_DIRS})
  if(STEPWISE_NCCL_INCLUDE_DIR)
    set(STEPWISE_HAS_NCCL ON)
  else()
    set(STEPWISE_NCCL_MISSING "built without NCCL (nccl.h was not found: set \
STEPWISE_NCCL_INCLUDE_DIR or NCCL_HOME and reconfigure)")
  endif()
else()
  set(STEPWISE_NCCL_MISSING "built without CUDA (no CUDA-enabled LibTorch was found: \
configure with CMAKE_PREFIX_PATH pointing at a CUDA LibTorch)")
endif()
message(STATUS "stepwise: CUDA LibTorch=${STEPWISE_TORCH_CUDA}, "
               "CUDA kernels=${STEPWISE_HAS_CUDA_KERNELS} (${STEPWISE_CUDA_ARCHITECTURES})")
