#!/usr/bin/env bash
# Target CPU per request under Mooncake's initiator (its default: a new
# connection per request): Mooncake's own target, te's target (te-bench
# target --accept-mooncake) and, with --base, a second te-bench (the one
# before a change), each driven in turn by the same transfer_engine_bench for
# --duration seconds per cell and round. CPU is the target's utime+stime from
# /proc/PID/stat over the run; requests are the run's bytes over the block
# size. Prints the median µs of target CPU per request of each target.
#
# usage: bench/mooncake-cpu.sh [--duration S] [--rounds N] [--ops "write read"]
#                              [--blocks "4096 65536 1048576"] [--batch 128] [--base TE_BENCH]
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=3 ROUNDS=3 OPS="write read" BLOCKS="4096 65536 1048576" BATCH=128 BASE=""
while [ $# -gt 0 ]; do
  case "$1" in
    --base) BASE=$2; shift 2 ;;
    --duration) DURATION=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --ops) OPS=$2; shift 2 ;;
    --blocks) BLOCKS=$2; shift 2 ;;
    --batch) BATCH=$2; shift 2 ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done

MC=${TE_MOONCAKE_INTEROP_DIR:-../shared/interop/mooncake}
[ -x "$MC/transfer_engine_bench" ] || { echo "no transfer_engine_bench in $MC (set TE_MOONCAKE_INTEROP_DIR)" >&2; exit 1; }
TEB=${TE_BENCH:-build/te-bench}
[ -x "$TEB" ] || go build -o "$TEB" ./bench/te-bench
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

"$MC/transfer_engine_bench" --mode=target --metadata_server=P2PHANDSHAKE --local_server_name=127.0.0.1 \
  --protocol=tcp --buffer_size=$BUF >/dev/null 2>"$WORK/mc-target.log" &
MCPID=$!; PIDS+=($MCPID)
"$TEB" target --listen 127.0.0.1:0 --buffer $BUF --accept-mooncake >"$WORK/te.json" 2>"$WORK/te.log" &
TEPID=$!; PIDS+=($TEPID)
BASEPID=""
if [ -n "$BASE" ]; then
  "$BASE" target --listen 127.0.0.1:0 --buffer $BUF --accept-mooncake >"$WORK/base.json" 2>"$WORK/base.log" &
  BASEPID=$!; PIDS+=($BASEPID)
fi
segment() { python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).readline())["segment"])' "$1" 2>/dev/null || true; }
BASESEG=none
for _ in $(seq 100); do
  MCSEG=$(grep -o 'listening on [0-9.]*:[0-9]*' "$WORK/mc-target.log" | head -1 | awk '{print $3}' || true)
  TESEG=$(segment "$WORK/te.json")
  [ -n "$BASE" ] && BASESEG=$(segment "$WORK/base.json")
  [ -n "$MCSEG" ] && [ -n "$TESEG" ] && [ -n "$BASESEG" ] && break
  sleep 0.1
done
[ -n "$MCSEG" ] && [ -n "$TESEG" ] && [ -n "$BASESEG" ] || { echo "targets did not start" >&2; cat "$WORK"/*.log >&2; exit 1; }

ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
HZ=$(getconf CLK_TCK)
run() { # pid segment op block: prints µs of target CPU per request
  local t0 t1 g
  t0=$(ticks "$1")
  g=$("$MC/transfer_engine_bench" --mode=initiator --metadata_server=P2PHANDSHAKE \
    --local_server_name=127.0.0.1 --protocol=tcp --segment_id="$2" --operation="$3" \
    --buffer_size=$BUF --block_size="$4" --batch_size=$BATCH --threads=1 --duration=$DURATION \
    --report_unit=GB --report_precision=6 2>&1 | grep -o 'throughput [0-9.]* GB/s' | awk '{print $2}' | tail -1)
  t1=$(ticks "$1")
  python3 -c "import sys; t,g,d,b,hz=map(float,sys.argv[1:]); n=g*1e9*d/b; print(f'{t/hz*1e6/n:.1f}' if n>0 else 'nan')" \
    "$((t1 - t0))" "${g:-0}" "$DURATION" "$4" "$HZ"
}
TARGETS="mc te"
[ -n "$BASE" ] && TARGETS="mc base te"
echo "load: $(uptime)" >&2
for op in $OPS; do
  for block in $BLOCKS; do
    for r in $(seq "$ROUNDS"); do
      for tg in $TARGETS; do
        case $tg in
          mc) u=$(run $MCPID "$MCSEG" "$op" "$block") ;;
          te) u=$(run $TEPID "$TESEG" "$op" "$block") ;;
          base) u=$(run $BASEPID "$BASESEG" "$op" "$block") ;;
        esac
        echo "$op $block $tg $u" >>"$WORK/results"
        echo "$op $block round $r $tg: $u µs/request" >&2
      done
    done
  done
done
echo "load: $(uptime)" >&2
python3 - "$WORK/results" "$TARGETS" <<'PY'
import math, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    op, block, tg, u = line.split()
    rows.setdefault((op, int(block)), {}).setdefault(tg, []).append(float(u))
tgs = sys.argv[2].split()
names = {"mc": "Mooncake", "base": "te before", "te": "te"}
size = lambda b: f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB"
print("| op | block | " + " | ".join(names[t] for t in tgs) + " | te / Mooncake |")
print("|----|------:|" + "------:|" * len(tgs) + "------|")
for (op, block), m in rows.items():
    med = {t: statistics.median([x for x in m.get(t, []) if not math.isnan(x)] or [float("nan")]) for t in tgs}
    print(f"| {op} | {size(block)} | " + " | ".join(f"{med[t]:.1f}" for t in tgs) + f" | {med['te'] / med['mc']:.2f}x |")
PY
