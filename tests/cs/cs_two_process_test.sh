#!/usr/bin/env bash
# HiXL CS between two processes on this host over one transport (shm or tcp):
#   put and get, sync and async, large and 4 KiB descriptors, bytes checked
#   on both sides; then the server is destroyed while its client transfers:
#   the client's batch must end FAILED (exit 3) within a bound, never hang.
# Usage: cs_two_process_test.sh SERVER_BIN CLIENT_BIN shm|tcp
set -u
server_bin=$1
client_bin=$2
tp=$3
size=$((64 << 20))
cfg='{"HeartbeatIntervalMs":"200"}'
server_pid=""
client_pid=""
# tcp: a second endpoint on 127.0.0.2, for batches striped over two links.
second_ep=""
[ "$tp" = tcp ] && second_ep="--ep tcp:127.0.0.2"
cleanup() {
  [ -n "$client_pid" ] && kill -9 "$client_pid" 2>/dev/null
  [ -n "$server_pid" ] && kill -9 "$server_pid" 2>/dev/null
  wait 2>/dev/null
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# The server answers on its stdout; one command, one line.
ask() {
  echo "$1" >&"${SRV[1]}"
  local reply=""
  read -r -t 30 reply <&"${SRV[0]}" || fail "the server did not answer '$1'"
  echo "$reply"
}

for attempt in 1 2 3 4 5; do
  port=$((20000 + RANDOM % 10000))
  coproc SRV { exec "$server_bin" --port "$port" --size "$size" --ep "$tp:127.0.0.1" $second_ep --config "$cfg"; }
  server_pid=$SRV_PID
  line=""
  read -r -t 30 line <&"${SRV[0]}"
  [ "$line" = "ready" ] && break
  wait "$server_pid" 2>/dev/null
  server_pid=""
  echo "server did not start on port $port (attempt $attempt)" >&2
done
[ -n "$server_pid" ] || fail "no server"

client() {
  "$client_bin" --server "127.0.0.1:$port" --link "$tp:127.0.0.1:127.0.0.1" --config "$cfg" "$@"
}

client --op put --seed 5 --size "$size" --label put-sync || fail "sync put"
[ "$(ask 'check 5')" = "match" ] || fail "the server's bytes after a sync put"
[ "$(ask 'fill 6')" = "ok" ] || fail "fill"
client --op get --seed 6 --size "$size" --label get-sync || fail "sync get (or its bytes)"
client --op get --seed 6 --size $((8 << 20)) --desc-size 4096 --label get-4k || fail "4 KiB descriptors"
client --op put --seed 7 --size "$size" --async --label put-async || fail "async put"
[ "$(ask 'check 7')" = "match" ] || fail "the server's bytes after an async put"
client --op get --seed 7 --size "$size" --async --label get-async || fail "async get"
if [ "$tp" = tcp ]; then
  two="--link tcp:127.0.0.1:127.0.0.2"
  client $two --op put --seed 9 --size "$size" --label two-links-put >"${TMPDIR:-/tmp}/cs2p.$$" ||
    fail "striped put"
  cat "${TMPDIR:-/tmp}/cs2p.$$"
  grep -q '"link_bytes":\[[1-9][0-9]*,[1-9][0-9]*\]' "${TMPDIR:-/tmp}/cs2p.$$" || fail "a link carried nothing"
  rm -f "${TMPDIR:-/tmp}/cs2p.$$"
  [ "$(ask 'check 9')" = "match" ] || fail "the server's bytes after a striped put"
  client $two --op get --seed 9 --size "$size" --async --label two-links-get-async || fail "striped async get"
  client $two --op put --seed 10 --size "$size" --async --label two-links-put-async || fail "striped async put"
  [ "$(ask 'check 10')" = "match" ] || fail "the server's bytes after a striped async put"
fi

# The server goes away under a client that keeps transferring.
out=$(mktemp)
client --op put --seed 8 --size "$size" --async --repeat 100000 --timeout-ms 20000 --label under >"$out" &
client_pid=$!
for _ in $(seq 1 300); do
  [ -s "$out" ] && break
  sleep 0.05
done
[ -s "$out" ] || fail "the client moved nothing before the server was destroyed"
t0=$(date +%s%N)
[ "$(ask destroy)" = "ok" ] || fail "destroy"
rc=0
for _ in $(seq 1 600); do
  kill -0 "$client_pid" 2>/dev/null || break
  sleep 0.05
done
if kill -0 "$client_pid" 2>/dev/null; then
  fail "the client still runs 30 s after the server was destroyed"
fi
wait "$client_pid"
rc=$?
client_pid=""
ms=$(( ($(date +%s%N) - t0) / 1000000 ))
tail -n 1 "$out"
rm -f "$out"
[ "$rc" = 3 ] || fail "after the server was destroyed the client exited $rc (want 3: its batch FAILED)"
echo "the client's batch failed ${ms} ms after the server was destroyed"
echo quit >&"${SRV[1]}"
wait "$server_pid"
src=$?
server_pid=""
[ "$src" = 0 ] || fail "the server exited $src (a sanitizer report?)"
echo "PASS cs_two_process $tp"
