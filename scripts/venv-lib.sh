# Sourced by the scripts that make virtual environments from PyPI
# (vllm-env.sh, vllm-cpu-env.sh).
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
