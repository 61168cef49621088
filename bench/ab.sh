#!/usr/bin/env bash
# ab.sh: compare two te-bench binaries (e.g. before and after a change) on
# this machine, in alternating rounds so both see the same load, and print a
# markdown table of the medians: GB/s and the ratio to raw loopback TCP
# measured in the same run.
#
#   bench/ab.sh OLD NEW [rounds] [te-bench loopback flags...]
#   bench/ab.sh /tmp/te-bench-old build/te-bench 3 --op read,write --block 4KiB,64KiB,1MiB
set -euo pipefail
old=$1 new=$2
rounds=${3:-3}
shift 3 || shift $#
flags=("$@")
[ ${#flags[@]} -gt 0 ] || flags=(--transport tcp --op read,write --block 4KiB,64KiB,1MiB --batch 128 --threads 1 --duration 2s)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for r in $(seq "$rounds"); do
  for side in old new; do
    bin=$old; [ $side = new ] && bin=$new
    "$bin" loopback "${flags[@]}" --json 2>/dev/null | sed "s/^/$side /" >> "$out/runs"
  done
done
python3 - "$out/runs" <<'PY'
import json, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    side, js = line.split(" ", 1)
    r = json.loads(js)
    mode = ("encryption" if r.get("encrypt") else "integrity") if r.get("secret") else "no secret"
    key = (r["op"], r["block"], r["batch"], r["threads"], mode)
    rows.setdefault(key, {"old": [], "new": []})[side].append(r)
def size(n):
    for u, s in ((1 << 20, "MiB"), (1 << 10, "KiB")):
        if n >= u and n % u == 0:
            return f"{n // u} {s}"
    return str(n)
print("| op | block | batch | threads | session | before GB/s | after GB/s | after / before | before / raw TCP | after / raw TCP |")
print("|----|------:|------:|--:|---|------:|------:|------:|------:|------:|")
for key in sorted(rows):
    o, n = rows[key]["old"], rows[key]["new"]
    if not o or not n:
        continue
    med = lambda rs, f: statistics.median(x[f] for x in rs)
    go, gn = med(o, "gbps"), med(n, "gbps")
    print(f"| {key[0]} | {size(key[1])} | {key[2]} | {key[3]} | {key[4]} | {go:.2f} | {gn:.2f} | {gn / go:.2f}x | "
          f"{med(o, 'ratio_tcp'):.2f}x | {med(n, 'ratio_tcp'):.2f}x |")
PY
