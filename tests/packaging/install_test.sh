#!/usr/bin/env bash
# packaging:install (the fixture stepwise_install): `cmake --install` of the build
# into a fresh prefix, which the consumer tests then use.
#
#   install_test.sh CMAKE BUILD_DIR PREFIX
set -euo pipefail
# shellcheck source=tests/packaging/common.sh
source "$(dirname "$0")/common.sh"
cmake=$1 build=$2 prefix=$3
rm -rf "$prefix"  # no headers left over from an older install
logged "$build/install-prefix.log" "$cmake" --install "$build" --prefix "$prefix"
config=$(find "$prefix" -name stepwiseConfig.cmake -print -quit)
[[ -n $config ]] || { echo "no stepwiseConfig.cmake under $prefix"; exit 1; }
echo "installed $(find "$prefix" -type f | wc -l) files into $prefix (${config#"$prefix"/})"
