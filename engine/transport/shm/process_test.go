package shm_test

import (
	"bytes"
	"encoding/json"
	"hash/crc32"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tecache/te/engine"
	"github.com/tecache/te/internal/sys/mem"
	"github.com/tecache/te/internal/sys/proc"
)

// owner is the parent side of the process tests: an engine with one
// registered, remote-accessible buffer.
type owner struct {
	e   *engine.Engine
	buf []byte
}

func newOwner(t *testing.T, size int, params map[string]string) *owner {
	t.Helper()
	// Under Yama ptrace_scope 1 a child may not attach to its parent unless
	// the parent says so; without Yama this fails with EINVAL, harmlessly.
	unix.Prctl(unix.PR_SET_PTRACER, unix.PR_SET_PTRACER_ANY, 0, 0, 0)
	e, err := engine.New(engine.Config{ListenAddr: "127.0.0.1:0", Hostname: "127.0.0.1", Params: params})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	o := &owner{e: e, buf: mem.MustAlloc(size)}
	if err := e.RegisterMemory(o.addr(), uint64(size), "cpu", true); err != nil {
		t.Fatal(err)
	}
	return o
}

func (o *owner) addr() uint64 { return mem.Addr(o.buf) }
func (o *owner) n() uint64    { return uint64(len(o.buf)) }

func fill(b []byte, v byte) {
	for i := range b {
		b[i] = v
	}
}

func expectOK(t *testing.T, line, transport string) {
	t.Helper()
	if !strings.HasPrefix(line, "ok "+transport) {
		t.Fatalf("initiator: %q, want ok over %s", line, transport)
	}
}

// TestChosenForAnotherProcess: with every transport installed and nothing
// forced, a peer on this host in another process is reached with shm, both
// ways, byte for byte.
func TestChosenForAnotherProcess(t *testing.T) {
	o := newOwner(t, 1<<20, nil)
	c := startInitiator(t, o.e.Name(), o.addr(), o.n(), nil)
	expectOK(t, c.do("write 4096 65536 171"), "shm")
	if !bytes.Equal(o.buf[4096:4096+65536], bytes.Repeat([]byte{171}, 65536)) {
		t.Fatal("the write did not land")
	}
	fill(o.buf[8192:], 0x3C)
	line := c.do("read 8192 100000")
	expectOK(t, line, "shm")
	if want := crc32.ChecksumIEEE(o.buf[8192 : 8192+100000]); !strings.HasSuffix(line, " "+strconv.FormatUint(uint64(want), 10)) {
		t.Fatalf("read back %q, want crc %d", line, want)
	}
	s := c.stats()["shm"]
	if s["attached"] != 1 || s["probe_refused"] != 0 || s["validations"] == 0 || s["syscalls"] == 0 {
		t.Fatalf("initiator shm stats %v", s)
	}
}

// TestRefusedFallsBackToTCP: the kernel refuses process_vm_readv (an
// initiator under another uid when we are root; a non-dumpable owner
// otherwise), so the probe fails with EPERM, the refusal is counted, and the
// request goes over tcp.
func TestRefusedFallsBackToTCP(t *testing.T) {
	o := newOwner(t, 1<<20, nil)
	var prepare func(*exec.Cmd)
	if os.Geteuid() == 0 {
		bin := copyForNobody(t)
		prepare = func(cmd *exec.Cmd) {
			cmd.Path, cmd.Args[0] = bin, bin
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		}
	} else {
		// Non-dumpable: a same-uid process without CAP_SYS_PTRACE may not
		// attach, so process_vm_* fail with EPERM.
		if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
			t.Fatal(err)
		}
		defer unix.Prctl(unix.PR_SET_DUMPABLE, 1, 0, 0, 0)
	}
	c := startInitiator(t, o.e.Name(), o.addr(), o.n(), prepare)
	expectOK(t, c.do("write 0 65536 90"), "tcp")
	if !bytes.Equal(o.buf[:65536], bytes.Repeat([]byte{90}, 65536)) {
		t.Fatal("the write did not land")
	}
	s := c.stats()["shm"]
	if s["probe_refused"] != 1 || s["attached"] != 0 || s["syscalls"] != 0 {
		t.Fatalf("initiator shm stats %v, want one refused probe", s)
	}
	// The refusal is remembered: the next request goes to tcp at once.
	expectOK(t, c.do("read 0 4096"), "tcp")
	if s := c.stats()["shm"]; s["probe_refused"] != 1 {
		t.Fatalf("probed again: %v", s)
	}
}

