#!/usr/bin/env bash
# mk/arm64-test.sh: make test-arm64. te built for arm64 (aarch64, the Grace
# hosts of GH200/GB200) with the cross compiler and run under qemu-user on
# this x86-64 machine; mk/arm64.mk built build/arm64 first (make ARCH=arm64
# all wheel). In order:
#
#   1. the build: libte.so, te-sidecar and te-bench are aarch64 ELF files
#      with the version of this tree; libte.so exports te.h's functions and
#      nothing else (capi/libte.map), as the x86-64 one; the wheel is tagged
#      linux_aarch64; make ARCH=arm64 install PREFIX=<temp> installs it.
#   2. what qemu-user emulates: a probe built for arm64 tries the system
#      calls te uses that qemu-user 7.2 does not emulate (process_vm_readv,
#      io_uring_setup); each one missing skips, by name and with the reason,
#      the tests that need it (and only those).
#   3. the C tests built with the cross compiler against build/arm64/libte.so:
#      tests/c/pair.c (two engines of one process, over local and over tcp),
#      tests/c/two_process.c (two processes over tcp); every byte checked.
#   4. the Go tests of the packages with unsafe, struct layouts, atomics or
#      fences, cross-compiled (go test -c) and run under qemu-user: the
#      layout checks against the arm64 headers (the cross compiler's, its
#      program run under qemu too: ibv, uring, cuda, fabric, hip), the
#      transports local, tcp, shm and rdma
#      (on the fake libibverbs, built for arm64) with the conformance suite
#      and a short fence torture, file on its pread/pwrite fallback, the
#      engine and engine/internal/pipe (a subset: see PKGS).
#
# Environment: BUILD_ARM64, ARM64_CC, ARM64_SYSROOT, QEMU_AARCH64, GO,
# TE_VERSION, PYTHON (mk/arm64.mk sets them); ARM64_TEST_RUN: a regexp of
# the package paths of step 4 to run (default: all of them); ARM64_TEST_V=1:
# go test -v output.
set -uo pipefail
cd "$(dirname "$0")/.."
B=${BUILD_ARM64:-build/arm64}
CC_ARM64=${ARM64_CC:-aarch64-linux-gnu-gcc}
SYSROOT=${ARM64_SYSROOT:-/usr/aarch64-linux-gnu}
GO=${GO:-go}
QEMU=$(command -v "${QEMU_AARCH64:-qemu-aarch64-static}") || { echo "test-arm64: ${QEMU_AARCH64:-qemu-aarch64-static} not found"; exit 1; }
VERSION=${TE_VERSION:-$(mk/version.sh)}
T=$B/test
mkdir -p "$T"
T=$(cd "$T" && pwd)
# Every arm64 program runs under qemu with the arm64 C library; programs
# that start others (a peer process, a compiled layout program) do it
# through TE_TEST_EXEC (internal/testexec, tests/c/testutil.h).
export QEMU_LD_PREFIX=$SYSROOT
export TE_TEST_EXEC=$QEMU
t_all=$SECONDS
failed=()
say() { echo "test-arm64: $*"; }
fail() {
	say "FAIL: $*"
	failed+=("$1")
}
ok() { say "ok: $*"; }

# ---- 1. the build ------------------------------------------------------------
elf_machine() { od -An -tu2 -j18 -N2 "$1" | tr -d ' '; } # 183: aarch64, 62: x86-64
for f in "$B/libte.so" "$B/te-sidecar" "$B/te-bench"; do
	if [ ! -f "$f" ]; then
		fail "$f" "missing (make ARCH=arm64 builds it)"
	elif [ "$(elf_machine "$f")" != 183 ]; then
		fail "$f" "is not an aarch64 ELF file (e_machine $(elf_machine "$f"))"
	else
		ok "$f is aarch64"
	fi
