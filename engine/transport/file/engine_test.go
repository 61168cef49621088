package file_test

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tecache/te/engine"
	"github.com/tecache/te/engine/segment"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/sys/mem"
	"github.com/tecache/te/internal/testexec"
)

const secret = "file-segment-test-secret-0123456789"

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func newEngine(t *testing.T, params map[string]string, mut ...func(*engine.Config)) *engine.Engine {
	t.Helper()
	cfg := engine.Config{Hostname: "127.0.0.1", AuthSecret: secret, Params: params, Logger: quiet}
	for _, m := range mut {
		m(&cfg)
	}
	e, err := engine.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

// directDir is a directory on a file system that takes O_DIRECT.
func directDir(t testing.TB) string {
	t.Helper()
	for _, d := range []string{t.TempDir(), "."} {
		p := filepath.Join(d, ".odirect-probe")
		fd, err := unix.Open(p, unix.O_CREAT|unix.O_RDWR|unix.O_DIRECT, 0o600)
		if err == nil {
			unix.Close(fd)
			os.Remove(p)
			if d == "." {
				d, _ = os.MkdirTemp(".", "file-test-")
				t.Cleanup(func() { os.RemoveAll(d) })
			}
			return d
		}
	}
	t.Skip("no file system here takes O_DIRECT")
	return ""
}

func alloc(t *testing.T, n int) []byte {
	t.Helper()
	b := mem.MustAlloc(n)
	t.Cleanup(func() { mem.Free(b) })
	return b
}

func fill(b []byte, seed int) {
	for i := range b {
		b[i] = byte(i*131 + seed + i>>12)
	}
}

// transfer submits reqs of bs bytes covering n bytes between local and
// remote (op), waits, and returns the batch status.
func transfer(t *testing.T, e *engine.Engine, seg *engine.Segment, op engine.Opcode, local, remote, n, bs uint64) engine.BatchStatus {
	t.Helper()
	var reqs []engine.Request
	for off := uint64(0); off < n; off += bs {
		reqs = append(reqs, engine.Request{Op: op, Local: local + off, Segment: seg, Remote: remote + off, Length: min(bs, n-off)})
	}
	b, err := e.AllocateBatch(len(reqs))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Free()
	if err := b.Submit(reqs...); err != nil {
		t.Fatal(err)
	}
	st, err := b.Wait(60 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// TestLocalFileSegment writes memory into a registered file and reads it
// back, every byte checked, at 4 KiB and 1 MiB, O_DIRECT and buffered, on
// io_uring and on the pread/pwrite pool.
func TestLocalFileSegment(t *testing.T) {
	dir := directDir(t)
	for _, pool := range []string{"0", "1"} {
		for _, direct := range []bool{true, false} {
			for _, bs := range []uint64{4 << 10, 1 << 20} {
				t.Run(fmt.Sprintf("pool=%s/direct=%v/bs=%d", pool, direct, bs), func(t *testing.T) {
					e := newEngine(t, map[string]string{"file.pool": pool})
					const n = 8 << 20
					src, dst := alloc(t, n), alloc(t, n)
					fill(src, int(bs))
					for _, b := range [][]byte{src, dst} {
						if err := e.RegisterMemory(mem.Addr(b), n, "cpu", false); err != nil {
							t.Fatal(err)
						}
					}
					path := filepath.Join(dir, "seg-"+pool)
					fa, err := e.RegisterFile(path, 4096, n, engine.FileOptions{Remote: true, Create: true, NoDirect: !direct})
					if err != nil {
						t.Fatal(err)
					}
					d := e.Descriptor()
					var fb *segment.BufferDesc
					for i := range d.Buffers {
						if d.Buffers[i].Addr == fa {
							fb = &d.Buffers[i]
						}
					}
					if fb == nil || fb.Name != "file" || fb.Length != n {
						t.Fatalf("descriptor buffers %+v", d.Buffers)
					}
					wantAlign := "1"
					if direct {
						wantAlign = "" // the file system's
					}
					if a := fb.Extra["te_file_align"]; a == "" || wantAlign != "" && a != wantAlign {
						t.Fatalf("published alignment %q", a)
					}
					// The owner's file I/O size, which initiators slice by.
					if c := fb.Extra[segment.ExtraFileChunk]; c != "1048576" {
						t.Fatalf("published I/O size %q, want the default 1 MiB", c)
					}
					seg, err := e.OpenSegment(e.Name())
					if err != nil {
						t.Fatal(err)
					}
					if st := transfer(t, e, seg, engine.Write, mem.Addr(src), fa, n, bs); st.State != engine.Completed {
						t.Fatalf("write: %+v", st)
					}
					if st := transfer(t, e, seg, engine.Read, mem.Addr(dst), fa, n, bs); st.State != engine.Completed || st.Transferred != n {
						t.Fatalf("read: %+v", st)
					}
					if !bytes.Equal(src, dst) {
						t.Fatal("read back differs")
					}
					// The bytes are in the file, at the range's offset.
					got, _ := os.ReadFile(path)
					if !bytes.Equal(got[4096:4096+n], src) {
						t.Fatal("file content differs")
					}
					fs := e.TransportStats()["file"]
					if fs["io_uring"] != map[string]uint64{"0": 1, "1": 0}[pool] {
						t.Fatalf("file stats %v", fs)
					}
					if direct && fs["direct_ios"] == 0 || !direct && fs["direct_ios"] != 0 {
						t.Fatalf("file stats %v", fs)
					}
					if err := e.UnregisterMemory(fa); err != nil {
						t.Fatal(err)
					}
					// The address is gone from the descriptor and refused.
					b, _ := e.AllocateBatch(1)
					defer b.Free()
					err = b.Submit(engine.Request{Op: engine.Read, Local: mem.Addr(dst), Segment: seg, Remote: fa, Length: 4096})
					if errs.CodeOf(err) != errs.AddressNotRegistered {
						t.Fatalf("request to an unregistered file: %v", err)
					}
				})
			}
		}
	}
}

// TestMisalignedRequests: requests at odd memory addresses, file offsets and
// lengths are served (buffered) and land exactly where they should.
func TestMisalignedRequests(t *testing.T) {
	e := newEngine(t, nil)
	const n = 1 << 20
	buf := alloc(t, 3*n)
	fill(buf, 11)
	if err := e.RegisterMemory(mem.Addr(buf), 3*n, "cpu", false); err != nil {
		t.Fatal(err)
	}
	fa, err := e.RegisterFile(filepath.Join(directDir(t), "mis"), 0, n, engine.FileOptions{Remote: true, Create: true})
	if err != nil {
		t.Fatal(err)
	}
	seg, _ := e.OpenSegment(e.Name())
	if st := transfer(t, e, seg, engine.Write, mem.Addr(buf), fa, n, n); st.State != engine.Completed {
		t.Fatal(st)
	}
	want := append([]byte(nil), buf[:n]...)
	patches := []struct{ mem, off, n uint64 }{{n + 1, 4096, 4096}, {n, 8193, 4096}, {n + 7, 20000, 33333}, {n + 3, n - 3, 3}}
	b, _ := e.AllocateBatch(len(patches))
	defer b.Free()
	for _, p := range patches {
		copy(want[p.off:p.off+p.n], buf[p.mem:p.mem+p.n])
		if err := b.Submit(engine.Request{Op: engine.Write, Local: mem.Addr(buf) + p.mem, Segment: seg, Remote: fa + p.off, Length: p.n}); err != nil {
			t.Fatal(err)
		}
	}
	if st, _ := b.Wait(30 * time.Second); st.State != engine.Completed {
		t.Fatal(st)
	}
	dst := buf[2*n:]
	if st := transfer(t, e, seg, engine.Read, mem.Addr(dst), fa, n, 64<<10); st.State != engine.Completed {
		t.Fatal(st)
	}
	if !bytes.Equal(dst, want) {
		t.Fatal("misaligned writes corrupted the file")
	}
	if e.TransportStats()["file"]["buffered_ios"] == 0 {
		t.Fatal("misaligned I/O not counted as buffered")
	}
	// Out of the file's range: refused at submit, nothing moved.
	err = b.Reset()
	if err == nil {
		err = b.Submit(engine.Request{Op: engine.Read, Local: mem.Addr(dst), Segment: seg, Remote: fa + n - 10, Length: 20})
	}
	if errs.CodeOf(err) != errs.AddressNotRegistered {
		t.Fatalf("request past the file's end: %v", err)
	}
	// A file address as the local side: refused.
	err = b.Submit(engine.Request{Op: engine.Read, Local: fa, Segment: seg, Remote: fa, Length: 20})
	if err == nil {
		t.Fatal("a file as the local side was accepted")
	}
}

// TestTruncatedFile: reads past the new end of a file truncated while
// registered fail with IO; the others complete.
func TestTruncatedFile(t *testing.T) {
	e := newEngine(t, nil)
	const n = 1 << 20
	buf := alloc(t, n)
	e.RegisterMemory(mem.Addr(buf), n, "cpu", false)
	path := filepath.Join(directDir(t), "trunc")
	fa, err := e.RegisterFile(path, 0, n, engine.FileOptions{Remote: true, Create: true})
	if err != nil {
		t.Fatal(err)
	}
	seg, _ := e.OpenSegment(e.Name())
	if err := os.Truncate(path, 256<<10); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	b, _ := e.AllocateBatch(2)
	defer b.Free()
	b.Submit(engine.Request{Op: engine.Read, Local: mem.Addr(buf), Segment: seg, Remote: fa, Length: 128 << 10},
		engine.Request{Op: engine.Read, Local: mem.Addr(buf), Segment: seg, Remote: fa + 512<<10, Length: 128 << 10})
	b.Wait(30 * time.Second)
	s0, _ := b.TaskStatus(0)
	s1, _ := b.TaskStatus(1)
	if s0.State != engine.Completed || s1.State != engine.Failed || errs.CodeOf(s1.Err) != errs.IO {
		t.Fatalf("tasks %+v %+v", s0, s1)
	}
	if err := e.UnregisterMemory(fa); err != nil {
		t.Fatal(err)
	}
}

// TestNoSpace fills a small tmpfs (mounted for the test, as root; else the
// file-size limit test in internal/fileio covers EFBIG): the write that does
// not fit fails with NoSpace, the batch's other tasks complete.
func TestNoSpace(t *testing.T) {
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=2m"); err != nil {
		t.Skipf("cannot mount a tmpfs here: %v", err)
	}
	defer unix.Unmount(dir, unix.MNT_DETACH)
	e := newEngine(t, nil)
	buf := alloc(t, 4<<20)
	fill(buf, 3)
	e.RegisterMemory(mem.Addr(buf), 4<<20, "cpu", false)
	fa, err := e.RegisterFile(filepath.Join(dir, "full"), 0, 8<<20, engine.FileOptions{Remote: true, Create: true})
	if err != nil {
		t.Fatal(err)
	}
	defer e.UnregisterMemory(fa)
	seg, _ := e.OpenSegment(e.Name())
	// The first MiB takes its pages first; in the batch below its
	// overwrite needs no new space while the other write runs out.
	if st := transfer(t, e, seg, engine.Write, mem.Addr(buf), fa, 1<<20, 1<<20); st.State != engine.Completed {
		t.Fatal(st)
	}
	b, _ := e.AllocateBatch(2)
	defer b.Free()
	b.Submit(engine.Request{Op: engine.Write, Local: mem.Addr(buf), Segment: seg, Remote: fa, Length: 1 << 20},
		engine.Request{Op: engine.Write, Local: mem.Addr(buf), Segment: seg, Remote: fa + 4<<20, Length: 4 << 20})
	b.Wait(30 * time.Second)
	s0, _ := b.TaskStatus(0)
	s1, _ := b.TaskStatus(1)
	if s0.State != engine.Completed || s1.State != engine.Failed || errs.CodeOf(s1.Err) != errs.NoSpace {
		t.Fatalf("tasks %+v %+v", s0, s1)
	}
	// What fit is intact.
	dst := alloc(t, 1<<20)
	e.RegisterMemory(mem.Addr(dst), 1<<20, "cpu", false)
	if st := transfer(t, e, seg, engine.Read, mem.Addr(dst), fa, 1<<20, 1<<20); st.State != engine.Completed || !bytes.Equal(dst, buf[:1<<20]) {
		t.Fatalf("read back after ENOSPC: %+v", st)
	}
}

// TestCancelAndUnregisterDuringIO: Cancel ends a batch of reads with each
// task CANCELED or COMPLETED, and nothing writes the memory afterwards;
// unregistering the file while reads run returns only once they ended.
func TestCancelAndUnregisterDuringIO(t *testing.T) {
	for _, pool := range []string{"0", "1"} {
		t.Run("pool="+pool, func(t *testing.T) {
			e := newEngine(t, map[string]string{"file.pool": pool})
			const n, k = 1 << 20, 64
			buf := alloc(t, n*k)
			e.RegisterMemory(mem.Addr(buf), n*k, "cpu", false)
			fa, err := e.RegisterFile(filepath.Join(directDir(t), "cancel"), 0, n, engine.FileOptions{Remote: true, Create: true})
			if err != nil {
				t.Fatal(err)
			}
			seg, _ := e.OpenSegment(e.Name())
			for round := 0; round < 3; round++ {
				b, _ := e.AllocateBatch(k)
				for i := 0; i < k; i++ {
					b.Submit(engine.Request{Op: engine.Read, Local: mem.Addr(buf) + uint64(i)*n, Segment: seg, Remote: fa, Length: n})
				}
				time.Sleep(time.Duration(round) * time.Millisecond)
				b.Cancel()
				st, err := b.Wait(30 * time.Second)
				if err != nil {
					t.Fatal(err)
				}
				if st.Completed+st.Failed != k {
					t.Fatalf("status %+v", st)
				}
				for i := 0; i < k; i++ {
					ts, _ := b.TaskStatus(i)
					if ts.State != engine.Completed && ts.State != engine.Canceled {
						t.Fatalf("task %d: %+v", i, ts)
					}
				}
				for i := range buf {
					buf[i] = 0x5A
				}
				time.Sleep(10 * time.Millisecond)
				for i := range buf {
					if buf[i] != 0x5A {
						t.Fatalf("byte %d written after its task ended", i)
					}
				}
				b.Free()
				t.Logf("round %d: %d completed, %d canceled", round, st.Completed, st.Failed)
			}
			// Unregister while reads run.
			b, _ := e.AllocateBatch(k)
			defer b.Free()
			for i := 0; i < k; i++ {
				b.Submit(engine.Request{Op: engine.Read, Local: mem.Addr(buf) + uint64(i)*n, Segment: seg, Remote: fa, Length: n})
			}
			if err := e.UnregisterMemory(fa); err != nil {
				t.Fatal(err)
			}
			select {
			case <-b.Done():
			default:
				t.Fatal("UnregisterMemory returned with reads of the file still running")
			}
		})
	}
}

// TestUnregisterCancelsTasksOnTheFile: past the grace period, unregistering
// a file cancels this engine's tasks that target it (a file is never a
// task's local side, so they are found by their target), and returns once
// every one of them has ended.
func TestUnregisterCancelsTasksOnTheFile(t *testing.T) {
	e := newEngine(t, map[string]string{"file.pool": "1"}, func(c *engine.Config) { c.UnregisterGrace = time.Nanosecond })
	const n, k = 256 << 10, 256
	buf := alloc(t, n*k)
	e.RegisterMemory(mem.Addr(buf), n*k, "cpu", false)
	seg, _ := e.OpenSegment(e.Name())
	canceled := 0
	for round := 0; round < 5 && canceled == 0; round++ {
		fa, err := e.RegisterFile(filepath.Join(t.TempDir(), "unreg"), 0, n, engine.FileOptions{Remote: true, Create: true, NoDirect: true})
		if err != nil {
			t.Fatal(err)
		}
		b, _ := e.AllocateBatch(k)
		for i := 0; i < k; i++ {
			if err := b.Submit(engine.Request{Op: engine.Read, Local: mem.Addr(buf) + uint64(i)*n, Segment: seg, Remote: fa, Length: n}); err != nil {
				t.Fatal(err)
			}
		}
		if err := e.UnregisterMemory(fa); err != nil {
			t.Fatal(err)
		}
		select {
		case <-b.Done():
		default:
			t.Fatal("UnregisterMemory returned with tasks on the file still pending")
		}
		for i := 0; i < k; i++ {
			ts, _ := b.TaskStatus(i)
			switch ts.State {
			case engine.Canceled:
				canceled++
			case engine.Completed:
			default:
				t.Fatalf("task %d: %+v", i, ts)
			}
		}
		b.Free()
	}
	if canceled == 0 {
		t.Fatal("no task on the file was canceled by its unregistration")
	}
}

// TestPrivateFile: a file registered without Remote moves to and from the
// owner's memory through the owner's own segment, and is in no descriptor a
// peer reads: another engine of this process, with the secret and the file
// transport that reaches this process's files, is refused it, and the file
// keeps its bytes. (engine/transport/tcp TestPrivateFileRefusedOverTCP: a
// peer that knows the address and key anyway.)
func TestPrivateFile(t *testing.T) {
	owner := newEngine(t, nil)
	const n = 1 << 20
	path := filepath.Join(t.TempDir(), "private")
	fa, err := owner.RegisterFile(path, 0, n, engine.FileOptions{Create: true})
	if err != nil {
		t.Fatalf("private file: %v", err)
	}
	src, dst := alloc(t, n), alloc(t, n)
	fill(src, 41)
	for _, b := range [][]byte{src, dst} {
		if err := owner.RegisterMemory(mem.Addr(b), n, "cpu", false); err != nil {
			t.Fatal(err)
		}
	}
	own, err := owner.OpenSegment(owner.Name())
	if err != nil {
		t.Fatal(err)
	}
	defer owner.CloseSegment(own)
	if st := transfer(t, owner, own, engine.Write, mem.Addr(src), fa, n, 64<<10); st.State != engine.Completed {
		t.Fatalf("owner's write: %+v", st)
	}
	if st := transfer(t, owner, own, engine.Read, mem.Addr(dst), fa, n, 64<<10); st.State != engine.Completed {
		t.Fatalf("owner's read: %+v", st)
	}
	if disk, _ := os.ReadFile(path); !bytes.Equal(dst, src) || !bytes.Equal(disk, src) {
		t.Fatal("owner's round trip through its private file differs")
	}
	for _, b := range owner.Descriptor().Buffers {
		if b.Addr == fa {
			t.Fatalf("private file published: %+v", b)
		}
	}
	if d, _ := own.Descriptor(); !hasBuffer(d, fa) {
		t.Fatal("the owner's own segment does not list its private file")
	}

	peer := newEngine(t, nil)
	pm := alloc(t, n)
	fill(pm, 99)
	if err := peer.RegisterMemory(mem.Addr(pm), n, "cpu", false); err != nil {
		t.Fatal(err)
	}
	seg, err := peer.OpenSegment(owner.Name())
	if err != nil {
		t.Fatal(err)
	}
	defer peer.CloseSegment(seg)
	if d, _ := seg.Descriptor(); hasBuffer(d, fa) {
		t.Fatal("a peer's view of the owner lists the private file")
	}
	b, err := peer.AllocateBatch(1)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Free()
	for _, op := range []engine.Opcode{engine.Read, engine.Write} {
		b.Reset()
		err := b.Submit(engine.Request{Op: op, Local: mem.Addr(pm), Segment: seg, Remote: fa, Length: 4096})
		if errs.CodeOf(err) != errs.AddressNotRegistered {
			t.Fatalf("peer's op %d on the private file: %v", op, err)
		}
	}
	if disk, _ := os.ReadFile(path); !bytes.Equal(disk, src) {
		t.Fatal("the private file changed")
	}
	if err := owner.UnregisterMemory(fa); err != nil {
		t.Fatal(err)
	}
}

func hasBuffer(d *segment.Desc, addr uint64) bool {
	for _, b := range d.Buffers {
		if b.Addr == addr {
			return b.Name == engine.LocationFile
		}
	}
	return false
}

// TestRemoteFileSegmentInProcess: a second engine with tcp only reads and
// writes the first engine's file over tcp, authenticated.
func TestRemoteFileSegmentInProcess(t *testing.T) {
	owner := newEngine(t, nil)
	fa, err := owner.RegisterFile(filepath.Join(directDir(t), "remote"), 0, 8<<20, engine.FileOptions{Remote: true, Create: true})
	if err != nil {
		t.Fatal(err)
	}
	peer := newEngine(t, nil, func(c *engine.Config) { c.Transports = []string{"tcp"} })
	const n = 8 << 20
	src, dst := alloc(t, n), alloc(t, n)
	fill(src, 21)
	peer.RegisterMemory(mem.Addr(src), n, "cpu", false)
	peer.RegisterMemory(mem.Addr(dst), n, "cpu", false)
	seg, err := peer.OpenSegment(owner.Name())
	if err != nil {
		t.Fatal(err)
	}
	for _, bs := range []uint64{4 << 10, 1 << 20} {
		clear(dst)
		if st := transfer(t, peer, seg, engine.Write, mem.Addr(src), fa, n, bs); st.State != engine.Completed {
			t.Fatalf("remote write: %+v", st)
		}
		if st := transfer(t, peer, seg, engine.Read, mem.Addr(dst), fa, n, bs); st.State != engine.Completed {
			t.Fatalf("remote read: %+v", st)
		}
		if !bytes.Equal(src, dst) {
			t.Fatalf("bs %d: remote read back differs", bs)
		}
	}
	// A wrong secret learns and touches nothing.
	bad := newEngine(t, nil, func(c *engine.Config) {
		c.Transports = []string{"tcp"}
		c.AuthSecret = "another-secret-0123456789abcdef"
	})
	if _, err := bad.OpenSegment(owner.Name()); errs.CodeOf(err) != errs.Unauthenticated {
		t.Fatalf("wrong secret: %v", err)
	}
}

// TestRemoteFileSegmentTwoProcesses: a storage node in another process holds
// a file segment; this process writes and reads it over tcp, behind the
// cluster secret, then reads it again after the node truncated it (IO).
func TestRemoteFileSegmentTwoProcesses(t *testing.T) {
	if os.Getenv("TE_FILE_CHILD") == "node" {
		storageNode(t)
		return
	}
	dir := directDir(t)
	cmd := testexec.Command(os.Args[0], "-test.run=^TestRemoteFileSegmentTwoProcesses$")
	cmd.Env = append(os.Environ(), "TE_FILE_CHILD=node", "TE_FILE_DIR="+dir)
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { stdin.Close(); cmd.Wait() }()
	rd := bufio.NewReader(stdout)
	line, err := rd.ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(line)
	if len(f) != 2 {
		t.Fatalf("node said %q", line)
	}
	name := f[0]
	fa, _ := strconv.ParseUint(f[1], 10, 64)
	e := newEngine(t, nil)
	const n = 4 << 20
	src, dst := alloc(t, n), alloc(t, n)
	fill(src, 33)
	e.RegisterMemory(mem.Addr(src), n, "cpu", false)
	e.RegisterMemory(mem.Addr(dst), n, "cpu", false)
	seg, err := e.OpenSegment(name)
	if err != nil {
		t.Fatal(err)
	}
	for _, bs := range []uint64{4 << 10, 1 << 20} {
		clear(dst)
		if st := transfer(t, e, seg, engine.Write, mem.Addr(src), fa, n, bs); st.State != engine.Completed {
			t.Fatalf("write: %+v", st)
		}
		if st := transfer(t, e, seg, engine.Read, mem.Addr(dst), fa, n, bs); st.State != engine.Completed {
			t.Fatalf("read: %+v", st)
		}
		if !bytes.Equal(src, dst) {
			t.Fatalf("bs %d: read back differs", bs)
		}
	}
	// The node truncates its file: a read past the new end fails (IO) on
	// the task; the connection and the other tasks are fine.
	fmt.Fprintln(stdin, "truncate")
	if l, _ := rd.ReadString('\n'); strings.TrimSpace(l) != "truncated" {
		t.Fatalf("node: %q", l)
	}
	b, _ := e.AllocateBatch(2)
	defer b.Free()
	b.Submit(engine.Request{Op: engine.Read, Local: mem.Addr(dst), Segment: seg, Remote: fa, Length: 64 << 10},
		engine.Request{Op: engine.Read, Local: mem.Addr(dst), Segment: seg, Remote: fa + 2<<20, Length: 64 << 10})
	b.Wait(30 * time.Second)
	s0, _ := b.TaskStatus(0)
	s1, _ := b.TaskStatus(1)
	if s0.State != engine.Completed || s1.State != engine.Failed || errs.CodeOf(s1.Err) != errs.IO {
		t.Fatalf("after truncation: %+v %+v", s0, s1)
	}
	// A peer without the secret is refused.
	bad := newEngine(t, nil, func(c *engine.Config) { c.AuthSecret = "not-the-cluster-secret-0123456789" })
	if _, err := bad.OpenSegment(name); errs.CodeOf(err) != errs.Unauthenticated {
		t.Fatalf("wrong secret: %v", err)
	}
}

func storageNode(t *testing.T) {
	e, err := engine.New(engine.Config{Hostname: "127.0.0.1", AuthSecret: secret, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	path := filepath.Join(os.Getenv("TE_FILE_DIR"), "node")
	fa, err := e.RegisterFile(path, 0, 4<<20, engine.FileOptions{Remote: true, Create: true})
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("%s %d\n", e.Name(), fa)
	sc := bufio.NewScanner(os.Stdin)
	var done atomic.Bool
	for sc.Scan() && !done.Load() {
		if sc.Text() == "truncate" {
			os.Truncate(path, 1<<20)
			fmt.Println("truncated")
		}
	}
}

// TestRemoteNoSpaceAndUnregister: over tcp, a full disk fails only the task
// that hit it, with NoSpace (the completion's status); and the owner
// unregistering its file while a peer reads it returns once no read of it
// runs, the peer's tasks ending COMPLETED or FAILED, never hanging.
func TestRemoteNoSpaceAndUnregister(t *testing.T) {
	owner := newEngine(t, nil)
	peer := newEngine(t, nil, func(c *engine.Config) { c.Transports = []string{"tcp"} })
	const n = 4 << 20
	buf := alloc(t, n)
	fill(buf, 8)
	peer.RegisterMemory(mem.Addr(buf), n, "cpu", false)

	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=2m"); err == nil {
		defer unix.Unmount(dir, unix.MNT_DETACH)
		fa, err := owner.RegisterFile(filepath.Join(dir, "full"), 0, 8<<20, engine.FileOptions{Remote: true, Create: true})
		if err != nil {
			t.Fatal(err)
		}
		seg, err := peer.OpenSegment(owner.Name())
		if err != nil {
			t.Fatal(err)
		}
		if st := transfer(t, peer, seg, engine.Write, mem.Addr(buf), fa, 1<<20, 1<<20); st.State != engine.Completed {
			t.Fatalf("first MiB: %+v", st)
		}
		b, _ := peer.AllocateBatch(2)
		b.Submit(engine.Request{Op: engine.Write, Local: mem.Addr(buf), Segment: seg, Remote: fa, Length: 1 << 20},
			engine.Request{Op: engine.Write, Local: mem.Addr(buf), Segment: seg, Remote: fa + 4<<20, Length: 3 << 20})
		b.Wait(30 * time.Second)
		s0, _ := b.TaskStatus(0)
		s1, _ := b.TaskStatus(1)
		b.Free()
		if s0.State != engine.Completed || s1.State != engine.Failed || errs.CodeOf(s1.Err) != errs.NoSpace {
			t.Fatalf("over tcp to a full disk: %+v %+v", s0, s1)
		}
		if err := owner.UnregisterMemory(fa); err != nil {
			t.Fatal(err)
		}
		// The next half opens the segment again and must see the file it
		// registers next, not this handle's cached descriptor.
		peer.CloseSegment(seg)
	} else {
		t.Logf("no tmpfs here (%v): the full-disk half is skipped", err)
	}

	fa, err := owner.RegisterFile(filepath.Join(directDir(t), "unreg"), 0, n, engine.FileOptions{Remote: true, Create: true})
	if err != nil {
		t.Fatal(err)
	}
	seg, err := peer.OpenSegment(owner.Name())
	if err != nil {
		t.Fatal(err)
	}
	const k = 64
	b, _ := peer.AllocateBatch(k)
	defer b.Free()
	for i := 0; i < k; i++ {
		if err := b.Submit(engine.Request{Op: engine.Read, Local: mem.Addr(buf) + uint64(i%4)<<20, Segment: seg, Remote: fa + uint64(i%4)<<20, Length: 1 << 20}); err != nil {
			t.Fatalf("submit %d: %v", i, err)
		}
	}
	if err := owner.UnregisterMemory(fa); err != nil {
		t.Fatal(err)
	}
	st, err := b.Wait(60 * time.Second)
	if err != nil {
		t.Fatalf("peer's reads did not end: %v", err)
	}
	if st.Completed+st.Failed != k {
		t.Fatalf("status %+v", st)
	}
	t.Logf("after unregister: %d completed, %d failed", st.Completed, st.Failed)
}

// TestWindowOverAFile: a window the owner grants over part of its file
// admits requests inside it (locally and over tcp) and, once revoked,
// refuses them; requests outside it are refused all along.
func TestWindowOverAFile(t *testing.T) {
	owner := newEngine(t, nil)
	fa, err := owner.RegisterFile(filepath.Join(directDir(t), "win"), 0, 4<<20, engine.FileOptions{Remote: true, Create: true})
	if err != nil {
		t.Fatal(err)
	}
	key, err := owner.GrantWindow([]engine.Range{{Addr: fa + 1<<20, Length: 1 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	buf := alloc(t, 1<<20)
	fill(buf, 4)
	peer := newEngine(t, nil, func(c *engine.Config) { c.Transports = []string{"tcp"} })
	peer.RegisterMemory(mem.Addr(buf), 1<<20, "cpu", false)
	owner.RegisterMemory(mem.Addr(buf), 1<<20, "cpu", false)
	for _, e := range []*engine.Engine{owner, peer} {
		seg, err := e.OpenSegment(owner.Name())
		if err != nil {
			t.Fatal(err)
		}
		run := func(remote uint64) engine.TaskStatus {
			b, _ := e.AllocateBatch(1)
			defer b.Free()
			if err := b.Submit(engine.Request{Op: engine.Write, Local: mem.Addr(buf), Segment: seg, Remote: remote, Length: 64 << 10, Window: key}); err != nil {
				return engine.TaskStatus{State: engine.Failed, Err: err}
			}
			b.Wait(30 * time.Second)
			s, _ := b.TaskStatus(0)
			return s
		}
		if s := run(fa + 1<<20); s.State != engine.Completed {
			t.Fatalf("%s: inside the window: %+v", e.Name(), s)
		}
		if s := run(fa); s.State == engine.Completed {
			t.Fatalf("%s: outside the window: completed", e.Name())
		}
	}
	if err := owner.RevokeWindow(key); err != nil {
		t.Fatal(err)
	}
	seg, _ := peer.OpenSegment(owner.Name())
	b, _ := peer.AllocateBatch(1)
	defer b.Free()
	b.Submit(engine.Request{Op: engine.Write, Local: mem.Addr(buf), Segment: seg, Remote: fa + 1<<20, Length: 4096, Window: key})
	if st, _ := b.Wait(30 * time.Second); st.State == engine.Completed {
		t.Fatal("a revoked window over a file still admitted a write")
	}
}

// TestFixedBuffers: with file.fixed=1 registered host memory becomes the
// rings' registered buffers (fixed_ios counted), every byte still right,
// and unregistering the memory drops it from them.
func TestFixedBuffers(t *testing.T) {
	e := newEngine(t, map[string]string{"file.fixed": "1"})
	const n = 4 << 20
	src, dst := alloc(t, n), alloc(t, n)
	fill(src, 13)
	e.RegisterMemory(mem.Addr(src), n, "cpu", false)
	fa, err := e.RegisterFile(filepath.Join(directDir(t), "fixed"), 0, n, engine.FileOptions{Remote: true, Create: true})
	if err != nil {
		t.Fatal(err)
	}
	e.RegisterMemory(mem.Addr(dst), n, "cpu", false) // after the executor started
	seg, _ := e.OpenSegment(e.Name())
	if st := transfer(t, e, seg, engine.Write, mem.Addr(src), fa, n, 1<<20); st.State != engine.Completed {
		t.Fatal(st)
	}
	if st := transfer(t, e, seg, engine.Read, mem.Addr(dst), fa, n, 64<<10); st.State != engine.Completed {
		t.Fatal(st)
	}
	if !bytes.Equal(src, dst) {
		t.Fatal("read back differs")
	}
	fs := e.TransportStats()["file"]
	if fs["io_uring"] == 1 && fs["fixed_ios"] == 0 {
		t.Fatalf("no fixed I/O: %v", fs)
	}
	if err := e.UnregisterMemory(mem.Addr(dst)); err != nil {
		t.Fatal(err)
	}
	if _, err := engine.New(engine.Config{Hostname: "127.0.0.1", Params: map[string]string{"file.fixed": "maybe"},
		Transports: []string{"file"}, Logger: quiet}); errs.CodeOf(err) != errs.TransportUnavailable && errs.CodeOf(err) != errs.InvalidArgument {
		t.Fatalf("file.fixed=maybe: %v", err)
	}
}
