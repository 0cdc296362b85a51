#!/usr/bin/env bash
# The GPU checks, on a machine with an NVIDIA GPU and its driver: builds hixl
# with CUDA (build-gpu/) and runs the device tests against the real driver
# (libcuda.so.1, or HIXL_CUDA_DRIVER) and the device benchmark
# (hixl-bench --device --verify) and LLM-DataDist's with device caches
# (hixl-kv-bench --mem cuda --verify, shm and tcp) and the demo with its KV
# caches in device memory (hixl-pd-demo --device cuda, shm push and tcp pull),
# then prints the tables.
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
cmake --build build-gpu -j "$(nproc)" --target hixl_device_tests hixl_test_peer hixl-bench hixl-kv-bench hixl-pd-demo \
  >/dev/null || exit 1

log=$(mktemp)
HIXL_TEST_REAL_CUDA=1 build-gpu/tests/device/hixl_device_tests --gtest_brief=0 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
bench=$(mktemp)
timeout 300 build-gpu/tools/hixl-bench --device --verify --reps 3 >"$bench" || rc=1
kv=$(mktemp)
for t in shm tcp; do
  timeout 300 build-gpu/tools/hixl-kv-bench --mem cuda --transport "$t" --verify --reps 3 >>"$kv" || rc=1
done
demo=()
for lm in "shm push" "tcp pull"; do
  set -- $lm
  if timeout 300 build-gpu/tools/hixl-pd-demo --device cuda --link "$1" --mode "$2" --quiet \
      > /dev/null 2>&1; then
    demo+=("| hixl-pd-demo --device cuda --link $1 --mode $2 | OK |")
  else
    demo+=("| hixl-pd-demo --device cuda --link $1 --mode $2 | FAILED |")
    rc=1
  fi
done

echo
echo "| check | result |"
echo "| --- | --- |"
grep -E '^\[ +(OK|FAILED|SKIPPED) +\] [A-Za-z/]+\.[A-Za-z]+' "$log" | sort -u |
  sed -E 's/^\[ +([A-Z]+) +\] ([^ ]+).*/| \2 | \1 |/'
printf '%s\n' "${demo[@]}"
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
echo
echo "| LLM-DataDist (device caches) | op | blocks | table | GB/s | engine batched GB/s | ratio |"
echo "| --- | --- | --- | --- | --- | --- | --- |"
python3 - "$kv" <<'EOF'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    print(f"| {r['transport']} {r['cache']} | {r['op']} | {r['blocks']} | {r['table']} | "
          f"{r['gbps']:.2f} | {r['baseline_gbps']:.2f} | {r['ratio']:.2f} |")
EOF
rm -f "$bench" "$kv"
echo
echo "gpu-check: exit $rc after $(( $(date +%s) - start )) s"
rm -f "$log"
exit "$rc"
