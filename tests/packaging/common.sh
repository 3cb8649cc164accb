# shellcheck shell=bash
# Sourced by the tests/packaging scripts.

# logged LOG CMD...: runs CMD with its output in LOG; on failure shows LOG's end and exits.
logged() {
  local log=$1
  shift
  "$@" >"$log" 2>&1 || {
    echo "failed: $* (last lines of $log):"
    tail -n 30 "$log"
    exit 1
  }
}
