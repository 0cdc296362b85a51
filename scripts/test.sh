#!/usr/bin/env bash
# Sets up and runs every test: the release build, then AddressSanitizer+UBSan
# and ThreadSanitizer builds of the library and its tests, then a consumer
# project that uses the installed package through find_package(hixl).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --fuzz

export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$(pwd)/tests/tsan_ucx.supp"

# UCX's own signal handlers and malloc/mmap hooks fight the sanitizers.
# LeakSanitizer also reports what UCX keeps of its own at exit (tests/lsan_ucx.supp).
sanitizer_ucx_env() {
  export UCX_HANDLE_ERRORS=none UCX_MEM_MALLOC_HOOKS=n UCX_MEM_MMAP_HOOK_MODE=none
  export LSAN_OPTIONS="suppressions=$(pwd)/tests/lsan_ucx.supp"
}

run_ctest() {
  local dir="$1"
  echo "=== tests: $dir ==="
  (cd "$dir" && ctest --output-on-failure -j 2 --timeout 300)
}

bash scripts/build.sh release
run_ctest build

echo "=== python: the hixl and llm_datadist modules (pybind11) and their pytest tests ==="
HIXL_CMAKE_ARGS="-DHIXL_BUILD_PYTHON=ON -DPython3_EXECUTABLE=/usr/bin/python3" bash scripts/build.sh release
PYTHONPATH=build/python timeout 600 /usr/bin/python3 -m pytest -q -p no:cacheprovider python/tests

echo "=== python: pip install ./python into a fresh venv, then use the installed packages ==="
timeout 900 bash tests/python_packaging/pip_install_test.sh "$(pwd)" "$(pwd)/build/pip-test"

bash scripts/build.sh asan
sanitizer_ucx_env
run_ctest build-asan

bash scripts/build.sh tsan
run_ctest build-tsan

echo "=== fuzz: every parser of untrusted bytes under libFuzzer + ASan/UBSan, ${HIXL_FUZZ_SECONDS:-45} s each ==="
CC=clang-14 CXX=clang++-14 cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DHIXL_BUILD_FUZZERS=ON -DHIXL_BUILD_TESTS=OFF -DHIXL_BUILD_TOOLS=OFF -DHIXL_WITH_ETCD=ON >/dev/null
cmake --build build-fuzz -j "$(nproc)" --target hixl_fuzz_control hixl_fuzz_datadist hixl_fuzz_handle \
  hixl_fuzz_lane hixl_fuzz_discovery
for t in control datadist handle lane discovery; do
  work="build-fuzz/run-$t"
  rm -rf "$work" && mkdir -p "$work" && cp tests/fuzz/corpus/$t/* "$work/"
  # A crash, leak or sanitizer report ends the run non-zero (and set -e stops here).
  timeout 300 build-fuzz/tests/fuzz/hixl_fuzz_$t -max_total_time="${HIXL_FUZZ_SECONDS:-45}" \
    -rss_limit_mb=4096 -artifact_prefix="build-fuzz/crash-$t-" "$work" 2>&1 | tail -3
  echo "fuzz $t: no crash"
done

echo "=== package: install + find_package(hixl) ==="
prefix="$(pwd)/build/install-test"
rm -rf "$prefix" build/consumer
cmake --install build --prefix "$prefix" >/dev/null
cmake -S tests/package_consumer -B build/consumer -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build build/consumer -j "$(nproc)" >/dev/null
build/consumer/hixl_consumer
echo "=== package: the Python packages cmake --install put under the prefix ==="
(cd /tmp && PYTHONPATH="$prefix/lib/python3/dist-packages" /usr/bin/python3 "$OLDPWD/tests/python_packaging/smoke.py")

echo "all test stages passed"