// copyForNobody copies the test binary where uid 65534 may run it.
func copyForNobody(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "shmtest")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	src, err := os.Open(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	bin := filepath.Join(dir, "shm.test")
	dst, err := os.OpenFile(bin, os.O_CREATE|os.O_WRONLY, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(dst, src); err != nil {
		t.Fatal(err)
	}
	if err := dst.Close(); err != nil {
		t.Fatal(err)
	}
	return bin
}

// TestUnregisterWhileHammered: another process writes into the buffer as fast
// as it can while the owner unregisters it. After Unregister returns not one
// byte may land (a canary fill stays intact); the writer sees clean failures;
// re-registering lets it in again under the new key. The last round unmaps
// the memory under the writer.
func TestUnregisterWhileHammered(t *testing.T) {
	const size = 256 << 10
	o := newOwner(t, size, nil)
	c := startInitiator(t, o.e.Name(), o.addr(), o.n(), nil)
	if l := c.do("hammer 17"); l != "ok" {
		t.Fatal(l)
	}
	for round := 0; round < 4; round++ {
		// Wait until the writer's bytes arrive under this registration.
		fill(o.buf, 0)
		waitFor(t, "writes to land", func() bool { return bytes.IndexByte(o.buf, 17) >= 0 })
		if err := o.e.UnregisterMemory(o.addr()); err != nil {
			t.Fatal(err)
		}
		fill(o.buf, 0xC5)
		time.Sleep(200 * time.Millisecond) // the writer goes on meanwhile
		if i := firstNot(o.buf, 0xC5); i >= 0 {
			t.Fatalf("round %d: byte %d changed after Unregister returned", round, i)
		}
		if round < 3 {
			if err := o.e.RegisterMemory(o.addr(), size, "cpu", true); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Unmap it: the writer must fail cleanly, not crash either process.
	if err := mem.Free(o.buf); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	var rep hammerReport
	if err := json.Unmarshal([]byte(c.do("stop")), &rep); err != nil {
		t.Fatal(err)
	}
	t.Logf("writer: %d completed, %d failed %v", rep.OK, rep.Failed, rep.Codes)
	if rep.OK == 0 || rep.Failed == 0 {
		t.Fatalf("writer report %+v: want completions and failures", rep)
	}
	for code := range rep.Codes {
		if code != "stale descriptor" && code != "address not registered" {
			t.Fatalf("writer failed with %q; want stale descriptor or address not registered", code)
		}
	}
	if s := c.stats()["shm"]; s["revokes_received"] < 4 {
		t.Fatalf("initiator saw %d revocations, want 4", s["revokes_received"])
	}
	if s := o.e.TransportStats()["shm"]; s["revokes_acked"] < 4 || s["peers_cut_off"] != 0 {
		t.Fatalf("owner shm stats %v", s)
	}
}

// firstNot returns the index of the first byte of b that is not v, or -1.
func firstNot(b []byte, v byte) int {
	for i, x := range b {
		if x != v {
			return i
		}
	}
	return -1
}

func waitFor(t *testing.T, what string, f func() bool) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(time.Millisecond) {
		if f() {
			return
		}
	}
	t.Fatalf("timed out waiting for %s", what)
}

// TestStoppedPeerIsCutOff: a peer that cannot acknowledge (SIGSTOP) is cut
// off after the revoke timeout, Unregister returns once its lease has lapsed
// and not before, and once resumed the peer cannot write with what it held.
func TestStoppedPeerIsCutOff(t *testing.T) {
	const lease, revoke = 600 * time.Millisecond, 200 * time.Millisecond
	o := newOwner(t, 1<<20, map[string]string{"shm.lease": lease.String(), "shm.revoke_timeout": revoke.String()})
	c := startInitiator(t, o.e.Name(), o.addr(), o.n(), nil)
	expectOK(t, c.do("write 0 4096 1"), "shm")
	c.signal(syscall.SIGSTOP)
	waitFor(t, "the peer to stop", func() bool { return proc.Stopped(c.cmd.Process.Pid) })
	t0 := time.Now()
	if err := o.e.UnregisterMemory(o.addr()); err != nil {
		t.Fatal(err)
	}
	took := time.Since(t0)
	fill(o.buf, 0xC5)
	if took < revoke || took > revoke+lease+time.Second {
		t.Fatalf("Unregister took %v; want between %v and %v", took, revoke, revoke+lease+time.Second)
	}
	if s := o.e.TransportStats()["shm"]; s["peers_cut_off"] != 1 {
		t.Fatalf("owner shm stats %v, want one peer cut off", s)
	}
	c.signal(syscall.SIGCONT)
	line := c.do("write 0 4096 2")
	if !strings.HasPrefix(line, "fail") {
		t.Fatalf("resumed peer: %q, want a failure", line)
	}
	if i := firstNot(o.buf, 0xC5); i >= 0 {
		t.Fatalf("byte %d changed after Unregister returned", i)
	}
	// Registered again, the cut-off peer attaches anew and gets in.
	if err := o.e.RegisterMemory(o.addr(), o.n(), "cpu", true); err != nil {
		t.Fatal(err)
	}
	expectOK(t, c.do("write 0 4096 3"), "shm")
	if o.buf[0] != 3 {
		t.Fatal("write after re-attach did not land")
	}
}

// TestKilledPeerDoesNotStallUnregister: a peer that died holding a grant
// cannot acknowledge; its exit (seen through a pidfd) ends the wait long
// before its lease would.
func TestKilledPeerDoesNotStallUnregister(t *testing.T) {
	o := newOwner(t, 1<<20, map[string]string{"shm.lease": "30s", "shm.revoke_timeout": "10s"})
	c := startInitiator(t, o.e.Name(), o.addr(), o.n(), nil)
	expectOK(t, c.do("write 0 4096 1"), "shm")
	c.signal(syscall.SIGKILL)
	c.cmd.Wait()
	t0 := time.Now()
	if err := o.e.UnregisterMemory(o.addr()); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(t0); took > 5*time.Second {
		t.Fatalf("Unregister took %v after the peer died", took)
	}
}

// TestOwnerCloseRevokes: closing the owner's engine revokes what its peers
// hold, so memory the caller frees after Close is not written either.
func TestOwnerCloseRevokes(t *testing.T) {
	o := newOwner(t, 1<<20, nil)
	c := startInitiator(t, o.e.Name(), o.addr(), o.n(), nil)
	expectOK(t, c.do("write 0 4096 1"), "shm")
	if err := o.e.Close(); err != nil {
		t.Fatal(err)
	}
	if s := o.e.TransportStats()["shm"]; s["revokes_sent"] != 1 || s["revokes_acked"] != 1 {
		t.Fatalf("owner shm stats after Close %v, want one revocation acknowledged", s)
	}
	fill(o.buf, 0xC5)
	if line := c.do("write 0 4096 2"); !strings.HasPrefix(line, "fail") {
		t.Fatalf("write after the owner closed: %q", line)
	}
	if i := firstNot(o.buf, 0xC5); i >= 0 {
		t.Fatalf("byte %d changed after Close returned", i)
	}
	if s := c.stats()["shm"]; s["revokes_received"] != 1 {
		t.Fatalf("initiator shm stats %v", s)
	}
}
