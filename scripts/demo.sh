#!/usr/bin/env bash
# The main demonstration: sets up, builds, then two processes on localhost
# move a 128 MiB buffer by one-sided WRITE and print GB/s beside memcpy.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh release
exec build/examples/hixl-shm-demo "$@"