done
for bin in te-sidecar te-bench; do
	v=$("$QEMU" "$B/$bin" -version 2>&1 | head -1)
	case "$v" in
	*"$VERSION"*) ok "$bin -version under qemu: $v" ;;
	*) fail "$bin -version" "says '$v', want $VERSION" ;;
	esac
done
# The dynamic symbols: te.h's functions, no more (the version script), no
# fewer (every declaration has its export).
declared=$(sed -n 's/^[a-z_ ]*[ *]\(te_[a-z0-9_]*\)(.*/\1/p' include/te.h | sort -u)
exported=$(aarch64-linux-gnu-nm -D --defined-only "$B/libte.so" 2>/dev/null | awk '$2 == "T" {print $3}' | sed 's/@.*//' | sort -u)
if [ -n "$declared" ] && [ "$declared" = "$exported" ]; then
	ok "libte.so exports te.h's $(echo "$declared" | wc -l) functions and nothing else"
else
	fail "libte.so symbols" "differ from te.h's functions: $(diff <(echo "$declared") <(echo "$exported") | grep '^[<>]' | tr '\n' ' ')"
fi
whl=$(ls "$B"/wheel/te-*.whl 2>/dev/null | head -1)
case "$whl" in
*"-py3-none-linux_aarch64.whl") ok "wheel $(basename "$whl")" ;;
*) fail "wheel" "want $B/wheel/te-*-py3-none-linux_aarch64.whl, have '${whl:-none}'" ;;
esac
if [ -n "$whl" ]; then
	m=$(${PYTHON:-python3} -c 'import sys, zipfile; d = zipfile.ZipFile(sys.argv[1]).read("te/libte.so"); print(int.from_bytes(d[18:20], "little"))' "$whl" 2>&1)
	[ "$m" = 183 ] && ok "the wheel's te/libte.so is aarch64" || fail "wheel libte.so" "e_machine $m"
fi
prefix=$(mktemp -d)
if make --no-print-directory ARCH=arm64 BUILD="$B" install PREFIX="$prefix" >"$T/install.log" 2>&1 &&
	lib=$(find "$prefix" -name 'libte.so*' -type f | head -1) && [ -n "$lib" ] && [ "$(elf_machine "$lib")" = 183 ] &&
	[ -f "$prefix/include/te.h" ] && find "$prefix" -name te.pc | grep -q .; then
	ok "make ARCH=arm64 install PREFIX=<temp>: ${lib#"$prefix"/}, include/te.h, te.pc"
else
	fail "make ARCH=arm64 install" "see $T/install.log"
	tail -20 "$T/install.log"
fi
rm -rf "$prefix"

# ---- 2. what qemu-user emulates ----------------------------------------------
cat >"$T/probe.c" <<'EOF'
/* Which system calls te uses does this emulator implement? ENOSYS: no. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <linux/io_uring.h>
int main(int argc, char **argv) {
    char a[4] = "abc", b[4] = {0};
    struct iovec l = {b, 4}, r = {a, 4};
    errno = 0;
    long n = process_vm_readv(getpid(), &l, 1, &r, 1, 0);
    printf("process_vm_readv %s\n", n == 4 ? "ok" : errno == ENOSYS ? "ENOSYS" : "error");
    struct io_uring_params p = {0};
    errno = 0;
    long fd = syscall(__NR_io_uring_setup, 2, &p);
    printf("io_uring_setup %s\n", fd >= 0 ? "ok" : errno == ENOSYS ? "ENOSYS" : "error");
    /* statx's direct-I/O alignment (Linux 6.1), asked of a file opened
     * O_DIRECT: the kernel fills it in; an emulator that copies only the
     * older fields leaves zeros behind the mask bit. */
    int dfd = open(argc > 1 ? argv[1] : ".", O_RDWR | O_CREAT | O_DIRECT, 0600);
    struct statx sx;
    if (dfd < 0 || statx(dfd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &sx) != 0 || !(sx.stx_mask & STATX_DIOALIGN))
        printf("statx_dioalign unknown\n"); /* no O_DIRECT here, or an older kernel: nothing to compare */
    else
        printf("statx_dioalign %s\n", sx.stx_dio_offset_align ? "ok" : "zero");
    return 0;
}
EOF
NO_VM=""
NO_URING=""
NO_DIO=""
if "$CC_ARM64" -O1 -o "$T/probe" "$T/probe.c" && probe=$("$QEMU" "$T/probe" "$T/probe.dio") && rm -f "$T/probe.dio"; then
	echo "$probe" | sed 's/^/test-arm64: qemu-user: /'
	echo "$probe" | grep -q '^statx_dioalign zero' && NO_DIO="qemu-user passes statx's STATX_DIOALIGN mask bit but not the alignments (they read 0), so fileio opens no O_DIRECT descriptor (buffered I/O, the safe fallback)"
	echo "$probe" | grep -q '^process_vm_readv ok' || NO_VM="qemu-user $("$QEMU" --version | head -1 | awk '{print $3}') does not emulate process_vm_readv/writev (ENOSYS)"
	echo "$probe" | grep -q '^io_uring_setup ok' || NO_URING="qemu-user does not emulate io_uring_setup (ENOSYS): file I/O runs on its pread/pwrite fallback"
