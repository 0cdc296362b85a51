#!/usr/bin/env bash
# The GPU checks, on a machine with an NVIDIA GPU and its driver: builds hixl
# with CUDA (build-gpu/) and runs the device tests against the real driver
# (libcuda.so.1, or HIXL_CUDA_DRIVER) and the device benchmark
# (hixl-bench --device --verify), then prints one summary table.
#   scripts/gpu-check.sh
# Needs the CUDA toolkit's headers (CUDAToolkit_ROOT, nvcc, or /usr/local/cuda),
# cmake, a C++20 compiler, GoogleTest and the libraries of scripts/setup.sh.
set -uo pipefail
cd "$(dirname "$0")/.."

start=$(date +%s)
nvidia-smi -L 2>/dev/null || echo "gpu-check: nvidia-smi is not available" >&2
root="${CUDAToolkit_ROOT:-/usr/local/cuda}"
cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=RelWithDebInfo -DHIXL_WITH_CUDA=ON \
  -DCUDAToolkit_ROOT="$root" >/dev/null || exit 1
cmake --build build-gpu -j "$(nproc)" --target hixl_device_tests hixl_test_peer hixl-bench \
  >/dev/null || exit 1

log=$(mktemp)
HIXL_TEST_REAL_CUDA=1 build-gpu/tests/device/hixl_device_tests --gtest_brief=0 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
bench=$(mktemp)
timeout 300 build-gpu/tools/hixl-bench --device --verify --reps 3 >"$bench" || rc=1

echo
echo "| check | result |"
echo "| --- | --- |"
grep -E '^\[ +(OK|FAILED|SKIPPED) +\] [A-Za-z]+\.[A-Za-z]+' "$log" | sort -u |
  sed -E 's/^\[ +([A-Z]+) +\] ([^ ]+).*/| \2 | \1 |/'
echo
echo "| path | via | op | bytes | GB/s | baseline GB/s | ratio | baseline |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- |"
python3 - "$bench" <<'EOF'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    print(f"| {r['path']} | {r['transport']} | {r['op']} | {r['bytes']} | {r['gbps']:.2f} | "
          f"{r['base_gbps']:.2f} | {r['ratio']:.2f} | {r['baseline']} |")
EOF
rm -f "$bench"
echo
echo "gpu-check: exit $rc after $(( $(date +%s) - start )) s"
rm -f "$log"
exit "$rc"
