#!/usr/bin/env bash
# Checks an installed hixl as a user meets it, from outside the source and
# build trees, with no LD_LIBRARY_PATH:
#   - every installed program and library finds its libraries (ldd);
#   - each program answers --help, and the demo serves one small request;
#   - `import hixl` and `import llm_datadist` each in a fresh interpreter,
#     alone and in both orders, then the packages move bytes (smoke.py);
#   - C programs built with pkg-config alone (hixl.pc): the engine's C API,
#     and HiXL CS (a server and a client over tcp on 127.0.0.1, a free
#     port), and a C++ one with llm_datadist.pc, run;
#   - a CMake project finds the package (find_package(hixl)) and runs.
#
#   check_installed.sh SOURCE_DIR PREFIX [PYTHON_DIR]
#
# PREFIX: what was installed (cmake --install --prefix P, or /usr for the
# .deb). PYTHON_DIR: where the Python packages are (default
# PREFIX/lib/python3/dist-packages; under /usr the interpreter finds them
# itself and PYTHONPATH stays unset). Exit 0 only when every check passed.
set -euo pipefail
src="$(cd "$1" && pwd)"
prefix="$2"
pydir="${3:-$prefix/lib/python3/dist-packages}"
py=/usr/bin/python3

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cd "$work"
unset LD_LIBRARY_PATH PYTHONPATH PKG_CONFIG_PATH CMAKE_PREFIX_PATH

fail() { echo "check_installed: FAILED: $*" >&2; exit 1; }
step() { echo "check_installed: $*"; }

libdir=""
for d in "$prefix/lib" "$prefix/lib/$(gcc -print-multiarch 2>/dev/null || echo none)"; do
  [ -e "$d/libhixl.so.0" ] && libdir="$d"
done
[ -n "$libdir" ] || fail "no libhixl.so.0 under $prefix/lib"
programs=(hixl-info hixl-bench hixl-kv-bench hixl-pd-demo)

# 1. Run paths: nothing installed depends on where it was built.
for f in "$libdir"/libhixl.so.0 "$libdir"/libllm_datadist.so.0 "${programs[@]/#/$prefix/bin/}" \
         "$pydir"/hixl/_hixl*.so "$pydir"/llm_datadist/_llm_datadist*.so; do
  [ -e "$f" ] || fail "$f is not installed"
  deps="$(ldd "$f" 2>&1)" || fail "ldd $f: $deps"
  if grep -q "not found" <<<"$deps"; then echo "$deps" >&2; fail "$f: a library is not found"; fi
done
step "every program and library finds its libraries ($libdir)"

# 2. Programs.
for p in "${programs[@]}"; do
  out="$("$prefix/bin/$p" --help 2>&1)" || fail "$p --help exited $?"
  [ -n "$out" ] || fail "$p --help printed nothing"
done
step "${programs[*]}: --help"
timeout 120 "$prefix/bin/hixl-pd-demo" --quiet --requests 1 --prompt-lens 24 --gen-tokens 4 \
  --layers 2 --heads 4 --kv-heads 2 --head-dim 16 --mlp-dim 64 --vocab 256 --block-size 8 \
  --no-before >demo.log 2>&1 || { cat demo.log >&2; fail "hixl-pd-demo with one request"; }
step "hixl-pd-demo served one request ($(grep -c . demo.log) lines of output)"
timeout 60 "$prefix/bin/hixl-info" --json >info.json || fail "hixl-info --json exited $?"
$py -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["version"], d' info.json ||
  fail "hixl-info --json is not the expected JSON"
step "hixl-info --json"

# 3. Python: each package alone, and both orders, each in a fresh interpreter.
pyenv=()
case "$pydir" in /usr/lib/python3/dist-packages) ;; *) pyenv=(env "PYTHONPATH=$pydir") ;; esac
for mods in "hixl" "llm_datadist" "hixl llm_datadist" "llm_datadist hixl"; do
  code="import sys, os"
  for m in $mods; do
    code+="; import $m; assert os.path.realpath($m.__file__).startswith(os.path.realpath('$pydir')), $m.__file__"
  done
  "${pyenv[@]}" $py -c "$code" || fail "python: import $mods"
done
step "python: import hixl, llm_datadist, each alone and in both orders"
"${pyenv[@]}" $py "$src/tests/python_packaging/smoke.py" >smoke.log 2>&1 || {
  cat smoke.log >&2
  fail "python: the installed packages do not move bytes"
}
step "python: $(tail -1 smoke.log)"

# 4. pkg-config.
pcpath=()
[ "$prefix" = /usr ] || pcpath=(env "PKG_CONFIG_PATH=$libdir/pkgconfig")
pcver="$("${pcpath[@]}" pkg-config --modversion hixl 2>&1)" || fail "pkg-config hixl: $pcver"
pclib="$("${pcpath[@]}" pkg-config --variable=libdir hixl 2>&1)" || fail "pkg-config hixl: $pclib"
rpath="-Wl,-rpath,$pclib"
# shellcheck disable=SC2046
gcc -std=c99 -Wall -Werror "$src/tests/install/c_consumer.c" -o c_consumer \
  $("${pcpath[@]}" pkg-config --cflags --libs hixl) "$rpath" || fail "cc with pkg-config hixl"
./c_consumer || fail "the C program built with pkg-config"
# shellcheck disable=SC2046
gcc -std=c99 -Wall -Werror "$src/tests/install/cs_consumer.c" -o cs_consumer \
  $("${pcpath[@]}" pkg-config --cflags --libs hixl) "$rpath" || fail "cc with pkg-config hixl (HiXL CS)"
# A free port from the kernel; another process may take it before the server
# listens, so a Listen that fails is tried again on a new port (3 tries).
free_port() {
  $py -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
for try in 1 2 3; do
  port="$(free_port)" || fail "no free port on 127.0.0.1 for cs_consumer"
  if timeout 60 ./cs_consumer "$port" >cs.log 2>&1; then break; fi
  grep -q "HixlCSServerListen" cs.log && [ "$try" -lt 3 ] && continue
  cat cs.log >&2
  fail "the HiXL CS program built with pkg-config (port $port)"
done
grep -q "^cs_consumer: OK$" cs.log || { cat cs.log >&2; fail "cs_consumer did not say OK"; }
# shellcheck disable=SC2046
g++ -std=c++20 "$src/tests/package_consumer/main.cc" -o cxx_consumer \
  $("${pcpath[@]}" pkg-config --cflags --libs llm_datadist) "$rpath" -pthread ||
  fail "c++ with pkg-config llm_datadist"
./cxx_consumer >cxx.log || { cat cxx.log >&2; fail "the C++ program built with pkg-config"; }
step "pkg-config: hixl $pcver, two C programs (engine, HiXL CS) and a C++ program"

# 5. CMake.
cmake -S "$src/tests/package_consumer" -B cmake-consumer -DCMAKE_PREFIX_PATH="$prefix" >/dev/null ||
  fail "find_package(hixl) with CMAKE_PREFIX_PATH=$prefix"
cmake --build cmake-consumer -j "$(nproc)" >/dev/null || fail "the CMake consumer does not build"
cmake-consumer/hixl_consumer >cmake.log || { cat cmake.log >&2; fail "the CMake consumer"; }
step "cmake: find_package(hixl), hixl::hixl and hixl::llm_datadist"
echo "check_installed: $prefix passed every check"