else
	fail "qemu probe" "could not build or run $T/probe.c"
fi

# ---- 3. the C tests -----------------------------------------------------------
cflags=(-std=c11 -D_GNU_SOURCE -O1 -Wall -Wextra -Werror -Iinclude -Itests/c)
ldflags=(-L"$B" -l:libte.so -Wl,-rpath,"$(cd "$B" && pwd)" -lpthread)
for c in pair two_process; do
	if ! "$CC_ARM64" "${cflags[@]}" -o "$T/c_$c" "tests/c/$c.c" "${ldflags[@]}"; then
		fail "c_$c" "does not compile for arm64"
	fi
done
run_c() { # name timeout command...
	local name=$1 limit=$2 t0=$SECONDS
	shift 2
	if timeout "$limit" "$@" >"$T/$name.log" 2>&1; then
		ok "$name ($((SECONDS - t0))s): $(tail -1 "$T/$name.log")"
	else
		fail "$name" "exit $? after $((SECONDS - t0))s"
		tail -20 "$T/$name.log"
	fi
}
[ -x "$T/c_pair" ] && run_c c_pair_local 120 "$QEMU" "$T/c_pair" local "$VERSION"
[ -x "$T/c_pair" ] && run_c c_pair_tcp 120 "$QEMU" "$T/c_pair" tcp "$VERSION"
[ -x "$T/c_two_process" ] && run_c c_two_process_tcp 180 "$QEMU" "$T/c_two_process" tcp

