#!/usr/bin/env bash
# Compares te with Mooncake Transfer Engine over tcp on loopback, every pair
# in the same run, so all of them see the same machine and the same load:
#
#   mc->mc       Mooncake's transfer_engine_bench against its own target
#   mc->mc pool  the same with MC_TCP_ENABLE_CONNECTION_POOL=1
#   te->mc       te-bench initiator against that Mooncake target
#   mc->te       transfer_engine_bench against a te-bench target
#   mc->te pool  the same with Mooncake's connection pool
#   te->te       te-bench against the te-bench target (for reference)
#
# Each (op, block) cell runs the pairs one after the other, --rounds times,
# and reports the median GB/s (1 GB = 10^9 bytes) of each pair and the
# mixed pairs' ratios to the Mooncake pair (default settings).
#
# --base BIN adds a second te target, served by another te-bench (the one
# before a change, say), and the pair mc->te base: Mooncake's initiator
# against it, in the same rounds as the others, so before and after see the
# same load. --pairs "mc-mc mc-te mc-te-base" runs only those pairs.
#
# usage: bench/mooncake-compare.sh [--duration S] [--rounds N] [--ops "write read"]
#                                  [--blocks "4096 65536 1048576"] [--batch 128] [--threads 1]
#                                  [--base TE_BENCH] [--pairs "..."]
# Mooncake's binaries come from ../shared/interop/mooncake beside the
# repository or $TE_MOONCAKE_INTEROP_DIR; te-bench from $TE_BENCH or
# build/te-bench (built if missing). Needs python3.
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=3 ROUNDS=1 OPS="write read" BLOCKS="4096 65536 1048576" BATCH=128 THREADS=1 BASE="" PAIRS=""
while [ $# -gt 0 ]; do
  case "$1" in
    --base) BASE=$2; shift 2 ;;
    --pairs) PAIRS=$2; shift 2 ;;
    --duration) DURATION=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --ops) OPS=$2; shift 2 ;;
    --blocks) BLOCKS=$2; shift 2 ;;
    --batch) BATCH=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    -h|--help) sed -n '2,28p' "$0"; exit 0 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done

MC=${TE_MOONCAKE_INTEROP_DIR:-../shared/interop/mooncake}
[ -x "$MC/transfer_engine_bench" ] || { echo "no transfer_engine_bench in $MC (set TE_MOONCAKE_INTEROP_DIR)" >&2; exit 1; }
TEB=${TE_BENCH:-build/te-bench}
if [ ! -x "$TEB" ]; then
  mkdir -p "$(dirname "$TEB")"
  go build -o "$TEB" ./bench/te-bench
fi

export GLOG_logtostderr=1 MC_TCP_BIND_ADDRESS=127.0.0.1 LD_LIBRARY_PATH="$MC${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
BUF=$((256 << 20))
WORK=$(mktemp -d)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill -INT "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT

# Mooncake's target; its segment name is the RPC address it logs.
"$MC/transfer_engine_bench" --mode=target --metadata_server=P2PHANDSHAKE --local_server_name=127.0.0.1 \
  --protocol=tcp --buffer_size=$BUF >/dev/null 2>"$WORK/mc-target.log" &
PIDS+=($!)
# te's target, serving Mooncake initiators too.
"$TEB" target --listen 127.0.0.1:0 --buffer $BUF --accept-mooncake >"$WORK/te-target.json" 2>"$WORK/te-target.log" &
PIDS+=($!)
if [ -n "$BASE" ]; then
  "$BASE" target --listen 127.0.0.1:0 --buffer $BUF --accept-mooncake >"$WORK/te-base.json" 2>"$WORK/te-base.log" &
  PIDS+=($!)
fi
segment() { python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).readline())["segment"])' "$1" 2>/dev/null || true; }
BASESEG=none
for _ in $(seq 100); do
  MCSEG=$(grep -o 'listening on [0-9.]*:[0-9]*' "$WORK/mc-target.log" | head -1 | awk '{print $3}' || true)
  TESEG=$(segment "$WORK/te-target.json")
  [ -n "$BASE" ] && BASESEG=$(segment "$WORK/te-base.json")
  [ -n "$MCSEG" ] && [ -n "$TESEG" ] && [ -n "$BASESEG" ] && break
  sleep 0.1
