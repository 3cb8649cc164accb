#!/usr/bin/env bash
# The GPU machine's path, checked here: stage the third-party sources (as
# tools/stage-third-party does for tools/gpu-check), configure stepwise with them
# instead of Debian's packages, and build GoogleTest from the staged sources.
#
#   offline_configure_test.sh SOURCE_DIR WORK_DIR
set -euo pipefail
src=$1
work=$2
rm -rf "$work"
mkdir -p "$work"
"$src/tools/stage-third-party" "$work/third_party"
cmake -S "$src" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DSTEPWISE_THIRD_PARTY_DIR="$work/third_party" -DSTEPWISE_DOCS_SITE_TESTS=OFF \
  -DSTEPWISE_BUILD_BENCHMARKS=OFF >"$work/configure.log" 2>&1 || {
  tail -n 30 "$work/configure.log"
  exit 1
}
grep -q "stepwise: third-party sources from $work/third_party" "$work/configure.log" || {
  echo "configure did not use the staged sources:"
  grep 'stepwise:' "$work/configure.log"
  exit 1
}
grep -q "/usr/src/googletest" "$work/build/CMakeCache.txt" && {
  echo "the build still refers to Debian's googletest"
  exit 1
}
# The installed config makes nlohmann_json's target from the staged headers (NOTE:
# [installed dependencies]), as the build did.
grep -q "_stepwise_nlohmann_staged \"$work/third_party/include\"" "$work/build/stepwiseConfig.cmake" || {
  echo "stepwiseConfig.cmake does not record the staged nlohmann-json headers"
  exit 1
}
cmake --build "$work/build" -j 1 --target gtest gtest_main >"$work/build.log" 2>&1 || {
  tail -n 30 "$work/build.log"
  exit 1
}
echo "offline configure: staged GoogleTest, nlohmann-json and doctest used and built"