# ---- 4. the Go tests ----------------------------------------------------------
# PKGS: package#tests to run (a -test.run regexp, empty: all)#tests to skip
# (-test.skip)#why only those run or those are skipped. -test.short
# everywhere.
PKGS=(
	"./internal/testexec###"
	"./internal/sys/layouttest###"
	"./internal/sys/ibv###"
	"./internal/sys/uring###"
	"./internal/sys/cuda###"
	"./internal/sys/fabric###"
	"./internal/sys/hip##^TestRealRuntime\$#TestRealRuntime loads Debian's libamdhip64.so.5, installed for amd64 only (none in the arm64 sysroot): the layout checks and the version logic run here"
	"./internal/sys/topo###"
	"./internal/fileio###"
	"./internal/session###"
	"./engine/internal/pipe###"
	"./engine#^(TestTwoEnginesOneProcess|TestRegistry|TestBatchLifecycle|TestTaskFailureAndTimeout|TestCloseFailsInFlight|TestConcurrentRegisterAndTransfer|TestBatchEventFD|TestTimeoutWaitsForTransport|TestBatchCancelAndReset|TestNotifyBeforeCompleted|TestCloseRacesCompletions|TestTaskStatusRacesResetAndFree|TestStrayCompletionIsDropped|TestWindow|TestGrantWindowErrors|TestUnregisterCancelsOwnTasksAfterGrace)\$##the engine's other tests (auth, limits, metadata, metrics, Mooncake, relay) hold no architecture-specific code and run natively in test-go"
	"./engine/transport/local###"
	"./engine/transport/tcp#^(TestConformance|TestConformanceInProcess|TestUnregisterCutsStalled.*|TestRevokeWindowCutsStalledWrite|TestLyingPeer.*|TestPeerKilledMidBatch|TestCloseFailsInFlight|TestCloseWhileSubmitting|TestPruneWhileSubmitting|TestQuiesceSeesBlockedPush)\$##tcp's wire, auth, session, GPU and Mooncake tests are byte-level logic that runs natively in test-go"
	"./engine/transport/shm###"
	"./engine/transport/rdma#^(TestConformanceFakeVerbs|TestDescriptorFakeVerbs|TestFakeVerbs.*|TestFabric(OneDoorbellPerEndpoint|Allocations|Cancel.*|Close.*|QuiesceUnregister|Transfer|RetriesExhausted|StaleKey|QueueDepth|Concurrent|Invalid|HandshakeRefusals|CQRoom|PostRefused)|TestKeys.*|TestHandshake.*|TestConformanceFakeFabric|TestTwoProcessNICFails|TestTwoProcessPeerUnreachable)\$#TestConformanceFakeVerbs/suite/Torture#only the tests on the fake libibverbs (the plan, config and topology tests are logic that test-go runs natively; TestConformance and the GPU tests need a NIC or GPU); the fence torture over the fake verbs is skipped: its ibv_reg_mr checks pages in /proc/self/maps, which qemu-user emulates, and refuses (EFAULT) memory the torture registers again after its mprotect fences (the torture runs over tcp and local here, over rdma in test-go); TestFabricRetryOtherNIC is left to test-go: under qemu it once saw no second handshake after the NIC failure (not understood yet)"
	"./engine/transport/file###"
)
# NEEDS_VM_<package>: its tests that move bytes with process_vm_readv/writev
# (shm; rdma's fake fabric between two processes), skipped by name when the
# probe says qemu lacks it; io_uring's own tests skip themselves (uring.Setup
# says ENOSYS).
NEEDS_VM_shm='^(TestConformance|TestCancel.*|TestCloseWithTasksInFlight|TestChosenForAnotherProcess|TestRefusedFallsBackToTCP|TestUnregisterWhileHammered|TestStoppedPeerIsCutOff|TestKilledPeerDoesNotStallUnregister|TestOwnerCloseRevokes|TestMove.*|TestWindowDiesWithItsMemory|TestWindowBoundToGrantee)$'
NEEDS_VM_rdma='^(TestConformanceFakeFabric|TestTwoProcess.*)$'
# A package with a -test.run filter and a -test.skip of its own leaves out
# its process_vm tests by this narrower filter instead (one -test.skip
# regexp cannot hold two patterns of different depths).
RUN_WITHOUT_VM_rdma='^(TestConformanceFakeVerbs|TestDescriptorFakeVerbs|TestFakeVerbs.*|TestFabric(OneDoorbellPerEndpoint|Allocations|Cancel.*|Close.*|QuiesceUnregister|Transfer|RetriesExhausted|StaleKey|QueueDepth|Concurrent|Invalid|HandshakeRefusals|CQRoom|PostRefused)|TestKeys.*|TestHandshake.*)$'
# NEEDS_DIO_<package>: its tests that want an O_DIRECT descriptor where the
# file system takes O_DIRECT, skipped when the probe says qemu hides the
# alignment fileio asks statx for.
NEEDS_DIO_fileio='TestRoundTripEveryByte/.*/direct=true'
# (TestLocalFileSegment also asserts that io_uring served its pool=0 half.)
NEEDS_DIO_file='^TestLocalFileSegment$'
sel=()
for p in "${PKGS[@]}"; do
	IFS='#' read -r pkg _ <<<"$p"
	[[ "$pkg" =~ ${ARM64_TEST_RUN:-.} ]] && sel+=("$p")
