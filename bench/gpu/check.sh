#!/usr/bin/env bash
# GPU device check: every GPU check te has, in one go, one summary line.
#
# The GPU machine has no Go toolchain, so this script has two halves:
#
#   bench/gpu/check.sh build   # here: builds everything into build/gpu
#                              # (bundle.tgz, about 40 MB, and this script)
#   bench/gpu/check.sh run     # there (carry build/gpu, in the repository
#                              # root): runs it all in under 8 minutes
#
# "run" uses the real driver (TE_CUDA_REAL=1) and prints one line per step,
# then one summary line ("te gpu check: N passed, N failed, N skipped ...").
# With one GPU and no RDMA NIC:
#   1. driver bindings (internal/sys/cuda) against libcuda.so.1;
#   2. registration: a region registered as cuda:N is checked against the
#      driver, "*" is recognised as device memory;
#   3. cudaipc between two processes, 1 GiB of GPU memory each: writes and
#      reads both ways with CRCs, the owner's Unregister closing the peer's
#      mapping, GB/s against a device-to-device copy of the same run;
#   4. the same forced over tcp (staged through pinned host chunks), then
#      tcp's staging cases (GPU<->GPU, GPU<->host, host<->GPU, 1 B..16 MiB);
#   5. fences under cancel: cancels racing device copies, Close with copies
#      in flight, nothing lands after the terminal state;
#   6. a vLLM-shaped KV handoff GPU to GPU; then NVML's answer on each GPU's
#      NVLink fabric registration, and, on a node of an NVL72 rack (a
#      registered fabric), two processes as engines of two hosts moving
#      cuMemCreate(FABRIC) memory through fabric handles (TestMNNVLNode;
#      skipped elsewhere);
#   7. te.h on device memory: a C program (tests/c/rdma_fabric.c --real)
#      allocates GPU memory with cuMemAlloc in two processes and moves it
#      through te.h over cudaipc and over tcp;
#   8. Python on device memory: te.Engine in two processes, GPU memory from
#      ctypes cuMemAlloc (python/tests/test_rdma_fabric.py RealGPUTest), over
#      cudaipc and tcp.
# On a machine with RDMA NICs (/sys/class/infiniband lists one) it also
# runs GPU to GPU over rdma: the Go two-process case (GPU<->GPU, GPU<->host,
# host<->GPU, which also reports dma-buf or peer-memory registration), the C
# program and Python over rdma.
#
# On an AMD machine (/dev/kfd, the ROCm runtime libamdhip64.so; TE_HIP_LIBRARY
# names another) it runs the same Go checks on hip:N memory with the real
# runtime (TE_HIP_REAL=1, each test's hip case): the runtime's bindings and
# ABI generation, registration, HIP IPC GPU<->GPU between two processes, the
# same over tcp staging, tcp's staging cases, fences under cancel and close,
# the KV handoff, and rdma with NICs. The C and Python steps allocate with
# CUDA's driver API and run on NVIDIA only. GPU_VENDOR=cuda|hip|both picks
# (default: whatever the machine has).
#
# Written without access to a GPU: it has not been run on one yet.
set -uo pipefail
cd "$(dirname "$0")/../.."
GPU_BUILD=${GPU_BUILD:-build/gpu}
mode=${1:-run}

if [ "$mode" = build ]; then
	set -e
	stage=$(mktemp -d)
	trap 'rm -rf "$stage"' EXIT
	mkdir -p "$GPU_BUILD" "$stage/lib" "$stage/python"
	# Without cgo (purego loads libcuda and libibverbs itself) the test
	# binaries need no particular glibc on the GPU machine; stripped and
	# packed, everything travels in about 40 MB.
	for p in cuda:./internal/sys/cuda hip:./internal/sys/hip nvml:./internal/sys/nvml cudaipc:./engine/transport/cudaipc tcp:./engine/transport/tcp rdma:./engine/transport/rdma; do
		CGO_ENABLED=0 go test -c -trimpath -ldflags='-s -w' -o "$stage/${p%%:*}.test" "${p#*:}"
	done
	# libte.so needs cgo: it is linked against this machine's glibc.
	make build/libte.so
	cp build/libte.so "$stage/lib/libte.so"
	ln -sf libte.so "$stage/lib/libte.so.1"
	${CC:-cc} -O2 -Wall -Wextra -Werror -D_GNU_SOURCE -std=c11 -Iinclude -Itests/c tests/c/rdma_fabric.c \
		-o "$stage/te_gpu_c" -L"$stage/lib" -lte -ldl -lpthread -Wl,-rpath,'$ORIGIN/lib'
	cp -r python/te "$stage/python/te"
	rm -rf "$stage/python/te/__pycache__"
	cp python/tests/fabric_peers.py python/tests/test_rdma_fabric.py python/tests/util.py "$stage/python/"
	tar czf "$GPU_BUILD/bundle.tgz" -C "$stage" .
	cp bench/gpu/check.sh bench/lib/steps.sh "$GPU_BUILD/"
	echo "built $GPU_BUILD ($(du -sh "$GPU_BUILD" | cut -f1)); carry it and run: $GPU_BUILD/check.sh run"
	exit 0
