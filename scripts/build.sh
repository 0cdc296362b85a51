#!/usr/bin/env bash
# Configures and builds one flavour of hixl.
#   scripts/build.sh [release|asan|tsan]   (default: release)
# Build trees: build/ (release), build-asan/, build-tsan/.
set -euo pipefail
cd "$(dirname "$0")/.."

flavour="${1:-release}"
case "$flavour" in
  release) dir=build;      args=(-DCMAKE_BUILD_TYPE=RelWithDebInfo) ;;
  asan)    dir=build-asan; args=(-DCMAKE_BUILD_TYPE=Debug -DHIXL_SANITIZE=address -DHIXL_BUILD_TOOLS=OFF) ;;
  tsan)    dir=build-tsan; args=(-DCMAKE_BUILD_TYPE=Debug -DHIXL_SANITIZE=thread -DHIXL_BUILD_TOOLS=OFF) ;;
  *) echo "usage: $0 [release|asan|tsan]" >&2; exit 2 ;;
esac
# The optional parts are on here (and so in CI): UCX transport, etcd discovery.
args+=(-DHIXL_WITH_UCX=ON -DHIXL_WITH_ETCD=ON)
cmake -S . -B "$dir" "${args[@]}" ${HIXL_CMAKE_ARGS:-} >/dev/null
cmake --build "$dir" -j "$(nproc)"
