# Build speed for this project's own builds (top level only: a parent project that
# adds stepwise with add_subdirectory keeps its own launcher and linker).
#
# - ccache, when it is installed, for repeat builds (-DSTEPWISE_CCACHE=OFF to skip it). A
#   fresh clone does not depend on it: the build and the CI timings assume a cold cache.
#   The PCH needs ccache's pch_defines,time_macros sloppiness to be cached at all, and
#   with Clang a PCH without timestamps (below).
# - GNU gold, when the compiler accepts -fuse-ld=gold: it links a test executable several
#   times faster than ld.bfd, and resolves archives in command-line order as ld.bfd does
#   (lld would not, and could hide a link order that fails for a user).
if(NOT PROJECT_IS_TOP_LEVEL)
  return()
endif()
option(STEPWISE_CCACHE "Compile through ccache when it is installed" ON)
find_program(STEPWISE_CCACHE_PROGRAM ccache)
if(STEPWISE_CCACHE AND STEPWISE_CCACHE_PROGRAM AND NOT CMAKE_CXX_COMPILER_LAUNCHER)
  set(CMAKE_CXX_COMPILER_LAUNCHER ${CMAKE_COMMAND} -E env
      CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime
      ${STEPWISE_CCACHE_PROGRAM})
  # Clang writes its inputs' modification times into a PCH and refuses a PCH restored from
  # the cache into a fresh folder ("has been modified since the precompiled header was
  # built"): without the timestamps, ccache's content check is what decides.
  add_compile_options("$<$<CXX_COMPILER_ID:Clang>:SHELL:-Xclang -fno-pch-timestamp>")
  message(STATUS "stepwise: compiling through ${STEPWISE_CCACHE_PROGRAM}")
endif()
option(STEPWISE_GOLD "Link with GNU gold when the compiler accepts -fuse-ld=gold" ON)
if(STEPWISE_GOLD)
  include(CheckLinkerFlag)
  check_linker_flag(CXX -fuse-ld=gold STEPWISE_HAS_GOLD)
  if(STEPWISE_HAS_GOLD)
    add_link_options($<$<LINK_LANGUAGE:CXX>:-fuse-ld=gold>)
  endif()
endif()