fi

BIN=${BIN:-}
if [ -z "$BIN" ]; then
	bundle=$GPU_BUILD/bundle.tgz
	[ -f "$bundle" ] || bundle=$(dirname "$0")/bundle.tgz
	BIN=$(mktemp -d)
	trap 'rm -rf "$BIN"' EXIT
	tar xzf "$bundle" -C "$BIN" || { echo "te gpu check: no bundle at $bundle (run check.sh build first)"; exit 1; }
fi
BIN=$(cd "$BIN" && pwd)
# Which runtimes are real here: NVIDIA's where nvidia-smi answers, AMD's
# where the kernel has /dev/kfd.
vendor=${GPU_VENDOR:-}
if [ -z "$vendor" ]; then
	nv=0 amd=0
	nvidia-smi -L >/dev/null 2>&1 && nv=1
	[ -e /dev/kfd ] && amd=1
	case $nv$amd in
	11) vendor=both ;;
	01) vendor=hip ;;
	*) vendor=cuda ;;
	esac
fi
case $vendor in
cuda) export TE_CUDA_REAL=1 ;;
hip) export TE_HIP_REAL=1 ;;
both) export TE_CUDA_REAL=1 TE_HIP_REAL=1 ;;
*)
	echo "te gpu check: GPU_VENDOR=$vendor: want cuda, hip or both"
	exit 2
	;;
esac
export TE_CUDAIPC_SIZE=${TE_CUDAIPC_SIZE:-1073741824}
RESULTS=${RESULTS:-${OUT:-/tmp}/te-gpu-check.txt}
BUDGET=${BUDGET:-460} # seconds for everything: under 8 minutes with the summary
: >"$RESULTS"
: >"$RESULTS.full"
T0=$SECONDS
passed=0 failed=0 skipped=0
names_failed=""

STEP_GREP='_test.go:|SKIP|FAIL|panic|rdma_fabric:|Error|error'
# shellcheck source=../lib/steps.sh
. "$(dirname "$0")/steps.sh" 2>/dev/null || . "$(dirname "$0")/../lib/steps.sh"

gpu=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)
if [ -z "$gpu" ] && [ "$vendor" = hip ]; then
	gpu=$(rocm-smi --showproductname 2>/dev/null | sed -n 's/.*Card [Ss]eries: *//p' | head -1)
	gpu="AMD ${gpu:-GPU (no rocm-smi)}"
fi
gpu=${gpu:-unknown (no nvidia-smi)}
nics=$(ls "${TE_SYSFS_ROOT:-/sys}/class/infiniband" 2>/dev/null | tr '\n' ' ')
nics=${nics% }
echo "GPU: $gpu; RDMA NICs: ${nics:-none}" | tee -a "$RESULTS"

# The AMD checks: every GPU case of the Go tests, on its hip subtest, with
# the real runtime.
if [ "$vendor" != cuda ]; then
	echo "HIP runtime: ${TE_HIP_LIBRARY:-libamdhip64.so}" | tee -a "$RESULTS"
	step "HIP runtime: ABI generation, pointer types, IPC flags" 30 bash -c 'cd internal/sys/hip && exec "$0" -test.v -test.count=1 -test.run "^(TestPointerTypeNumbering|TestIPCFlagsFollowTheRuntime)$"' "$BIN/hip.test"
	step "registration of GPU memory (hip:N, *)" 30 "$BIN/cudaipc.test" -test.v -test.count=1 -test.run '^(TestRegisterChecksDevice|TestSameEngineGPU)$/^hip$'
	step "hip: GPU<->GPU over HIP IPC, 2 processes x 1 GiB" 90 "$BIN/cudaipc.test" -test.v -test.count=1 -test.run '^TestGPUToGPU$/^hip$'
	step "hip: GPU<->GPU over tcp (staged)" 60 env TE_GPU_TRANSPORT=tcp "$BIN/cudaipc.test" -test.v -test.count=1 -test.run '^TestGPUToGPU$/^hip$'
	step "hip: tcp staging, GPU/host mixes" 60 "$BIN/tcp.test" -test.v -test.count=1 -test.run '^TestGPU(Staged|BatchMixed)$/^hip$'
	step "hip: fences under cancel and close" 45 "$BIN/cudaipc.test" -test.v -test.count=1 -test.run '^TestGPUCancelAndClose$/^hip$'
	step "hip: vLLM-shaped KV handoff GPU->GPU" 45 "$BIN/cudaipc.test" -test.v -test.count=1 -test.run '^TestKVHandoff$/^hip$'
	if [ -n "$nics" ]; then
		step "hip: GPU<->GPU, GPU<->host, host<->GPU over rdma (2 processes)" 90 env TE_TEST_GPU_KIND=hip "$BIN/rdma.test" -test.v -test.count=1 -test.run '^TestGPUOverRDMAReal$'
	fi
