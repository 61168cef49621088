#!/usr/bin/env bash
# fabric-compare.sh: te's fabric transport over a libfabric provider against
# te's tcp transport, in alternating rounds of one run so both see the same
# load, then fi_pingpong over the same provider (the provider's own floor:
# one message in flight, no te). Prints each te-bench line and the
# fi_pingpong summaries.
#
#   bench/fabric-compare.sh [te-bench] [rounds] [provider]
#   bench/fabric-compare.sh build/te-bench 3 tcp
#
# FABRIC_BENCH_FLAGS overrides the te-bench loopback flags.
set -euo pipefail
bin=${1:-build/te-bench}
rounds=${2:-3}
prov=${3:-tcp}
read -r -a flags <<<"${FABRIC_BENCH_FLAGS:---op read,write --block 64KiB,1MiB --batch 64 --threads 1 --duration 2s}"
command -v fi_info >/dev/null || { echo "fabric-compare: fi_info not found (install libfabric-bin)"; exit 1; }
for r in $(seq "$rounds"); do
  echo "round $r"
  "$bin" loopback --transport tcp "${flags[@]}" 2>/dev/null | grep -E '^tcp '
  "$bin" loopback --transport fabric --provider "$prov" "${flags[@]}" 2>/dev/null | grep -E '^fabric '
done
# fi_pingpong: RDM endpoints of the provider on lo, 200 round trips of one
# message; MB/sec counts both directions' bytes over the whole run.
dom=()
[ "$prov" = shm ] || dom=(-d lo)
port=$((47000 + RANDOM % 1000))
for size in 65536 1048576; do
  timeout 120 fi_pingpong -p "$prov" -e rdm "${dom[@]}" -B "$port" -I 200 -S "$size" >/dev/null 2>&1 &
  srv=$!
  sleep 1
  echo "fi_pingpong -p $prov -e rdm -S $size:"
  timeout 120 fi_pingpong -p "$prov" -e rdm "${dom[@]}" -P "$port" -I 200 -S "$size" 127.0.0.1 | tail -2
  wait "$srv" || true
  port=$((port + 1))
done
