#!/usr/bin/env bash
# packaging:add-subdirectory: tests/packaging/parent adds the repository with
# add_subdirectory() (NOTE: [subproject defaults]). Configuring it must neither look
# for nor make tests, docs, benchmarks or examples; the parent's program must get
# stepwise's include path and no precompiled header.
#
# Only a dry run (-n) of the parent's program: really building it compiles the whole
# library again (~5 min on 2 cores), too much for CI; packaging:consumer compiles and
# runs the same main.cpp against the installed library.
#
#   add_subdirectory_test.sh CMAKE SOURCE_DIR WORK_DIR GENERATOR MAKE_PROGRAM CXX [ARG...]
# ARGs: more configure arguments (Torch_DIR; with a CUDA LibTorch, CMAKE_CUDA_COMPILER).
set -euo pipefail
# shellcheck source=tests/packaging/common.sh
source "$(dirname "$0")/common.sh"
cmake=$1 src=$2 work=$3 generator=$4 make_program=$5 cxx=$6
shift 6
rm -rf "$work"
mkdir -p "$work"
logged "$work/configure.log" "$cmake" -S "$src/tests/packaging/parent" -B "$work/build" \
  -G "$generator" -DCMAKE_MAKE_PROGRAM="$make_program" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CXX_COMPILER="$cxx" -DSTEPWISE_SOURCE_DIR="$src" "$@"
# What a test or docs build would have looked for (GoogleTest, Google Benchmark,
# Python/MkDocs/Doxygen for the docs, nvcc for the kernels' tests: unless a CUDA
# LibTorch needs it anyway, and it was given).
looked_for='GTest_DIR|GTEST_[A-Z_]*|benchmark_DIR|STEPWISE_DOCS_PYTHON'
looked_for+='|[A-Z_]*MKDOCS[A-Z_]*|DOXYGEN_[A-Z_]*'
[[ " $* " == *" -DCMAKE_CUDA_COMPILER="* ]] || looked_for+='|CMAKE_CUDA_COMPILER'
if grep -E "^($looked_for)[:=]" "$work/build/CMakeCache.txt"; then
  echo "the parent's configure looked for test or docs tools (cache entries above)"
  exit 1
fi

# The real targets (not CMake's utility targets, object files or paths): only these.
logged "$work/targets.log" "$cmake" --build "$work/build" --target help
allowed=' parent_app stepwise stepwise_pch stepwise_cuda_kernels '  # kernels: CUDA LibTorch
unexpected=()
while read -r line; do
  t=${line#... }
  t=${t%%:*}
  case $t in
    '' | *[/.\ ]* | all | clean | help | install | edit_cache | rebuild_cache) ;;
    list_install_components | cmake_object_order_depends_target_*) ;;
    *) [[ $allowed == *" $t "* ]] || unexpected+=("$t") ;;
  esac
done <"$work/targets.log"
if ((${#unexpected[@]})); then
  echo "targets a parent project should not get: ${unexpected[*]}"
  exit 1
fi
# (Ninja's help lists parent_app only by its file, not as a target: the dry run checks it.)
dry_run=(-n)  # make -n prints the commands; ninja needs -v for that
[[ $generator == Ninja* ]] && dry_run+=(-v)
logged "$work/dry-run.log" "$cmake" --build "$work/build" --target parent_app -- "${dry_run[@]}"
compile=$(grep -E ' -c [^ ]*examples/consumer/main\.cpp' "$work/dry-run.log" || true)
[[ -n $compile ]] || {
  echo "the dry run compiles no main.cpp:"
  tail -n 5 "$work/dry-run.log"
  exit 1
}
[[ $compile == *"-I$src/include"* || $compile == *"-isystem $src/include"* ]] || {
  echo "main.cpp is compiled without $src/include: $compile"
  exit 1
}
[[ $compile != *cmake_pch* ]] || { echo "main.cpp is compiled with stepwise's PCH"; exit 1; }
echo "add_subdirectory: no test, docs, benchmark or example targets; main.cpp compiled without PCH"
