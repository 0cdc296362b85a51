#!/usr/bin/env bash
# Runs hixl-pd-demo and checks its verdict.
#   check_demo.sh match    DEMO ARGS...   exit 0 and "tokens match the reference"
#   check_demo.sh mismatch DEMO ARGS...   a non-zero exit and a MISMATCH line
set -u
want="$1"
shift
out=$(timeout 240 "$@" 2>&1)
status=$?
echo "$out" | tail -12
case "$want" in
  match)
    [ $status -eq 0 ] && echo "$out" | grep -q "tokens match the reference" && exit 0
    echo "FAILED: expected a token match (exit $status)" ;;
  mismatch)
    [ $status -ne 0 ] && [ $status -ne 124 ] && echo "$out" | grep -q "^MISMATCH" && exit 0
    echo "FAILED: expected the demo to report a mismatch and exit non-zero (exit $status)" ;;
esac
exit 1
