#!/usr/bin/env bash
# Installs what hixl needs to build and test, from Debian's packages.
# Idempotent: does nothing when everything is already installed.
#   scripts/setup.sh           everything the builds and tests need
#   scripts/setup.sh --fuzz    and clang with libFuzzer (the fuzz stage)
#   scripts/setup.sh --demo    only what building hixl-pd-demo needs (scripts/demo.sh)
set -euo pipefail

# The libraries and the demo: a C++20 compiler, CMake, nlohmann-json, OpenSSL.
DEMO_PACKAGES=(cmake make g++ gcc nlohmann-json3-dev libssl-dev)
PACKAGES=("${DEMO_PACKAGES[@]}" libgtest-dev iproute2)
# Authentication of peers (HMAC-SHA256): OpenSSL's libcrypto.
PACKAGES+=(libssl-dev)
# The UCX transport (HIXL_WITH_UCX) and ucx_perftest, its bench baseline.
PACKAGES+=(pkg-config libucx-dev ucx-utils)
# etcd discovery (HIXL_WITH_ETCD): libcurl for the v3 JSON gateway, and etcd
# itself for the tests (they start their own on free loopback ports).
PACKAGES+=(libcurl4-openssl-dev etcd-server)
# Injected network faults between namespaces (tests/fault): nftables rules.
PACKAGES+=(nftables)
# The Python modules hixl and llm_datadist: pybind11, numpy, pytest and torch
# (CPU tensors as cache memory) from Debian, used with /usr/bin/python3.
PACKAGES+=(python3-dev python3-pybind11 pybind11-dev python3-numpy python3-pytest python3-torch)
# The performance pictures (tools/plots/*.py) and their test.
PACKAGES+=(python3-matplotlib)
# scripts/stress.sh --hog: the CPU hog beside repeated test runs.
PACKAGES+=(stress-ng)
# The Debian packages of the package stage (cpack -G DEB runs dpkg-shlibdeps
# and file), and pkg-config for its consumer checks.
PACKAGES+=(dpkg-dev file)

# scripts/setup.sh --fuzz: also clang and libFuzzer's runtime (the fuzz stage of scripts/test.sh).
case "${1:-}" in
  --fuzz) PACKAGES+=(clang-14 libclang-rt-14-dev) ;;
  --demo) PACKAGES=("${DEMO_PACKAGES[@]}") ;;
  "") ;;
  *) echo "usage: $0 [--fuzz|--demo]" >&2; exit 2 ;;
esac

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
