// Package ibvtest builds a software libibverbs for tests: the entry points
// package ibv binds, compiled against the real verbs.h, with a fabric that
// connects queue pairs and does RDMA READ and WRITE after checking keys,
// bounds, access and queue pair state as a NIC would, on a thread per
// device after ibv_post_send returned. Loading it instead of
// libibverbs.so.1 (ibv.Open, the rdma transport's rdma.library parameter,
// TE_IBV_LIBRARY) runs the real verbs code path — purego calls, struct
// layouts, the ops table, completion channels — on machines without an
// RDMA device.
//
// Without EnvFabric the fabric is private to the process. With EnvFabric
// naming a directory, every process that loads the library with the same
// directory is on one fabric, and work requests move bytes between them
// (process_vm_readv/writev): two engines in two processes talk RDMA as
// two hosts would. Devices are the NICs of the sysfs tree in
// TE_SYSFS_ROOT (class/infiniband), or fake0 and fake1. The control file
// (ControlFile) fails a device or limits its rate while a test runs; a
// peer process stopped with SIGSTOP holds work requests back, as a peer
// that stopped answering. testdata/fakeverbs.c documents all of it;
// `make fakes` builds the same source as build/fake/libibverbs.so.1.
package ibvtest

import (
	_ "embed"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ebitengine/purego"
)

//go:embed testdata/fakeverbs.c
var source []byte

// Build compiles the fake library into a directory of t and returns its
// path. Each call builds a separate file, so each test has its own fabric.
// It skips t when the machine has no C compiler or no verbs.h, saying which.
func Build(t testing.TB) string {
	t.Helper()
	cc := os.Getenv("CC")
	if cc == "" {
		cc = "cc"
	}
	if _, err := exec.LookPath(cc); err != nil {
		t.Skipf("building the fake libibverbs needs a C compiler: %v", err)
	}
	if _, err := os.Stat("/usr/include/infiniband/verbs.h"); errors.Is(err, os.ErrNotExist) {
		t.Skip("building the fake libibverbs needs verbs.h (apt-get install libibverbs-dev)")
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "fakeverbs.c")
	if err := os.WriteFile(src, source, 0o644); err != nil {
		t.Fatal(err)
	}
	lib := filepath.Join(dir, "libfakeverbs.so")
	// -Bsymbolic: calls inside the library stay inside it even when the
	// real libibverbs is loaded in the same process.
	// $CC and $CFLAGS: make test-arm64 builds it with the cross compiler,
	// which finds verbs.h (the same for every architecture) through
	// CFLAGS=-idirafter /usr/include.
	args := append(strings.Fields(os.Getenv("CFLAGS")), "-O1", "-Wall", "-Werror", "-shared", "-fPIC", "-Wl,-Bsymbolic",
		"-o", lib, src, "-lpthread")
	out, err := exec.Command(cc, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("building the fake libibverbs: %v\n%s", err, out)
	}
	return lib
}

// Environment of the fake library.
const (
	// EnvFabric names the fabric directory processes share.
	EnvFabric = "FAKEVERBS_FABRIC"
	// EnvControl names a control file when there is no fabric directory.
	EnvControl = "FAKEVERBS_CONTROL"
)

// ControlFile is the control file of a fabric directory.
func ControlFile(fabric string) string { return filepath.Join(fabric, "control") }

