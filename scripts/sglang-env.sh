#!/usr/bin/env bash
# Creates, or reuses when it is already complete, the virtual environment in
# which the SGLang transfer backend (hixl.sglang) is tested: SGLang from PyPI
# at the pinned version, every dependency held by scripts/sglang-constraints.txt,
# and pytest. Its own environment: SGLang's pins (transformers, torch) are not
# vLLM's.
#   scripts/sglang-env.sh [VENV_DIR]        (default build/sglang-venv)
# About 11 GB: SGLang pulls a CUDA build of torch and its CUDA kernels. The
# tests import SGLang's disaggregation code and drive it without a GPU; no
# model is served. The interpreter is $HIXL_VLLM_PYTHON, else python3, as long
# as it has the minor version the Python modules are built for
# (scripts/venv-lib.sh); SGLang publishes CPython 3.11 wheels.
set -euo pipefail
cd "$(dirname "$0")/.."
SGLANG_VERSION=0.5.23
PYTEST_VERSION=8.3.4
venv="${1:-build/sglang-venv}"

source scripts/venv-lib.sh
pinned_venv sglang-env "$venv" scripts/sglang-constraints.txt "sglang==$SGLANG_VERSION" "pytest==$PYTEST_VERSION"
