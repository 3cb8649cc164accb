# The libraries stepwise builds with besides LibTorch: nlohmann-json (headers), and for
# the tests GoogleTest and doctest (looked for only when STEPWISE_BUILD_TESTS: see
# NOTE: [subproject defaults]). Debian's packages by default (tools/bootstrap);
# with STEPWISE_THIRD_PARTY_DIR (what tools/stage-third-party writes: a GPU machine
# with no network and no apt), the staged copies instead.
if(STEPWISE_THIRD_PARTY_DIR)
  set(_tp ${STEPWISE_THIRD_PARTY_DIR})
  foreach(_need nlohmann/json.hpp doctest/doctest.h googletest/CMakeLists.txt)
    if(NOT EXISTS ${_tp}/${_need} AND NOT EXISTS ${_tp}/include/${_need})
      message(FATAL_ERROR "STEPWISE_THIRD_PARTY_DIR=${_tp} has no ${_need}; "
                          "run tools/stage-third-party ${_tp} on a machine with the packages")
    endif()
  endforeach()
  # IMPORTED, as find_package(nlohmann_json) makes it: install(EXPORT) then refers to it
  # by name instead of requiring it in stepwise's export set.
  add_library(nlohmann_json::nlohmann_json INTERFACE IMPORTED GLOBAL)
  set_target_properties(nlohmann_json::nlohmann_json PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES ${_tp}/include)
  if(STEPWISE_BUILD_TESTS)
    set(INSTALL_GTEST OFF CACHE BOOL "" FORCE)
    set(BUILD_GMOCK OFF CACHE BOOL "" FORCE)
    add_subdirectory(${_tp}/googletest ${CMAKE_BINARY_DIR}/third_party/googletest EXCLUDE_FROM_ALL)
    if(NOT TARGET GTest::gtest)
      add_library(GTest::gtest ALIAS gtest)
      add_library(GTest::gtest_main ALIAS gtest_main)
    endif()
  endif()
  set(STEPWISE_DOCTEST_INCLUDE_DIR ${_tp}/include)
  message(STATUS "stepwise: third-party sources from ${_tp}")
else()
  find_package(nlohmann_json 3 REQUIRED)
  if(STEPWISE_BUILD_TESTS)
    find_package(GTest)  # required by tests/ only (it says so when missing)
  endif()
  set(STEPWISE_DOCTEST_INCLUDE_DIR "")
endif()
if(STEPWISE_BUILD_TESTS)
  include(GoogleTest)
endif()

# xxHash's header (XXH3, inlined with XXH_INLINE_ALL into the library's sources that hash:
# src/hash_bytes.h), so the library links nothing more and an installed stepwise needs
# nothing of it in a user's project (NOTE: [installed dependencies]).
find_path(STEPWISE_XXHASH_INCLUDE_DIR xxhash.h HINTS ${STEPWISE_THIRD_PARTY_DIR}/include)
if(NOT STEPWISE_XXHASH_INCLUDE_DIR)
  message(FATAL_ERROR "xxhash.h not found: run tools/bootstrap (Debian's libxxhash-dev), or "
                      "configure with -DSTEPWISE_THIRD_PARTY_DIR (tools/stage-third-party)")
endif()
