#!/usr/bin/env bash
# HiXL CS multi-link aggregation between two network namespaces joined by two
# veth links, each limited to 400 Mbit/s with tbf in both directions:
#   1. one link alone, then one batch striped over both (bytes checked);
#      prints both rates and their ratio (a figure, not a timed assertion);
#   2. one link is cut (ip link set down) in the middle of a batch: the batch
#      must end within a bound — COMPLETED over the other link with the right
#      bytes, or FAILED — never hang.
# Needs root and iproute2 (exit 77: skipped). Cleans up what it made.
# Usage: cs_netns_test.sh SERVER_BIN CLIENT_BIN
set -u
server_bin=$1
client_bin=$2
rate=${HIXL_CS_TBF_RATE:-400mbit}
size=$((64 << 20))
id=$$
na=hxcs${id}a
nb=hxcs${id}b
server_pid=""
client_pid=""

if [ "$(id -u)" != 0 ] || ! command -v ip >/dev/null || ! command -v tc >/dev/null; then
  echo "SKIP: needs root, ip and tc"
  exit 77
fi
cleanup() {
  [ -n "$client_pid" ] && kill -9 "$client_pid" 2>/dev/null
  [ -n "$server_pid" ] && kill -9 "$server_pid" 2>/dev/null
  wait 2>/dev/null
  ip netns del "$na" 2>/dev/null
  ip netns del "$nb" 2>/dev/null
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

if ! ip netns add "$na" 2>/dev/null; then
  echo "SKIP: cannot create network namespaces"
  exit 77
fi
ip netns add "$nb" || fail "netns"
ip -n "$na" link set lo up
ip -n "$nb" link set lo up
for k in 1 2; do
  ip link add "hc${id}a$k" netns "$na" type veth peer name "hc${id}b$k" netns "$nb" || fail "veth"
  ip -n "$na" addr add "10.231.$k.1/24" dev "hc${id}a$k"
  ip -n "$nb" addr add "10.231.$k.2/24" dev "hc${id}b$k"
  ip -n "$na" link set "hc${id}a$k" up
  ip -n "$nb" link set "hc${id}b$k" up
  ip netns exec "$na" tc qdisc add dev "hc${id}a$k" root tbf rate "$rate" burst 512kb latency 100ms || fail "tbf"
  ip netns exec "$nb" tc qdisc add dev "hc${id}b$k" root tbf rate "$rate" burst 512kb latency 100ms || fail "tbf"
done

cfg='{"HeartbeatIntervalMs":"200","HeartbeatMisses":3}'
coproc SRV { exec ip netns exec "$nb" "$server_bin" --port 7400 --size $((2 * size)) \
  --ep tcp:10.231.1.2 --ep tcp:10.231.2.2 --config "$cfg"; }
server_pid=$SRV_PID
line=""
read -r -t 30 line <&"${SRV[0]}"
[ "$line" = "ready" ] || fail "the server did not start"
ask() {
  echo "$1" >&"${SRV[1]}"
  local reply=""
  read -r -t 30 reply <&"${SRV[0]}" || fail "the server did not answer '$1'"
  echo "$reply"
}
client() {
  ip netns exec "$na" "$client_bin" --server 10.231.1.2:7400 --config "$cfg" "$@"
}
best() {  # the best mb_per_s among the JSON lines of a file
  sed -n 's/.*"mb_per_s":\([0-9.]*\).*/\1/p' "$1" | sort -g | tail -n 1
}

one=$(mktemp)
two=$(mktemp)
client --link tcp:10.231.1.1:10.231.1.2 --op put --seed 11 --size "$size" --repeat 3 \
  --label one-link >"$one" || fail "one link"
cat "$one"
client --link tcp:10.231.1.1:10.231.1.2 --link tcp:10.231.2.1:10.231.2.2 --op put --seed 12 \
  --size "$size" --repeat 3 --label two-links >"$two" || fail "two links"
cat "$two"
[ "$(ask "check 12 $size")" = "match" ] || fail "the server's bytes after the striped puts"
grep -q '"link_bytes":\[[1-9][0-9]*,[1-9][0-9]*\]' "$two" || fail "a link carried nothing"
b1=$(best "$one")
b2=$(best "$two")
ratio=$(awk -v a="$b2" -v b="$b1" 'BEGIN { printf "%.2f", a / b }')
echo "FIGURE cs aggregation: one link ${b1} MB/s, two links ${b2} MB/s, ratio ${ratio}x (tbf ${rate} per link)"
[ "$(ask 'fill 13')" = "ok" ] || fail "fill"
client --link tcp:10.231.1.1:10.231.1.2 --link tcp:10.231.2.1:10.231.2.2 --op get --seed 13 \
  --size "$size" --async --label two-links-get-async || fail "striped async get (or its bytes)"
rm -f "$one" "$two"

# Cut link 2 in the middle of one batch of 2 x size bytes.
out=$(mktemp)
ready=$(mktemp -u)
client --link tcp:10.231.1.1:10.231.1.2 --link tcp:10.231.2.1:10.231.2.2 --op put --seed 14 \
  --size $((2 * size)) --timeout-ms 60000 --label cut --ready-file "$ready" >"$out" &
client_pid=$!
for _ in $(seq 1 600); do
  [ -e "$ready" ] && break
  kill -0 "$client_pid" 2>/dev/null || break
  sleep 0.05
done
[ -e "$ready" ] || fail "the client did not connect"
rm -f "$ready"
sleep 0.5  # the batch (2 x size over two links) takes about 1.3 s
t0=$(date +%s%N)
ip -n "$na" link set "hc${id}a2" down || fail "link down"
for _ in $(seq 1 600); do
  kill -0 "$client_pid" 2>/dev/null || break
  sleep 0.05
done
kill -0 "$client_pid" 2>/dev/null && fail "the batch still runs 30 s after the cut"
wait "$client_pid"
rc=$?
client_pid=""
ms=$(( ($(date +%s%N) - t0) / 1000000 ))
cat "$out"
if [ "$rc" = 0 ]; then
  grep -q '"link_up":\[1,0\]' "$out" || fail "link 2 is not reported down"
  [ "$(ask 'check 14')" = "match" ] || fail "the server's bytes after the failover"
  echo "FIGURE cs cut: the batch completed over the remaining link ${ms} ms after the cut"
elif [ "$rc" = 3 ]; then
  echo "FIGURE cs cut: the batch failed ${ms} ms after the cut"
else
  fail "the client exited $rc after the cut"
fi
rm -f "$out"
echo quit >&"${SRV[1]}"
wait "$server_pid"
src=$?
server_pid=""
[ "$src" = 0 ] || fail "the server exited $src (a sanitizer report?)"
echo "PASS cs_netns"