// WriteControl replaces the fabric's control file with rules, one per
// line ("mlx5_3 fail", "mlx5_2 rate 100000000", "* ok", "NAME@PID ..."):
// written beside it and renamed, so a reader never sees half of it. Every
// process on the fabric applies it within about 20 ms; WriteControl waits
// until each of the processes pids has (each says so in
// control.applied.PID).
func WriteControl(t testing.TB, fabric string, pids []int, rules ...string) {
	t.Helper()
	gen := fmt.Sprintf("# generation %d", time.Now().UnixNano())
	tmp := ControlFile(fabric) + ".tmp"
	body := gen + "\n"
	for _, r := range rules {
		body += r + "\n"
	}
	if err := os.WriteFile(tmp, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, ControlFile(fabric)); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for _, pid := range pids {
		p := fmt.Sprintf("%s.applied.%d", ControlFile(fabric), pid)
		for {
			b, _ := os.ReadFile(p)
			if strings.TrimSpace(string(b)) == gen {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("process %d did not apply the control file within 10s (it says %q)", pid, b)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
}

// Stat counters of the fake library.
const (
	StatMRs = iota
	StatQPs
	StatCQs
	StatIova2 // registrations through ibv_reg_mr_iova2
	StatPosted
	StatContexts
	StatChannels
	StatPDs
	StatPostCalls // ibv_post_send calls
	StatSignaled  // signaled work requests posted
	StatCQEs      // completions generated
	StatDmabuf    // registrations through ibv_reg_dmabuf_mr
	StatPeermem   // device memory registered through ibv_reg_mr (peer memory)
	StatFailedNIC // work requests failed by a device the control file failed
	StatNICNanos  // CPU time the devices' threads spent executing work requests
	StatRegs      // memory regions ever registered (successful ibv_reg_mr, _iova2, ibv_reg_dmabuf_mr)
)

// Knobs of the fake library.
const (
	SetDevices = 0 // number of devices (0 to 2)
	SetCompat  = 1 // 1: contexts without the extended query_port
	// SetStall 1 holds every work request back, as if the peer stopped
	// answering; a queue pair moved to the error state still flushes its
	// own at once, as a NIC's does. 0 lets them run.
	SetStall = 2
	// SetNoDmabuf 1 makes ibv_reg_dmabuf_mr fail with EOPNOTSUPP, as an
	// old provider does (also FAKEVERBS_DMABUF=0 in the environment).
	SetNoDmabuf = 3
	// SetNoPeermem 1 makes ibv_reg_mr of GPU memory fail with EFAULT, as
	// without nvidia-peermem (also FAKEVERBS_PEERMEM=0).
	SetNoPeermem = 4
	// SetMaxMRSize sets the max_mr_size ibv_query_device reports; a longer
	// registration fails with EINVAL. 0 returns to FAKEVERBS_MAX_MR_SIZE
	// from the environment, else unbounded.
	SetMaxMRSize = 5
)

// Lib is a loaded fake library, for reading its counters and setting its
// knobs.
type Lib struct {
	stat    func(what int32) int64
	set     func(what int32, val int64)
	control func(line string)
}

// Open loads the fake library at path (the same handle ibv.Open gets).
func Open(t testing.TB, path string) *Lib {
	t.Helper()
	h, err := purego.Dlopen(path, purego.RTLD_NOW|purego.RTLD_GLOBAL)
	if err != nil {
		t.Fatal(err)
	}
	l := &Lib{}
	purego.RegisterLibFunc(&l.stat, h, "fake_verbs_stat")
	purego.RegisterLibFunc(&l.set, h, "fake_verbs_set")
	purego.RegisterLibFunc(&l.control, h, "fake_verbs_control")
	return l
}

// Control applies one rule of the control file to this process's devices
// at once ("fake1 fail", "fake0 rate 1000000", "* ok"; see EnvFabric).
func (l *Lib) Control(rule string) { l.control(rule) }

// Stat returns a counter (StatMRs, ...).
func (l *Lib) Stat(what int) int64 { return l.stat(int32(what)) }

// Set sets a knob (SetDevices, SetCompat, SetStall, SetNoDmabuf,
// SetNoPeermem, SetMaxMRSize).
func (l *Lib) Set(what int, val int64) { l.set(int32(what), val) }

// Live returns the verbs objects still allocated: MRs, QPs, CQs, contexts,
// channels and PDs together. After everything is closed it must be 0.
func (l *Lib) Live() int64 {
	var n int64
	for _, s := range []int{StatMRs, StatQPs, StatCQs, StatContexts, StatChannels, StatPDs} {
		n += l.Stat(s)
	}
	return n
}
