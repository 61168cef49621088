package uring

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/sys/mem"
)

// newRing sets up a single-issuer ring, as the executor does: the test's
// goroutine keeps its OS thread until the test ends, since the kernel refuses
// (EEXIST) submissions from another task.
func newRing(t *testing.T, n uint32) *Ring {
	t.Helper()
	runtime.LockOSThread()
	t.Cleanup(runtime.UnlockOSThread)
	r, err := Setup(n, SetupSingleIssuer|SetupDeferTaskrun)
	if errs.CodeOf(err) == errs.NotSupported {
		t.Skipf("io_uring unavailable here: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

// wait submits and collects exactly n completions.
func wait(t *testing.T, r *Ring, n int) map[uint64]int32 {
	t.Helper()
	got := map[uint64]int32{}
	for len(got) < n {
		if _, err := r.Submit(1); err != nil {
			t.Fatal(err)
		}
		r.Reap(func(c CQE) { got[c.UserData] = c.Res })
	}
	return got
}

func TestWriteReadBack(t *testing.T) {
	r := newRing(t, 8)
	if r.Entries() != 8 || r.Space() != 8 {
		t.Fatalf("entries %d space %d", r.Entries(), r.Space())
	}
	if !r.Supports(OpRead) || !r.Supports(OpWrite) || !r.Supports(OpNop) {
		t.Fatal("the kernel should support read, write and nop")
	}
	f, err := os.Create(filepath.Join(t.TempDir(), "f"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	src, dst := mem.MustAlloc(1<<20), mem.MustAlloc(1<<20)
	defer mem.Free(src)
	defer mem.Free(dst)
	for i := range src {
		src[i] = byte(i*7 + i>>9)
	}
	// Two writes of half each, one at an offset, then a read of the whole.
	r.SQE().PrepRW(OpWrite, int(f.Fd()), mem.Addr(src), 1<<19, 0, 1)
	r.SQE().PrepRW(OpWrite, int(f.Fd()), mem.Addr(src)+1<<19, 1<<19, 1<<19, 2)
	r.SQE().PrepNop(3)
	got := wait(t, r, 3)
	if got[1] != 1<<19 || got[2] != 1<<19 || got[3] != 0 {
		t.Fatalf("results %v", got)
	}
	r.SQE().PrepRW(OpRead, int(f.Fd()), mem.Addr(dst), 1<<20, 0, 4)
	if got := wait(t, r, 1); got[4] != 1<<20 {
		t.Fatalf("read %v", got)
	}
	if !bytes.Equal(src, dst) {
		t.Fatal("read back differs")
	}
	// A read past the end returns 0, an error comes back negated.
	r.SQE().PrepRW(OpRead, int(f.Fd()), mem.Addr(dst), 4096, 1<<20, 5)
	r.SQE().PrepRW(OpRead, 1<<20, mem.Addr(dst), 4096, 0, 6)
	got = wait(t, r, 2)
	if got[5] != 0 || !errors.Is(Errno(got[6]), unix.EBADF) {
		t.Fatalf("results %v", got)
	}
}

func TestFixedBuffers(t *testing.T) {
	r := newRing(t, 4)
	buf := mem.MustAlloc(64 << 10)
	defer mem.Free(buf)
	if err := r.RegisterBuffers([]uint64{mem.Addr(buf)}, []uint64{uint64(len(buf))}); err != nil {
		t.Skipf("cannot register buffers here: %v", err)
	}
	defer r.UnregisterBuffers()
	f, err := os.Create(filepath.Join(t.TempDir(), "f"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	copy(buf, bytes.Repeat([]byte("fixed!"), 1000))
	r.SQE().PrepFixed(true, int(f.Fd()), mem.Addr(buf), 6000, 100, 0, 1)
	if got := wait(t, r, 1); got[1] != 6000 {
		t.Fatalf("write %v", got)
	}
	clear(buf)
	r.SQE().PrepFixed(false, int(f.Fd()), mem.Addr(buf)+8192, 6000, 100, 0, 2)
	if got := wait(t, r, 1); got[2] != 6000 {
		t.Fatalf("read %v", got)
	}
	if !bytes.Equal(buf[8192:8192+6000], bytes.Repeat([]byte("fixed!"), 1000)) {
		t.Fatal("fixed read back differs")
	}
	// Outside the registered buffer: refused by the kernel, nothing touched.
	r.SQE().PrepFixed(false, int(f.Fd()), mem.Addr(buf)+60<<10, 8192, 0, 0, 3)
	if got := wait(t, r, 1); !errors.Is(Errno(got[3]), unix.EFAULT) {
		t.Fatalf("out of range fixed read: %v", got)
	}
}

func TestPollAndCancel(t *testing.T) {
	r := newRing(t, 4)
	efd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(efd)
	r.SQE().PrepPoll(efd, unix.POLLIN, 1)
	if _, err := r.Submit(0); err != nil {
		t.Fatal(err)
	}
	// Cancel the pending poll: both the poll (-ECANCELED) and the cancel (0) complete.
	r.SQE().PrepCancel(1, 2)
	got := wait(t, r, 2)
	if !errors.Is(Errno(got[1]), unix.ECANCELED) || got[2] != 0 {
		t.Fatalf("cancel results %v", got)
	}
	// A poll completes when the eventfd is written.
	r.SQE().PrepPoll(efd, unix.POLLIN, 3)
	if _, err := r.Submit(0); err != nil {
		t.Fatal(err)
	}
	unix.Write(efd, []byte{1, 0, 0, 0, 0, 0, 0, 0})
	if got := wait(t, r, 1); got[3]&unix.POLLIN == 0 {
		t.Fatalf("poll %v", got)
	}
}

func TestFullQueue(t *testing.T) {
	r := newRing(t, 2)
	r.SQE().PrepNop(1)
	r.SQE().PrepNop(2)
	if r.SQE() != nil || r.Space() != 0 {
		t.Fatal("a full queue handed out another SQE")
	}
	wait(t, r, 2)
	if r.Space() != 2 {
		t.Fatalf("space %d after the queue drained", r.Space())
	}
	if _, err := Setup(0, 0); errs.CodeOf(err) != errs.InvalidArgument {
		t.Fatalf("Setup(0): %v", err)
	}
}
