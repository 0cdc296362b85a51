#!/usr/bin/env bash
# Creates (or reuses) the virtual environment the peer benchmarks run in:
# build/peers-venv with NIXL and Mooncake Transfer Engine from PyPI, pinned.
#   tools/peers/setup.sh [VENV_DIR]      prints the venv's python on stdout
# nixl-cu12 is installed without its dependencies: it declares torch (several
# GB with CUDA), which its UCX backend does not need for host memory; numpy is
# the one dependency the benchmarks use. A venv whose pins match is reused.
set -euo pipefail
cd "$(dirname "$0")/../.."
venv="${1:-build/peers-venv}"
nixl=nixl-cu12==1.5.1
mooncake=mooncake-transfer-engine-non-cuda==0.3.13.post1
numpy=numpy==2.4.6
stamp="$venv/.hixl-peers-pins"
want="$nixl $mooncake $numpy"
if [ -x "$venv/bin/python" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
  echo "$venv/bin/python"
  exit 0
fi
rm -rf "$venv"
mkdir -p "$(dirname "$venv")"
# The interpreter first on PATH has pip and venv (Debian's needs python3-venv).
python3 -m venv "$venv" >&2
start=$(date +%s)
"$venv/bin/pip" install --quiet --disable-pip-version-check "$numpy" >&2
"$venv/bin/pip" install --quiet --disable-pip-version-check --no-deps "$nixl" "$mooncake" >&2
"$venv/bin/python" -c 'import nixl_cu12._api, mooncake.engine, numpy' >&2
echo "$want" >"$stamp"
echo "peers venv: $venv ready in $(( $(date +%s) - start )) s" >&2
echo "$venv/bin/python"
