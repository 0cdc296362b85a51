#!/usr/bin/env bash
# Regenerates every table and picture of docs/PERFORMANCE.md on this machine:
# the engine's bandwidth sweeps (shm, tcp) beside their same-run baselines,
# many-to-one, registered application memory, the 4 KiB async stream, the
# notification latencies, the LLM-DataDist KV benchmark, and the demo's runs and
# per-layer timeline. Results land in docs/figures/ (JSON lines + PNG).
#   scripts/performance.sh [--quick]    --quick: fewer sizes and repetitions
#   scripts/performance.sh --peers [--quick]
#       only hixl beside NIXL (UCX over shared memory and over tcp) and
#       Mooncake Transfer Engine (tcp), from PyPI into build/peers-venv
#       (tools/peers/setup.sh), over the same rows in one run: the ratio table
#       docs/figures/peers_table.md and the plot docs/figures/peers.png.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh release
out=docs/figures
mkdir -p "$out"
quick=0
peers=0
for a in "$@"; do
  case "$a" in
    --quick) quick=1 ;;
    --peers) peers=1 ;;
    *) echo "usage: $0 [--peers] [--quick]" >&2; exit 2 ;;
  esac
done
if [ $peers -eq 1 ]; then
  py_peers=$(bash tools/peers/setup.sh)
  if [ $quick -eq 1 ]; then
    rows=(--blocks 4K,64K,1M,16M --batch 1,128 --threads 1,2)
    reps=2
  else
    rows=(--blocks 4K,64K,1M,16M,128M --batch 1,128,1024 --threads 1,2)
    reps=3
  fi
  echo "== hixl-bench: shm and tcp over the peers' rows"
  for tp in shm tcp; do
    build/tools/hixl-bench --transport "$tp" "${rows[@]}" --op both --reps $reps --verify --table \
      > "$out/peers_hixl_$tp.jsonl"
  done
  echo "== NIXL (UCX over posix,cma,self and over tcp,self), Mooncake (tcp)"
  "$py_peers" tools/peers/peer_bench.py --peer nixl --path shm "${rows[@]}" --reps $reps --verify \
    > "$out/peers_nixl_shm.jsonl"
  "$py_peers" tools/peers/peer_bench.py --peer nixl --path tcp "${rows[@]}" --reps $reps --verify \
    > "$out/peers_nixl_tcp.jsonl"
  "$py_peers" tools/peers/peer_bench.py --peer mooncake --path tcp "${rows[@]}" --reps $reps --verify \
    > "$out/peers_mooncake_tcp.jsonl"
  /usr/bin/python3 tools/peers/compare.py "$out/peers_table.md" "$out/peers.png" \
    "$out"/peers_hixl_*.jsonl -- "$out"/peers_nixl_*.jsonl "$out/peers_mooncake_tcp.jsonl"
  exit 0
fi
if [ $quick -eq 1 ]; then
  sweep=(--blocks 4K,64K,1M,16M --reps 3)
else
  sweep=(--reps 5)
fi
b=build/tools
py=/usr/bin/python3

echo "== hixl-bench: shm sweep (memcpy baseline)"
$b/hixl-bench "${sweep[@]}" --verify --table --mem both > $out/bench_shm.jsonl
echo "== hixl-bench: tcp sweep (socket pair and staged 'before' baselines)"
$b/hixl-bench "${sweep[@]}" --transport tcp --verify --table > $out/bench_tcp.jsonl
if $b/hixl-bench --help 2>&1 | grep -q -- "--many"; then
  echo "== hixl-bench: many-to-one (4 and 8 initiators)"
  $b/hixl-bench --many 4,8 --verify --table > $out/bench_many_shm.jsonl
  $b/hixl-bench --many 4,8 --transport tcp --verify --table > $out/bench_many_tcp.jsonl
fi
echo "== hixl-bench: registered application memory (malloc, sealed memfd, moved in place)"
$b/hixl-bench --mem all --blocks 4K,64K,1M,16M,128M --threads 1,2 --reps 3 --verify --table \
  > $out/bench_user_memory.jsonl
echo "== hixl-bench: 4 KiB async stream beside ucp_put_bw (where ucx_perftest is installed)"
$b/hixl-bench --stream --mem alloc,malloc,memfd,inplace --table > $out/bench_stream.jsonl
echo "== hixl-bench: notification latency (shm ring and control link, polling and callback; tcp)"
: > $out/bench_notify.jsonl
for ring in 1 0; do
  for wait in "" --notify-poll; do
    for gap in 0 50; do
      $b/hixl-bench --notify $wait --notify-gap-us $gap --iters 3000 --table \
        --engine-opt ShmNotifyRing=$ring >> $out/bench_notify.jsonl
    done
  done
done
$b/hixl-bench --notify --transport tcp --table >> $out/bench_notify.jsonl
$b/hixl-bench --notify --notify-poll --transport tcp --table >> $out/bench_notify.jsonl
echo "== hixl-kv-bench: LLM-DataDist block pulls/pushes vs the engine's batched transfer"
$b/hixl-kv-bench --table --verify > $out/kv_shm.jsonl
$b/hixl-kv-bench --transport tcp --table --verify --reps 3 > $out/kv_tcp.jsonl
echo "== hixl-pd-demo: shm and tcp, layer-wise push (and pull)"
$b/hixl-pd-demo --quiet --json $out/demo_shm_push.jsonl --timeline $out/timeline_shm.json | tee $out/demo_shm_push.txt
$b/hixl-pd-demo --quiet --link tcp --json $out/demo_tcp_push.jsonl --timeline $out/timeline_tcp.json | tee $out/demo_tcp_push.txt
$b/hixl-pd-demo --quiet --mode pull --no-before --json $out/demo_shm_pull.jsonl | tee $out/demo_shm_pull.txt
echo "== pictures"
$py tools/plots/plot_bench.py $out/bandwidth.png $out/bench_shm.jsonl $out/bench_tcp.jsonl
$py tools/plots/plot_timeline.py $out/timeline_shm.png $out/timeline_shm.json
$py tools/plots/plot_timeline.py $out/timeline_tcp.png $out/timeline_tcp.json
$py tools/plots/tables.py $out/bench_shm.jsonl $out/bench_tcp.jsonl $out/bench_many_*.jsonl \
  $out/bench_user_memory.jsonl $out/bench_stream.jsonl $out/bench_notify.jsonl \
  $out/kv_shm.jsonl $out/kv_tcp.jsonl > $out/tables.md
echo "done: $out/ (tables in $out/tables.md)"
