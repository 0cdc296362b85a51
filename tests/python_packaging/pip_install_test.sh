#!/usr/bin/env bash
# `pip install ./python` into a fresh venv (Debian's pip, with the system site
# packages for numpy, setuptools, wheel and pybind11; no package index), then
# the installed packages move bytes.
#   pip_install_test.sh SOURCE_DIR WORK_DIR
set -euo pipefail
src="$1"
work="$2"
rm -rf "$work"
mkdir -p "$work"
/usr/bin/python3 -m venv --system-site-packages "$work/venv"
cp -r "$src/python" "$work/python"   # pip builds in the tree it is given: keep the source clean
ln -s "$src/CMakeLists.txt" "$work/CMakeLists.txt"
for d in cmake include src examples tools tests; do ln -s "$src/$d" "$work/$d"; done
HIXL_BUILD_JOBS="${HIXL_BUILD_JOBS:-2}" "$work/venv/bin/pip" install --no-build-isolation --no-deps \
  --no-index -q "$work/python"
cd "$work"
"$work/venv/bin/python" "$src/tests/python_packaging/smoke.py"
