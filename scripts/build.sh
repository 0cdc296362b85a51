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
# The optional parts are on here (and so in CI): UCX transport, etcd discovery,
# CUDA device memory (the toolkit's headers; CUDAToolkit_ROOT or /usr/local/cuda).
args+=(-DHIXL_WITH_UCX=ON -DHIXL_WITH_ETCD=ON)
# HIXL_NO_CUDA=1 leaves CUDA out; so does a host with no toolkit (said below).
source scripts/cuda-lib.sh
if [ -z "${HIXL_NO_CUDA:-}" ]; then
  if cuda_args=$(hixl_cuda_args); then
    read -ra cuda_args <<< "$cuda_args"
    args+=("${cuda_args[@]}")
  else
    echo "build.sh: no CUDA toolkit found (CUDAToolkit_ROOT, nvcc, /usr/local/cuda): building without device memory" >&2
  fi
fi
cmake -S . -B "$dir" "${args[@]}" ${HIXL_CMAKE_ARGS:-} >/dev/null
cmake --build "$dir" -j "$(nproc)"