done
[ -n "$MCSEG" ] && [ -n "$TESEG" ] && [ -n "$BASESEG" ] || { echo "targets did not start" >&2; cat "$WORK"/*.log >&2; exit 1; }

mc_run() { # segment op block [pool]: prints GB/s
  local env=()
  [ "${4:-}" = pool ] && env=(MC_TCP_ENABLE_CONNECTION_POOL=1)
  env "${env[@]}" "$MC/transfer_engine_bench" --mode=initiator --metadata_server=P2PHANDSHAKE \
    --local_server_name=127.0.0.1 --protocol=tcp --segment_id="$1" --operation="$2" \
    --buffer_size=$BUF --block_size="$3" --batch_size=$BATCH --threads=$THREADS --duration=$DURATION \
    --report_unit=GB --report_precision=4 2>&1 |
    grep -o 'throughput [0-9.]* GB/s' | awk '{print $2}' | tail -1
}
te_run() { # segment op block: prints GB/s
  "$TEB" initiator --segment "$1" --transport tcp --op "$2" --block "$3" --batch $BATCH --threads $THREADS \
    --duration "${DURATION}s" --json 2>/dev/null | python3 -c 'import json,sys; print(json.loads(sys.stdin.readlines()[-1])["gbps"])'
}

if [ -z "$PAIRS" ]; then
  PAIRS="mc-mc mc-mc-pool te-mc mc-te mc-te-pool te-te"
  [ -n "$BASE" ] && PAIRS="$PAIRS mc-te-base"
fi
echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; loopback; batch $BATCH, threads $THREADS, ${DURATION}s per run, $ROUNDS round(s)" >&2
for op in $OPS; do
  for block in $BLOCKS; do
    for r in $(seq "$ROUNDS"); do
      for pair in $PAIRS; do
        case $pair in
          mc-mc) g=$(mc_run "$MCSEG" "$op" "$block") ;;
          mc-mc-pool) g=$(mc_run "$MCSEG" "$op" "$block" pool) ;;
          te-mc) g=$(te_run "$MCSEG" "$op" "$block") ;;
          mc-te) g=$(mc_run "$TESEG" "$op" "$block") ;;
          mc-te-pool) g=$(mc_run "$TESEG" "$op" "$block" pool) ;;
          te-te) g=$(te_run "$TESEG" "$op" "$block") ;;
          mc-te-base) g=$(mc_run "$BASESEG" "$op" "$block") ;;
          *) echo "unknown pair $pair" >&2; exit 2 ;;
        esac
        echo "$op $block $pair ${g:-0}" >>"$WORK/results"
        echo "$op $block round $r $pair: ${g:-FAILED} GB/s" >&2
      done
    done
  done
done

python3 - "$WORK/results" "$PAIRS" <<'EOF'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    op, block, pair, g = line.split()
    rows.setdefault((op, int(block)), {}).setdefault(pair, []).append(float(g))
pairs = sys.argv[2].split()
def size(b):
    return f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB"
names = {"mc-mc": "mc→mc", "mc-mc-pool": "mc→mc pool", "te-mc": "te→mc", "mc-te": "mc→te",
         "mc-te-pool": "mc→te pool", "te-te": "te→te", "mc-te-base": "mc→te base"}
ratios = [(a, b) for a, b in [("te-mc", "mc-mc"), ("mc-te", "mc-mc"), ("mc-te-pool", "mc-mc-pool"), ("mc-te-base", "mc-mc")]
          if a in pairs and b in pairs]
print("| op | block | " + " | ".join(names[p] for p in pairs) + "".join(f" | {names[a]} / {names[b]}" for a, b in ratios) + " |")
print("|----|------:|" + "------:|" * len(pairs) + "------|" * len(ratios))
for (op, block), m in rows.items():
    med = {p: statistics.median(m.get(p, [0])) for p in pairs}
    ratio = lambda a, b: f"**{med[a] / med[b]:.2f}x**" if med[b] > 0 else "n/a"
    print(f"| {op} | {size(block)} | " + " | ".join(f"{med[p]:.3f}" for p in pairs) +
          "".join(f" | {ratio(a, b)}" for a, b in ratios) + " |")
EOF
