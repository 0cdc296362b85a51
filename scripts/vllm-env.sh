#!/usr/bin/env bash
# Creates, or reuses when it is already complete, the virtual environment in
# which the vLLM connector (llm_datadist.vllm_connector) is tested: vLLM from
# PyPI at the pinned version, every dependency held by
# scripts/vllm-constraints.txt, and pytest.
#   scripts/vllm-env.sh [VENV_DIR]        (default build/vllm-venv)
# It is several GB (vLLM pulls a CUDA build of torch); on a host with no GPU
# vLLM runs its CPU platform (VLLM_TARGET_DEVICE=cpu). The interpreter is
# $HIXL_VLLM_PYTHON, else python3, as long as it has the minor version the
# Python modules are built for (scripts/venv-lib.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
VLLM_VERSION=0.33.0
PYTEST_VERSION=8.3.4
venv="${1:-build/vllm-venv}"

source scripts/venv-lib.sh
pinned_venv vllm-env "$venv" scripts/vllm-constraints.txt "vllm==$VLLM_VERSION" "pytest==$PYTEST_VERSION"
