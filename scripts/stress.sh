#!/usr/bin/env bash
# Runs test suites again and again, optionally beside a CPU hog, and prints how
# often each test failed: a test that passes only when the machine is idle is
# found here rather than in CI (docs/TESTING.md).
#
#   scripts/stress.sh SUITE... [--runs N] [--hog [WORKERS]] [--jobs J] [-- CTEST_ARGS...]
#
#   SUITE        release, asan or tsan (the builds of scripts/build.sh: build/,
#                build-asan/, build-tsan/), optionally with a label: tsan:discovery
#                runs `ctest -L discovery` in build-tsan/. A build that is not
#                there is built first.
#   --runs N     rounds (default 3); each round runs every SUITE once
#   --hog [W]    stress-ng --cpu W (default: one worker per core) runs the whole
#                time, at the tests' own priority
#   --jobs J     tests run side by side (default 2, as scripts/test.sh)
#   CTEST_ARGS   passed to every ctest run (e.g. -R Etcd)
#
# Exit status 0 only when no test failed in any round. Logs: build/stress/.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$(pwd)"
source scripts/test-env.sh

suites=() runs=3 hog=0 workers="$(nproc)" jobs=2 extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) runs="$2"; shift 2 ;;
    --hog)
      hog=1; shift
      if [ $# -gt 0 ] && [[ "$1" =~ ^[0-9]+$ ]]; then workers="$1"; shift; fi ;;
    --jobs) jobs="$2"; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    release|asan|tsan|release:*|asan:*|tsan:*) suites+=("$1"); shift ;;
    *) sed -n '2,20p' "$0" >&2; exit 2 ;;
  esac
done
[ ${#suites[@]} -gt 0 ] || { sed -n '2,20p' "$0" >&2; exit 2; }

dir_of() { case "$1" in release) echo build ;; *) echo "build-$1" ;; esac; }
for s in "${suites[@]}"; do
  flavour="${s%%:*}"
  [ -f "$(dir_of "$flavour")/CTestTestfile.cmake" ] || bash scripts/build.sh "$flavour"
done

logs="$root/build/stress"
mkdir -p "$logs"
hog_pid=""
stop_hog() { [ -n "$hog_pid" ] && kill "$hog_pid" 2>/dev/null && wait "$hog_pid" 2>/dev/null; hog_pid=""; }
trap stop_hog EXIT
if [ "$hog" = 1 ]; then
  command -v stress-ng >/dev/null || { echo "stress.sh: --hog needs stress-ng (apt-get install stress-ng)" >&2; exit 2; }
  # Bounded like every process the tests start: at most 6 hours, ended at exit.
  stress-ng --cpu "$workers" --timeout 6h --quiet &
  hog_pid=$!
  echo "stress: CPU hog stress-ng --cpu $workers (pid $hog_pid)"
fi

declare -A fails=() ran=()
total_fail=0
for ((r = 1; r <= runs; r++)); do
  for s in "${suites[@]}"; do
    flavour="${s%%:*}" label=""
    [ "$s" != "$flavour" ] && label="${s#*:}"
    dir="$(dir_of "$flavour")"
    args=(-j "$jobs" --timeout 300 --output-on-failure --output-junit "$logs/$flavour-$r.xml")
    [ -n "$label" ] && args+=(-L "$label")
    log="$logs/${s//:/-}-$r.log"
    t0=$(date +%s)
    (hixl_test_env "$root" "$flavour" && cd "$dir" && ctest "${args[@]}" "${extra[@]}") >"$log" 2>&1 || true
    # Counts from the JUnit file: every test that ran, and those that failed.
    mapfile -t lines < <(python3 - "$logs/$flavour-$r.xml" <<'EOF'
import sys, xml.etree.ElementTree as ET
for c in ET.parse(sys.argv[1]).iter("testcase"):
    bad = c.get("status") == "fail" or c.find("failure") is not None or c.find("error") is not None
    print(("F " if bad else "P ") + c.get("name"))
EOF
    )
    n_fail=0
    for l in "${lines[@]}"; do
      name="${l:2}"
      ran["$s|$name"]=$(( ${ran["$s|$name"]:-0} + 1 ))
      if [ "${l:0:1}" = F ]; then
        fails["$s|$name"]=$(( ${fails["$s|$name"]:-0} + 1 )); n_fail=$((n_fail + 1))
      fi
    done
    total_fail=$((total_fail + n_fail))
    echo "stress: round $r/$runs $s: ${#lines[@]} tests, $n_fail failed, $(( $(date +%s) - t0 )) s ($log)"
  done
done
stop_hog

echo
if [ "$total_fail" -eq 0 ]; then
  echo "stress: no failures in $runs round(s) of ${suites[*]}$([ "$hog" = 1 ] && echo " beside the CPU hog")"
  exit 0
fi
echo "stress: failures per test (failed/ran):"
for k in "${!fails[@]}"; do
  printf '  %3d/%-3d %s\n' "${fails[$k]}" "${ran[$k]}" "$k"
done | sort -rn
exit 1
