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

have_all() {
  [ -x "$venv/bin/python" ] && "$venv/bin/python" - "$VLLM_VERSION" "$PYTEST_VERSION" <<'PY' 2>/dev/null
import importlib.metadata as m, sys
sys.exit(0 if (m.version("vllm"), m.version("pytest")) == tuple(sys.argv[1:3]) else 1)
PY
}
if have_all; then
  echo "vllm-env: reusing $venv (vllm $VLLM_VERSION)"
  exit 0
fi

source scripts/venv-lib.sh
new_venv "$venv"
t0=$(date +%s)
"$venv/bin/python" -m pip install -q --disable-pip-version-check \
  -c scripts/vllm-constraints.txt "vllm==$VLLM_VERSION" "pytest==$PYTEST_VERSION"
have_all || { echo "vllm-env: $venv is incomplete after the install" >&2; exit 1; }
echo "vllm-env: installed vllm $VLLM_VERSION into $venv with $venv_py in $(( $(date +%s) - t0 )) s ($(du -sh "$venv" | cut -f1))"
