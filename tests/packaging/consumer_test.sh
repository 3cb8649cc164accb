#!/usr/bin/env bash
# packaging:consumer: examples/consumer, a project with only find_package(stepwise),
# configured against the install prefix (CMAKE_PREFIX_PATH and nothing else: the
# config finds LibTorch and nlohmann_json itself), built, run and its output checked.
#
#   consumer_test.sh CMAKE SOURCE_DIR WORK_DIR PREFIX GENERATOR MAKE_PROGRAM CXX [ARG...]
# ARGs: more configure arguments (-DCMAKE_CUDA_COMPILER with a CUDA LibTorch).
set -euo pipefail
# shellcheck source=tests/packaging/common.sh
source "$(dirname "$0")/common.sh"
cmake=$1 src=$2 work=$3 prefix=$4 generator=$5 make_program=$6 cxx=$7
shift 7
rm -rf "$work"
mkdir -p "$work"
t0=$SECONDS
logged "$work/configure.log" "$cmake" -S "$src" -B "$work/build" -G "$generator" \
  -DCMAKE_MAKE_PROGRAM="$make_program" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_PREFIX_PATH="$prefix" "$@"
found=$(sed -n 's/^stepwise_DIR:PATH=//p' "$work/build/CMakeCache.txt")
[[ $found == "$prefix"/* ]] || { echo "stepwise found at '$found', not in $prefix"; exit 1; }
t1=$SECONDS
logged "$work/build.log" "$cmake" --build "$work/build"
t2=$SECONDS
"$work/build/stepwise_consumer" | tee "$work/run.log"
grep -Eq '^stepwise consumer: 4 optimizer steps, 8 micro-batches, loss [0-9.]+ -> [0-9.]+$' \
  "$work/run.log" || { echo "unexpected output (see above)"; exit 1; }
echo "consumer: configure $((t1 - t0)) s, build $((t2 - t1)) s, run $((SECONDS - t2)) s"
