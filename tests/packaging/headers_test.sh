#!/usr/bin/env bash
# packaging:headers: every public header compiles on its own. The build force-includes
# the precompiled <torch/torch.h> into every target (NOTE: [precompiled LibTorch]), which
# hides a missing #include; here each header is the only line of a TU (twice, for the
# include guard), compiled -fsyntax-only with a consumer's flags and no PCH.
#
#   headers_test.sh FLAGS_FILE INCLUDE_DIR WORK_DIR [JOBS]
# FLAGS_FILE: key=value lines written by tests/packaging/CMakeLists.txt (compiler, flags,
# ;-lists of include dirs, definitions, options). Checks INCLUDE_DIR/stepwise/**/*.h.
set -euo pipefail
flags_file=$1
include_dir=$(realpath "$2")
work=$3
jobs=${4:-2}
declare -A cfg
while IFS='=' read -r key value; do cfg[$key]=$value; done <"$flags_file"

# gcc's #include_next breaks when a system directory is passed with -I: skip those, as
# CMake does (CMAKE_CXX_IMPLICIT_INCLUDE_DIRECTORIES).
declare -A implicit
IFS=';' read -ra dirs <<<"${cfg[implicit]}"
for d in "${dirs[@]}"; do
  if [[ -n $d ]]; then implicit[$(realpath -m "$d")]=1; fi
done
read -ra args <<<"${cfg[flags]}"
args+=(-fsyntax-only -I"$include_dir")
IFS=';' read -ra dirs <<<"${cfg[include]}"
for d in "${dirs[@]}"; do
  if [[ -n $d && -z ${implicit[$(realpath -m "$d")]:-} ]]; then args+=(-I"$d"); fi
done
IFS=';' read -ra defs <<<"${cfg[define]}"
for d in "${defs[@]}"; do if [[ -n $d ]]; then args+=(-D"$d"); fi; done
IFS=';' read -ra opts <<<"${cfg[option]}"
for o in "${opts[@]}"; do if [[ -n $o ]]; then args+=("$o"); fi; done

rm -rf "$work"
mkdir -p "$work"
check() {  # HEADER (relative to INCLUDE_DIR): writes NAME.log, and NAME.failed on failure
  local name=${1//\//_}
  local start=$SECONDS
  printf '#include <%s>\n#include <%s>\n' "$1" "$1" >"$work/$name.cpp"
  if "${cfg[compiler]}" "${args[@]}" "$work/$name.cpp" >"$work/$name.log" 2>&1; then
    echo "ok $1 ($((SECONDS - start)) s)"
  else
    touch "$work/$name.failed"
  fi
}
mapfile -t headers < <(cd "$include_dir" && find stepwise -name '*.h' | sort)
[[ ${#headers[@]} -gt 0 ]] || { echo "no headers under $include_dir/stepwise"; exit 1; }
for h in "${headers[@]}"; do
  check "$h" &
  while (($(jobs -rp | wc -l) >= jobs)); do wait -n || true; done
done
wait
status=0
for h in "${headers[@]}"; do
  name=${h//\//_}
  if [[ -e $work/$name.failed ]]; then
    echo "FAILED: $include_dir/$h does not compile on its own (alone, then included again; no PCH):"
    grep -m 8 -E 'error|required from' "$work/$name.log" || tail -n 8 "$work/$name.log"
    status=1
  fi
done
exit $status
