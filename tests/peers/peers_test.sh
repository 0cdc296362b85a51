#!/usr/bin/env bash
# The peer benchmarks keep working: NIXL (UCX over shared memory and over
# tcp) and Mooncake (tcp) each move verified bytes between two processes on
# small sizes, hixl-bench runs the same rows, and compare.py puts them side by
# side. Creates (or reuses) the venv of tools/peers/setup.sh (PyPI).
#   peers_test.sh SOURCE_DIR BENCH_DIR WORK_DIR
set -euo pipefail
src=$1
bench=$2
work=$3
rm -rf "$work" && mkdir -p "$work"
py=$(bash "$src/tools/peers/setup.sh" "${HIXL_PEERS_VENV:-$src/build/peers-venv}")
sizes=(--blocks 4K,1M --batch 1,16 --threads 1,2 --op both)
fail() { echo "FAIL: $*" >&2; exit 1; }

run_peer() {  # peer path
  local out="$work/$1_$2.jsonl"
  timeout 300 "$py" "$src/tools/peers/peer_bench.py" --peer "$1" --path "$2" "${sizes[@]}" \
    --min-bytes 8M --reps 1 --verify >"$out" || fail "$1 over $2 exited $?"
  local rows
  rows=$(grep -c '"verified": true' "$out" || true)
  [ "$rows" = 16 ] || { cat "$out"; fail "$1 over $2: $rows verified rows, want 16"; }
  grep -q '"verified": false' "$out" && fail "$1 over $2 moved wrong bytes"
  echo "$1 over $2: $rows rows, bytes verified"
}
run_peer nixl shm
run_peer nixl tcp
run_peer mooncake tcp

for tp in shm tcp; do
  timeout 300 "$bench/hixl-bench" --transport "$tp" --blocks 4K,1M --batch 1,16 --threads 1,2 \
    --reps 1 --iters 20 --verify >"$work/hixl_$tp.jsonl" || fail "hixl-bench $tp"
done
/usr/bin/python3 "$src/tools/peers/compare.py" "$work/table.md" "$work/peers.png" \
  "$work"/hixl_*.jsonl -- "$work"/nixl_*.jsonl "$work"/mooncake_*.jsonl >/dev/null ||
  fail "compare.py"
rows=$(grep -c '^| \(shm\|tcp\) |' "$work/table.md" || true)
[ "$rows" = 32 ] || { cat "$work/table.md"; fail "the table has $rows rows, want 32"; }
[ -s "$work/peers.png" ] || fail "no plot"
echo "PASS peers: 3 peer configurations, $rows rows side by side"
