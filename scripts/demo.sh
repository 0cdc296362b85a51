#!/usr/bin/env bash
# The main demonstration: sets up, builds, then runs hixl-pd-demo — a small
# transformer's prefill in one process and its decode in another, the paged
# KV cache pushed layer by layer through LLM-DataDist while prefill computes
# the next layer — beside a single-process reference (the tokens must match
# exactly) and the staged-socket path used before. Extra arguments go to the
# demo (e.g. --link tcp, --mode pull, --device cuda; --help lists them).
#
# Installs only the packages the demo's build needs and builds only the demo
# and the two libraries it links (in build-demo/, no tests, no optional
# transports): a few minutes on a fresh 2-core machine.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --demo
# --device cuda (KV caches in CUDA device memory, on a host with a GPU) needs
# the build with CUDA: the toolkit's headers, nothing linked.
cuda_args=()
case " $* " in
  *" --device cuda "*)
    source scripts/cuda-lib.sh
    if ! c=$(hixl_cuda_args); then
      echo "demo.sh: --device cuda needs the CUDA toolkit's headers (CUDAToolkit_ROOT, nvcc on PATH, or /usr/local/cuda)" >&2
      exit 2
    fi
    read -ra cuda_args <<< "$c" ;;
esac
cmake -S . -B build-demo -DCMAKE_BUILD_TYPE=Release -DHIXL_BUILD_TESTS=OFF \
  -DHIXL_BUILD_TOOLS=ON -DHIXL_WITH_UCX=OFF -DHIXL_WITH_ETCD=OFF "${cuda_args[@]}" >/dev/null
cmake --build build-demo -j "$(nproc)" --target hixl-pd-demo
exec build-demo/tools/hixl-pd-demo "$@"
