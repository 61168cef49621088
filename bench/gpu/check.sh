#!/usr/bin/env bash
# GPU device check for te's CUDA support (issue 9, item 7).
#
# The GPU machine has no Go toolchain, so this script has two halves:
#
#   bench/gpu/check.sh build   # here: builds the test binaries into build/gpu
#   bench/gpu/check.sh run     # there (carry build/gpu): runs them, < 5 min
#
# "run" uses the real driver (TE_CUDA_REAL=1) and prints one line per check:
#   1. the driver bindings (internal/sys/cuda) against libcuda.so.1;
#   2. two processes register 1 GiB of GPU memory each (one as cuda:0, one
#      as "*", which must be recognised) and run the GPU conformance case over
#      cudaipc: write and read both ways with CRCs, the owner's Unregister
#      closing the peer's mapping, and GB/s against a device-to-device copy
#      of the same bytes in the same run;
#   3. the same case forced over tcp (GPU memory staged through pinned host
#      chunks), then tcp's own staging cases: GPU<->GPU, GPU<->host and
#      host<->GPU, READ and WRITE, 1 B to 16 MiB at unaligned offsets;
#   4. a vLLM-shaped KV handoff GPU to GPU (scattered blocks, one batch).
#
# Written without access to a GPU: it has not been run yet.
set -uo pipefail
cd "$(dirname "$0")/../.."
GPU_BUILD=${GPU_BUILD:-build/gpu}
mode=${1:-run}

if [ "$mode" = build ]; then
	mkdir -p "$GPU_BUILD"
	# Without cgo (purego loads libcuda itself) the binaries need no
	# particular glibc version on the GPU machine.
	CGO_ENABLED=0 go test -c -o "$GPU_BUILD/cuda.test" ./internal/sys/cuda
	CGO_ENABLED=0 go test -c -o "$GPU_BUILD/cudaipc.test" ./engine/transport/cudaipc
	CGO_ENABLED=0 go test -c -o "$GPU_BUILD/tcp.test" ./engine/transport/tcp
	cp bench/gpu/check.sh "$GPU_BUILD/"
	echo "built $GPU_BUILD; carry it and run: $GPU_BUILD/check.sh run"
	exit 0
fi

BIN=${BIN:-$GPU_BUILD}
[ -x "$BIN/cuda.test" ] || BIN=$(dirname "$0")
BIN=$(cd "$BIN" && pwd)
export TE_CUDA_REAL=1
export TE_CUDAIPC_SIZE=${TE_CUDAIPC_SIZE:-1073741824}
RESULTS=${RESULTS:-${OUT:-/tmp}/te-gpu-check.txt}
: >"$RESULTS"
: >"$RESULTS.full"
fail=0

step() { # name, timeout seconds, command...
	local name=$1 to=$2
	shift 2
	local log
	log=$(mktemp)
	timeout "$to" "$@" >"$log" 2>&1
	local rc=$?
	local verdict=PASS
	if [ $rc -ne 0 ]; then verdict=FAIL; fail=1; fi
	if [ $rc -eq 0 ] && grep -q -- '--- SKIP' "$log" && ! grep -q -- '--- PASS' "$log"; then verdict=SKIP; fi
	echo "== $name: $verdict (rc $rc)" | tee -a "$RESULTS"
	grep -E '_test.go:|SKIP|FAIL|panic' "$log" | head -20 | tee -a "$RESULTS"
	cat "$log" >>"$RESULTS.full"
	rm -f "$log"
}

{ nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; } 2>&1 | tee -a "$RESULTS"
# The binding test reads testdata/ relative to its package directory.
step "driver bindings" 60 bash -c 'cd internal/sys/cuda && exec "$0" -test.v -test.count=1' "$BIN/cuda.test"
step "GPU<->GPU over cudaipc, 2 processes x 1 GiB" 90 "$BIN/cudaipc.test" -test.v -test.count=1 -test.run '^TestGPUToGPU$'
step "GPU<->GPU over tcp (staged)" 60 env TE_GPU_TRANSPORT=tcp "$BIN/cudaipc.test" -test.v -test.count=1 -test.run '^TestGPUToGPU$'
step "tcp staging: GPU/host mixes, 1 B..16 MiB" 60 "$BIN/tcp.test" -test.v -test.count=1 -test.run '^TestGPU'
step "vLLM-shaped KV handoff GPU->GPU" 60 "$BIN/cudaipc.test" -test.v -test.count=1 -test.run '^TestKVHandoff$'
step "protocol units" 30 "$BIN/cudaipc.test" -test.count=1 -test.run 'Test(Msg|Descriptor|Open|Unregister|Close)'
echo "results: $RESULTS (full logs: $RESULTS.full)"
exit $fail
