#!/usr/bin/env bash
# EFA device check: what te's fabric transport does on AWS Elastic Fabric
# Adapter NICs, in one go, one summary line.
#
#   bench/efa/check.sh build   # here: builds everything into build/efa
#                              # (bundle.tgz and this script)
#   bench/efa/check.sh run     # there (carry build/efa, in the repository
#                              # root): runs it all in under 8 minutes
#
# "run" on a host with EFA NICs (fi_info -p efa lists their domains):
#   1. libfabric and the EFA domains it offers (version, one per NIC);
#   2. the transport conformance suite over efa between two processes
#      (TestConformanceProvider), every byte checked;
#   3. GB/s of one NIC and of all of them striped (te-bench loopback over
#      fabric, 1 MiB and 64 KiB, against te's tcp on the same host in the
#      same run). Both processes are on this host: EFA's own shm path for
#      peers of one host is turned off (FI_EFA_ENABLE_SHM_TRANSFER=0) so the
#      bytes go through the NICs;
#   4. GPU memory, where an NVIDIA GPU is present: te registers cuda:0
#      memory with the NICs through FI_HMEM and must move it NIC to NIC,
#      both ways, between two processes (TestGPUMemoryHMEM with the real
#      CUDA runtime: gpu_hmem counted, the tasks served by fabric, every
#      byte checked).
# Failover between NICs is proven on the lab's veths (tests/lab,
# TestFabricRailsLinkDown); pulling a NIC is not something this script can
# do on a cloud host.
#
# EFA_CHECK_PROVIDER=tcp runs the same steps over libfabric's tcp provider
# on loopback (a dry run of the script where there is no EFA NIC).
#
# Written without access to an EFA host: it has not been run on one yet.
set -uo pipefail
cd "$(dirname "$0")/../.."
EFA_BUILD=${EFA_BUILD:-build/efa}
mode=${1:-run}

if [ "$mode" = build ]; then
	set -e
	stage=$(mktemp -d)
	trap 'rm -rf "$stage"' EXIT
	mkdir -p "$EFA_BUILD"
	# purego loads libfabric at run time: no cgo, no glibc dependency.
	CGO_ENABLED=0 go test -c -trimpath -ldflags='-s -w' -o "$stage/fabric.test" ./engine/transport/fabric
	CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o "$stage/te-bench" ./bench/te-bench
	tar czf "$EFA_BUILD/bundle.tgz" -C "$stage" .
	cp bench/efa/check.sh bench/lib/steps.sh "$EFA_BUILD/"
	echo "built $EFA_BUILD ($(du -sh "$EFA_BUILD" | cut -f1)); carry it and run: $EFA_BUILD/check.sh run"
	exit 0
fi

BIN=${BIN:-}
if [ -z "$BIN" ]; then
	bundle=$EFA_BUILD/bundle.tgz
	[ -f "$bundle" ] || bundle=$(dirname "$0")/bundle.tgz
	BIN=$(mktemp -d)
	trap 'rm -rf "$BIN"' EXIT
	tar xzf "$bundle" -C "$BIN" || { echo "te efa check: no bundle at $bundle (run check.sh build first)"; exit 1; }
fi
BIN=$(cd "$BIN" && pwd)
PROV=${EFA_CHECK_PROVIDER:-efa}
RESULTS=${RESULTS:-${OUT:-/tmp}/te-efa-check.txt}
BUDGET=${BUDGET:-460}
: >"$RESULTS"
: >"$RESULTS.full"
T0=$SECONDS
passed=0 failed=0 skipped=0
names_failed=""
export FI_EFA_ENABLE_SHM_TRANSFER=0

STEP_GREP='_test.go:|SKIP|FAIL|panic|GB/s|error'
# shellcheck source=../lib/steps.sh
. "$(dirname "$0")/steps.sh" 2>/dev/null || . "$(dirname "$0")/../lib/steps.sh"

# 1. What libfabric offers.
if ! command -v fi_info >/dev/null; then
	echo "te efa check: fi_info not found (libfabric's utilities: the EFA installer puts them in /opt/amazon/efa/bin)" | tee -a "$RESULTS"
fi
doms=$(fi_info -p "$PROV" -t FI_EP_RDM 2>/dev/null | sed -n 's/^ *domain: *//p' | sort -u | tr '\n' ' ')
doms=${doms% }
nnic=$(echo "$doms" | wc -w)
echo "libfabric: $(fi_info --version 2>/dev/null | tr '\n' ' '); provider $PROV: ${nnic} domain(s): ${doms:-none}" | tee -a "$RESULTS"
if [ "$nnic" -eq 0 ]; then
	echo "te efa check: no $PROV domain here; nothing to check" | tee -a "$RESULTS"
	exit 1
fi

# 2. The conformance suite, two processes.
step "conformance suite over $PROV, 2 processes" 240 env TE_FABRIC_TEST_PROVIDER="$PROV" "$BIN/fabric.test" -test.v -test.count=1 -test.run '^TestConformanceProvider$'

# 3. Throughput: one NIC, then all of them; tcp in the same run.
bench() { # name, env..., then te-bench flags after --
	local name=$1
	shift
	step "$name" 60 env "$@"
}
flags=(loopback --op write,read --block 64KiB,1MiB --batch 64 --duration 3s)
bench "GB/s: te tcp on this host (reference)" "$BIN/te-bench" "${flags[@]}" --transport tcp
bench "GB/s: fabric over $PROV, one NIC" TE_PARAM_fabric_nics=1 "$BIN/te-bench" "${flags[@]}" --transport fabric --provider "$PROV"
if [ "$nnic" -gt 1 ]; then
	bench "GB/s: fabric over $PROV, $nnic NICs striped" "$BIN/te-bench" "${flags[@]}" --transport fabric --provider "$PROV"
fi

# 4. GPU memory.
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
	step "GPU memory over $PROV by FI_HMEM, 2 processes" 120 env TE_CUDA_REAL=1 TE_FABRIC_TEST_PROVIDER="$PROV" TE_FABRIC_TEST_HMEM=1 \
		"$BIN/fabric.test" -test.v -test.count=1 -test.run '^TestGPUMemoryHMEM$/^cuda$'
else
	echo "== GPU memory: no GPU here" | tee -a "$RESULTS"
	skipped=$((skipped + 1))
fi

summary="te efa check ($PROV): $passed passed, $failed failed, $skipped skipped in $((SECONDS - T0))s (${nnic} domain(s))${names_failed:+; failed:$names_failed}"
echo "$summary" | tee -a "$RESULTS"
echo "results: $RESULTS (full logs: $RESULTS.full)"
[ "$failed" -eq 0 ]
