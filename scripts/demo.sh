#!/usr/bin/env bash
# The main demonstration: sets up, builds, then runs hixl-pd-demo — a small
# transformer's prefill in one process and its decode in another, the paged
# KV cache pushed layer by layer through LLM-DataDist while prefill computes
# the next layer — beside a single-process reference (the tokens must match
# exactly) and the staged-socket path used before. Extra arguments go to the
# demo (e.g. --link tcp, --mode pull; --help lists them).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh release
exec build/tools/hixl-pd-demo "$@"
