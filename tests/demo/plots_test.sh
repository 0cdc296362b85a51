#!/usr/bin/env bash
# The benchmark's --verify mode on small sizes, the KV benchmark and a small
# demo run, then the plot scripts on their output: the PNGs exist and are
# non-empty.
#   plots_test.sh TOOLS_DIR WORK_DIR SOURCE_DIR
set -euo pipefail
tools="$1" work="$2" src="$3"
rm -rf "$work"
mkdir -p "$work"
"$tools/hixl-bench" --blocks 4K,64K,1M --threads 1 --reps 1 --verify > "$work/shm.jsonl"
"$tools/hixl-bench" --transport tcp --blocks 64K,1M --threads 1 --reps 1 --verify > "$work/tcp.jsonl"
grep -q '"verified":true' "$work/shm.jsonl"
# The tcp latency row carries both ping-pong references (docs/benchmarks.md).
"$tools/hixl-bench" --transport tcp --latency --threads 1 --iters 200 --reps 1 > "$work/lat.jsonl"
/usr/bin/python3 - "$work/lat.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
assert len(rows) == 1, rows
r = rows[0]
assert r["baseline"] == "pingpong" and r["ratio_of"] == "p50_us", r
for k in ("p50_us", "baseline_p50_us", "pingpong_spin_p50_us", "spin_ratio"):
    assert r[k] > 0, (k, r)
PY
"$tools/hixl-pd-demo" --quiet --requests 3 --prompt-lens 24,50,81 --gen-tokens 4 --layers 3 --heads 4 \
  --kv-heads 2 --head-dim 16 --mlp-dim 64 --vocab 256 --block-size 8 --no-before \
  --timeline "$work/timeline.json" > "$work/demo.txt"
/usr/bin/python3 "$src/tools/plots/plot_bench.py" "$work/bandwidth.png" "$work/shm.jsonl" "$work/tcp.jsonl"
/usr/bin/python3 "$src/tools/plots/plot_timeline.py" "$work/timeline.png" "$work/timeline.json"
for f in bandwidth.png timeline.png; do
  [ -s "$work/$f" ] || { echo "FAILED: $f is missing or empty"; exit 1; }
  head -c 8 "$work/$f" | od -An -c | grep -q "P   N   G" || { echo "FAILED: $f is not a PNG"; exit 1; }
done
echo "plots: OK ($(stat -c %s "$work/bandwidth.png") and $(stat -c %s "$work/timeline.png") bytes)"