done
pkgs=()
for p in "${sel[@]}"; do pkgs+=("${p%%#*}"); done
say "building ${#pkgs[@]} test binaries for arm64 (go test -c; minutes on a fresh machine)"
t0=$SECONDS
rm -f "$T"/*.test
if ! CGO_ENABLED=1 GOARCH=arm64 CC="$CC_ARM64" "$GO" test -c -o "$T/" "${pkgs[@]}" >"$T/build.log" 2>&1; then
	fail "go test -c" "$(tail -20 "$T/build.log")"
fi
say "built in $((SECONDS - t0))s"
# The tests run with the cross compiler as CC: the fake libibverbs and
# libcuda and the layout programs are built for arm64 (verbs.h, libfabric's
# rdma/fi_*.h and hip_runtime_api.h are installed for amd64 only and hold
# no architecture-specific code: -idirafter /usr/include finds them after
# the arm64 headers). fabric's tests that load libfabric skip themselves:
# there is no arm64 libfabric in the sysroot.
export CC=$CC_ARM64 CFLAGS="-idirafter /usr/include" GOARCH=arm64 CGO_ENABLED=1
export TE_TORTURE_TIME=${TE_TORTURE_TIME:-1s}
for p in "${sel[@]}"; do
	IFS='#' read -r pkg run skip why <<<"$p"
	name=$(basename "$pkg")
	bin="$T/$name.test"
	[ -n "$run" ] && say "$pkg: only $run: $why"
	[ -n "$skip" ] && say "SKIP in $pkg: $skip: $why"
	needs_vm=NEEDS_VM_$name
	if [ -n "$NO_VM" ] && [ -n "${!needs_vm:-}" ]; then
		say "SKIP in $pkg: ${!needs_vm}: $NO_VM"
		narrower=RUN_WITHOUT_VM_$name
		if [ -n "${!narrower:-}" ]; then
			run=${!narrower}
		else
			skip=${!needs_vm}
		fi
	fi
	needs_dio=NEEDS_DIO_$name
	if [ -n "$NO_DIO" ] && [ -n "${!needs_dio:-}" ]; then
		skip=${skip:+$skip|}${!needs_dio}
		say "SKIP in $pkg: ${!needs_dio}: $NO_DIO"
	fi
	[ "$pkg" = ./engine/transport/file ] && [ -n "$NO_URING" ] && say "$pkg: $NO_URING"
	if [ ! -x "$bin" ]; then
		[ -f "$T/build.log" ] && grep -q "no test files" "$T/build.log" && continue
		fail "$pkg" "no test binary"
		continue
	fi
	args=(-test.short -test.count=1 -test.timeout=5m)
	[ -n "$run" ] && args+=(-test.run "$run")
	[ -n "$skip" ] && args+=(-test.skip "$skip")
	[ "${ARM64_TEST_V:-}" = 1 ] && args+=(-test.v)
	t0=$SECONDS
	if (cd "$pkg" && "$QEMU" "$bin" "${args[@]}") >"$T/$name.log" 2>&1; then
		ok "$pkg ($((SECONDS - t0))s)"
	else
		fail "$pkg" "after $((SECONDS - t0))s"
		grep -E -- '^(--- FAIL|FAIL|panic|\s+\S+_test.go:[0-9]+:)' "$T/$name.log" | head -30
		tail -5 "$T/$name.log"
	fi
done

say "$(( ${#failed[@]} )) failed, $((SECONDS - t_all))s (logs in $T)"
[ ${#failed[@]} -eq 0 ]