fi
if [ "$vendor" = hip ]; then
	summary="te gpu check (hip): $passed passed, $failed failed, $skipped skipped in $((SECONDS - T0))s (GPU: ${gpu:-?}; NICs: ${nics:-none})${names_failed:+; failed:$names_failed}"
	echo "$summary" | tee -a "$RESULTS"
	echo "results: $RESULTS (full logs: $RESULTS.full)"
	[ "$failed" -eq 0 ]
	exit
fi

# 1-6: the Go checks. The binding test reads testdata/ relative to its package.
step "driver bindings" 60 bash -c 'cd internal/sys/cuda && exec "$0" -test.v -test.count=1' "$BIN/cuda.test"
step "registration of GPU memory (cuda:N, *)" 30 "$BIN/cudaipc.test" -test.v -test.count=1 -test.run '^(TestRegisterChecksDevice|TestSameEngineGPU)$'
step "GPU<->GPU over cudaipc, 2 processes x 1 GiB" 90 "$BIN/cudaipc.test" -test.v -test.count=1 -test.run '^TestGPUToGPU$'
step "GPU<->GPU over tcp (staged)" 60 env TE_GPU_TRANSPORT=tcp "$BIN/cudaipc.test" -test.v -test.count=1 -test.run '^TestGPUToGPU$'
step "tcp staging: GPU/host mixes, 1 B..16 MiB" 60 "$BIN/tcp.test" -test.v -test.count=1 -test.run '^TestGPU'
step "fences under cancel and close" 45 "$BIN/cudaipc.test" -test.v -test.count=1 \
	-test.run '^(TestGPUCancelAndClose|TestCancelWaitsForSync|TestCancelBeforeEnqueue|TestSubmitRacesClose)$'
step "vLLM-shaped KV handoff GPU->GPU" 45 "$BIN/cudaipc.test" -test.v -test.count=1 -test.run '^TestKVHandoff$'
step "protocol units" 20 "$BIN/cudaipc.test" -test.count=1 -test.run 'Test(Msg|Descriptor|Open|Unregister|Close)'
# The NVLink fabric as NVML reports it: a domain on an NVL72 rack, none elsewhere.
step "NVML: each GPU's NVLink fabric registration" 20 env TE_NVML_REAL=1 \
	TE_NVML_TEST_BUSES="$(nvidia-smi --query-gpu=pci.bus_id --format=csv,noheader 2>/dev/null | paste -sd, -)" \
	"$BIN/nvml.test" -test.v -test.count=1 -test.run '^TestRealFabric$'
# Multi-node NVLink as one NVL72 node can check it: two processes as two hosts'
# engines, fabric handles imported through IMEX (skips without a fabric).
step "MNNVL: fabric handles between two engines of this node" 60 env TE_MNNVL_REAL=1 TE_NVML_REAL=1 \
	"$BIN/cudaipc.test" -test.v -test.count=1 -test.run '^TestMNNVLNode$'

# 7-8: te.h and Python on device memory, two processes each.
transports="cudaipc tcp"
[ -n "$nics" ] && transports="$transports rdma"
for tr in $transports; do
	step "te.h on GPU memory over $tr (C, 2 processes)" 40 "$BIN/te_gpu_c" --real "$tr"
done
if command -v python3 >/dev/null; then
	for tr in $transports; do
		step "Python on GPU memory over $tr (2 processes)" 60 env TE_GPU_TRANSPORT="$tr" TE_LIBRARY="$BIN/lib/libte.so" \
			PYTHONPATH="$BIN/python" bash -c 'cd "$0" && exec python3 -m unittest -v test_rdma_fabric.RealGPUTest' "$BIN/python"
	done
else
	echo "== Python on GPU memory: SKIP (no python3)" | tee -a "$RESULTS"
	skipped=$((skipped + 1))
fi

# With NICs: GPU to GPU over rdma from Go (registration path in its log).
if [ -n "$nics" ]; then
	step "GPU<->GPU, GPU<->host, host<->GPU over rdma (2 processes)" 90 "$BIN/rdma.test" -test.v -test.count=1 -test.run '^TestGPUOverRDMAReal$'
fi

summary="te gpu check: $passed passed, $failed failed, $skipped skipped in $((SECONDS - T0))s (GPU: ${gpu:-?}; NICs: ${nics:-none})${names_failed:+; failed:$names_failed}"
echo "$summary" | tee -a "$RESULTS"
echo "results: $RESULTS (full logs: $RESULTS.full)"
[ "$failed" -eq 0 ]
