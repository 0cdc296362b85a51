#!/usr/bin/env bash
# Runs the decode example and a prefill-side example as two processes joined
# by a control plane of pipes: decode prints its engine and serialized
# handles, the prefill side gets them as arguments and its "DONE <slot>" lines
# go to decode's stdin; decode verifies every slot and prints "VERIFIED <n>".
#   run_pd.sh <decode> <prefill|async_pipeline> <slots> <bytes per slot>
set -euo pipefail
decode="$1"; sender="$2"; slots="$3"; size="$4"
dir="$(mktemp -d)"
dpid=""
cleanup() {
  [ -n "$dpid" ] && kill "$dpid" 2>/dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT
mkfifo "$dir/in" "$dir/out"
timeout 120 "$decode" --slots "$slots" --size "$size" <"$dir/in" >"$dir/out" &
dpid=$!
exec 5>"$dir/in" 4<"$dir/out"
read -r -t 60 tag engine <&4
[ "$tag" = ENGINE ] || { echo "decode said: $tag $engine" >&2; exit 1; }
handles=()
for ((i = 0; i < slots; i++)); do
  read -r -t 60 tag idx handle <&4
  [ "$tag" = HANDLE ] || { echo "decode said: $tag" >&2; exit 1; }
  handles+=("$handle")
done
timeout 120 "$sender" "$engine" "${handles[@]}" >&5
exec 5>&-
read -r -t 60 result count <&4 || true
wait "$dpid"; rc=$?; dpid=""
echo "$result $count"
[ "$rc" -eq 0 ] && [ "$result" = VERIFIED ] && [ "$count" -eq "$slots" ]
