#!/usr/bin/env bash
# The demo across two "hosts": the prefill worker in one network namespace,
# the decode worker in another, joined by a veth pair (10.214.1.1 <-> .2,
# addresses that exist only inside these namespaces); KV over tcp, pushed and
# pulled. Needs root and iproute2: exits 77 (skipped) otherwise.
#   netns_demo.sh PATH_TO_hixl-pd-demo
set -u
demo="$1"
if [ "$(id -u)" -ne 0 ] || ! command -v ip >/dev/null; then
  echo "skipped: needs root and iproute2"
  exit 77
fi
a="hxdemo-$$-a" b="hxdemo-$$-b" va="hxd$$a" vb="hxd$$b"
cleanup() {
  ip netns del "$a" 2>/dev/null
  ip netns del "$b" 2>/dev/null
  ip link del "$va" 2>/dev/null
  true
}
trap cleanup EXIT
if ! ip netns add "$a" || ! ip netns add "$b"; then
  echo "skipped: cannot create network namespaces here"
  exit 77
fi
ip link add "$va" type veth peer name "$vb" &&
  ip link set "$va" netns "$a" && ip link set "$vb" netns "$b" &&
  ip -n "$a" addr add 10.214.1.1/24 dev "$va" && ip -n "$b" addr add 10.214.1.2/24 dev "$vb" &&
  ip -n "$a" link set lo up && ip -n "$b" link set lo up &&
  ip -n "$a" link set "$va" up && ip -n "$b" link set "$vb" up || { echo "veth setup failed"; exit 1; }
rc=0
for mode in push pull; do
  out=$(timeout 240 "$demo" --quiet --link tcp --mode "$mode" --requests 3 --prompt-lens 24,50,81 \
        --gen-tokens 6 --layers 3 --heads 4 --kv-heads 2 --head-dim 16 --mlp-dim 64 --vocab 256 \
        --block-size 8 --prefill-netns "$a" --prefill-ip 10.214.1.1 \
        --decode-netns "$b" --decode-ip 10.214.1.2 2>&1)
  status=$?
  echo "$out" | tail -8
  if [ $status -ne 0 ] || ! echo "$out" | grep -q "tokens match the reference"; then
    echo "FAILED: $mode across namespaces (exit $status)"
    rc=1
  fi
done
exit $rc
