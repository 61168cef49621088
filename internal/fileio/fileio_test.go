package fileio

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/sys/mem"
	"github.com/tecache/te/internal/testexec"
)

// modes runs body once per back end; io_uring is skipped where the kernel
// refuses it (and the pool is what runs there).
func modes(t *testing.T, body func(t *testing.T, x *Executor)) {
	for _, m := range []string{"io_uring", "pool"} {
		t.Run(m, func(t *testing.T) {
			var logged []string
			x, err := New(Config{ForcePool: m == "pool", Chunk: 256 << 10, Depth: 16,
				Logf: func(f string, a ...any) { logged = append(logged, fmt.Sprintf(f, a...)) }})
			if err != nil {
				t.Fatal(err)
			}
			defer x.Close()
			if x.Mode() != m {
				x.Close()
				t.Skipf("%s unavailable here: %v", m, logged)
			}
			if len(logged) != 1 || !strings.Contains(logged[0], map[string]string{"io_uring": "io_uring", "pool": "pread/pwrite"}[m]) {
				t.Fatalf("log %q", logged)
			}
			body(t, x)
		})
	}
}

// directDir is a directory on a file system that takes O_DIRECT: the test's
// temp dir when it does (ext4, xfs), else the working directory's.
func directDir(t testing.TB) string {
	t.Helper()
	for _, d := range []string{t.TempDir(), "."} {
		p := filepath.Join(d, ".odirect-probe")
		fd, err := unix.Open(p, unix.O_CREAT|unix.O_RDWR|unix.O_DIRECT, 0o600)
		if err == nil {
			unix.Close(fd)
			os.Remove(p)
			if d == "." {
				d, _ = os.MkdirTemp(".", "fileio-test-")
				t.Cleanup(func() { os.RemoveAll(d) })
			}
			return d
		}
	}
	t.Skip("no file system here takes O_DIRECT")
	return ""
}

// run submits ops and waits for each Done, returning the errors in order.
func run(t *testing.T, x *Executor, ops ...*Op) []error {
	t.Helper()
	out := make([]error, len(ops))
	var wg sync.WaitGroup
	wg.Add(len(ops))
	for i, op := range ops {
		i := i
		var once atomic.Bool
		op.Done = func(_ *Op, err error) {
			if !once.CompareAndSwap(false, true) {
				t.Errorf("op %d completed twice", i)
				return
			}
			out[i] = err
			wg.Done()
		}
	}
	x.Submit(ops...)
	ch := make(chan struct{})
	go func() { wg.Wait(); close(ch) }()
	select {
	case <-ch:
	case <-time.After(60 * time.Second):
		t.Fatal("ops did not complete")
	}
	return out
}

func fill(b []byte, seed int) {
	for i := range b {
		b[i] = byte(i*131 + seed + i>>12)
	}
}

func TestRoundTripEveryByte(t *testing.T) {
	modes(t, func(t *testing.T, x *Executor) {
		dir := directDir(t)
		for _, direct := range []bool{true, false} {
			for _, bs := range []uint64{4 << 10, 1 << 20} {
				t.Run(fmt.Sprintf("direct=%v/bs=%d", direct, bs), func(t *testing.T) {
					const total = 4 << 20
					f, err := x.Open(filepath.Join(dir, "rt"), 0, total, OpenOptions{Create: true, NoDirect: !direct})
					if err != nil {
						t.Fatal(err)
					}
					defer f.Close()
					if f.Direct() != direct {
						t.Fatalf("Direct() = %v", f.Direct())
					}
					src, dst := mem.MustAlloc(total), mem.MustAlloc(total)
					defer mem.Free(src)
					defer mem.Free(dst)
					fill(src, int(bs))
					before := x.Stats()
					var ws, rs []*Op
					for off := uint64(0); off < total; off += bs {
						ws = append(ws, &Op{Write: true, File: f, Off: off, Addr: mem.Addr(src) + off, Len: bs})
						rs = append(rs, &Op{File: f, Off: off, Addr: mem.Addr(dst) + off, Len: bs})
					}
					for i, err := range run(t, x, ws...) {
						if err != nil {
							t.Fatalf("write %d: %v", i, err)
						}
					}
					for i, err := range run(t, x, rs...) {
						if err != nil {
							t.Fatalf("read %d: %v", i, err)
						}
					}
					if !bytes.Equal(src, dst) {
						t.Fatal("read back differs")
					}
					st := x.Stats()
					if direct && st.DirectIOs == before.DirectIOs || !direct && st.BufferedIOs == before.BufferedIOs {
						t.Fatalf("stats before %+v after %+v", before, st)
					}
					if st.WriteBytes-before.WriteBytes != total || st.ReadBytes-before.ReadBytes != total {
						t.Fatalf("bytes: %+v", st)
					}
				})
			}
		}
	})
}

// A misaligned request on an O_DIRECT file goes through the buffered
// descriptor: served, never corrupted, and counted.
func TestMisalignedIsServedBuffered(t *testing.T) {
	modes(t, func(t *testing.T, x *Executor) {
		f, err := x.Open(filepath.Join(directDir(t), "mis"), 0, 1<<20, OpenOptions{Create: true})
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if !f.Direct() {
			t.Skip("no O_DIRECT")
		}
		buf := mem.MustAlloc(3 << 20)
		defer mem.Free(buf)
		fill(buf, 7)
		base := mem.Addr(buf)
		// Aligned background, then misaligned patches over it.
		if err := run(t, x, &Op{Write: true, File: f, Off: 0, Addr: base, Len: 1 << 20})[0]; err != nil {
			t.Fatal(err)
		}
		before := x.Stats()
		patches := []struct{ addr, off, n uint64 }{
			// Disjoint (they run concurrently, in no order).
			{base + 1<<20 + 1, 4096, 4096},   // memory misaligned
			{base + 1<<20, 8193, 4096},       // offset misaligned
			{base + 1<<20, 16384, 4095},      // length misaligned
			{base + 1<<20 + 3, 20481, 70001}, // all three, several pages
			{base + 1<<20 + 9, 1<<20 - 5, 5}, // up to the range's end
		}
		var ops []*Op
		for _, p := range patches {
			ops = append(ops, &Op{Write: true, File: f, Off: p.off, Addr: p.addr, Len: p.n})
		}
		for i, err := range run(t, x, ops...) {
			if err != nil {
				t.Fatalf("patch %d: %v", i, err)
			}
		}
		want := append([]byte(nil), buf[:1<<20]...)
		for _, p := range patches {
			copy(want[p.off:p.off+p.n], mem.Bytes(p.addr, p.n))
		}
		// Read back both aligned (direct) and misaligned.
		dst := buf[2<<20:]
		if err := run(t, x, &Op{File: f, Off: 0, Addr: mem.Addr(dst), Len: 1 << 20})[0]; err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(dst[:1<<20], want) {
			t.Fatal("aligned read back differs")
		}
		clear(dst)
		if err := run(t, x, &Op{File: f, Off: 333, Addr: mem.Addr(dst) + 1, Len: 100000})[0]; err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(dst[1:100001], want[333:100333]) {
			t.Fatal("misaligned read back differs")
		}
		if st := x.Stats(); st.BufferedIOs-before.BufferedIOs < uint64(len(patches)) {
			t.Fatalf("misaligned I/Os not counted as buffered: %+v", st)
		}
	})
}

func TestBadOpsRefusedAtOnce(t *testing.T) {
	modes(t, func(t *testing.T, x *Executor) {
		dir := t.TempDir()
		p := filepath.Join(dir, "ro")
		if err := os.WriteFile(p, make([]byte, 8192), 0o600); err != nil {
			t.Fatal(err)
		}
		f, err := x.Open(p, 0, 0, OpenOptions{ReadOnly: true})
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if f.Size() != 8192 || !f.ReadOnly() {
			t.Fatalf("size %d ro %v", f.Size(), f.ReadOnly())
		}
		buf := mem.MustAlloc(16384)
		defer mem.Free(buf)
		a := mem.Addr(buf)
		errsGot := run(t, x,
			&Op{File: f, Off: 4096, Addr: a, Len: 8192},           // past the range
			&Op{File: f, Off: ^uint64(0) - 10, Addr: a, Len: 100}, // overflow
			&Op{Write: true, File: f, Off: 0, Addr: a, Len: 4096}, // read-only
			&Op{File: nil, Off: 0, Addr: a, Len: 4096},            // no file
			&Op{File: f, Off: 0, Addr: a, Len: 0},                 // empty
			&Op{File: f, Off: 0, Addr: a, Len: 8192},              // fine
		)
		want := []errs.Code{errs.InvalidArgument, errs.InvalidArgument, errs.AccessDenied, errs.InvalidArgument, errs.InvalidArgument, errs.OK}
		for i, err := range errsGot {
			if errs.CodeOf(err) != want[i] {
				t.Errorf("op %d: %v, want %v", i, err, want[i])
			}
		}
		// Opening: missing file, a range past the end, a directory.
		if _, err := x.Open(filepath.Join(dir, "nope"), 0, 4096, OpenOptions{}); errs.CodeOf(err) != errs.NotFound {
			t.Errorf("missing file: %v", err)
		}
		if _, err := x.Open(p, 4096, 8192, OpenOptions{}); errs.CodeOf(err) != errs.InvalidArgument {
			t.Errorf("short file: %v", err)
		}
		if _, err := x.Open(dir, 0, 4096, OpenOptions{}); err == nil {
			t.Error("a directory opened")
		}
		if _, err := x.OpenFD(-1, 0, 4096, OpenOptions{}); errs.CodeOf(err) != errs.InvalidArgument {
			t.Errorf("fd -1: %v", err)
		}
	})
}

func TestOpenFD(t *testing.T) {
	modes(t, func(t *testing.T, x *Executor) {
		p := filepath.Join(directDir(t), "fd")
		fd, err := unix.Open(p, unix.O_CREAT|unix.O_RDWR|unix.O_CLOEXEC, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		unix.Ftruncate(fd, 1<<20)
		f, err := x.OpenFD(fd, 4096, 64<<10, OpenOptions{})
		unix.Close(fd) // the executor holds its own descriptors
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if f.Base() != 4096 || f.Size() != 64<<10 || !strings.HasSuffix(f.Path(), "/fd") {
			t.Fatalf("base %d size %d path %q", f.Base(), f.Size(), f.Path())
		}
		buf := mem.MustAlloc(64 << 10)
		defer mem.Free(buf)
		fill(buf, 3)
		if err := run(t, x, &Op{Write: true, File: f, Off: 0, Addr: mem.Addr(buf), Len: 64 << 10})[0]; err != nil {
			t.Fatal(err)
		}
		got, _ := os.ReadFile(p)
		if !bytes.Equal(got[4096:4096+64<<10], buf) || !bytes.Equal(got[:4096], make([]byte, 4096)) {
			t.Fatal("write through the fd landed elsewhere")
		}
	})
}

// A descriptor open with O_APPEND would make every pwrite land at the end of
// the file: the executor works on its own description without it, so writes
// land at their offsets and the file does not grow.
func TestOpenFDAppend(t *testing.T) {
	modes(t, func(t *testing.T, x *Executor) {
		p := filepath.Join(t.TempDir(), "append")
		fd, err := unix.Open(p, unix.O_CREAT|unix.O_RDWR|unix.O_APPEND|unix.O_CLOEXEC, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(fd)
		unix.Ftruncate(fd, 1<<20)
		// Buffered: an O_DIRECT twin is reopened without O_APPEND anyway.
		f, err := x.OpenFD(fd, 4096, 64<<10, OpenOptions{NoDirect: true})
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		buf := mem.MustAlloc(64 << 10)
		defer mem.Free(buf)
		fill(buf, 5)
		if err := run(t, x, &Op{Write: true, File: f, Off: 0, Addr: mem.Addr(buf), Len: 64 << 10})[0]; err != nil {
			t.Fatal(err)
		}
		got, _ := os.ReadFile(p)
		if len(got) != 1<<20 {
			t.Fatalf("the file grew to %d bytes: the write was appended", len(got))
		}
		if !bytes.Equal(got[4096:4096+64<<10], buf) {
			t.Fatal("write through an O_APPEND fd landed elsewhere")
		}
		// The caller's descriptor keeps its own flags.
		if fl, _ := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0); fl&unix.O_APPEND == 0 {
			t.Fatal("the caller's descriptor lost O_APPEND")
		}
	})
}

// A file truncated while registered fails the reads past its new end with
// IO; one removed (unlinked) stays readable through the open descriptors.
func TestTruncatedAndRemoved(t *testing.T) {
	modes(t, func(t *testing.T, x *Executor) {
		p := filepath.Join(directDir(t), "trunc")
		f, err := x.Open(p, 0, 1<<20, OpenOptions{Create: true})
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		buf := mem.MustAlloc(2 << 20)
		defer mem.Free(buf)
		fill(buf, 1)
		if err := run(t, x, &Op{Write: true, File: f, Off: 0, Addr: mem.Addr(buf), Len: 1 << 20})[0]; err != nil {
			t.Fatal(err)
		}
		if err := os.Remove(p); err != nil {
			t.Fatal(err)
		}
		dst := buf[1<<20:]
		if err := run(t, x, &Op{File: f, Off: 0, Addr: mem.Addr(dst), Len: 1 << 20})[0]; err != nil {
			t.Fatalf("read after unlink: %v", err)
		}
		if !bytes.Equal(dst, buf[:1<<20]) {
			t.Fatal("read after unlink differs")
		}
		if err := unix.Ftruncate(f.bfd, 100<<10); err != nil {
			t.Fatal(err)
		}
		got := run(t, x,
			&Op{File: f, Off: 0, Addr: mem.Addr(dst), Len: 64 << 10},          // before the new end
			&Op{File: f, Off: 64 << 10, Addr: mem.Addr(dst), Len: 256 << 10},  // across it
			&Op{File: f, Off: 512 << 10, Addr: mem.Addr(dst), Len: 256 << 10}, // past it
		)
		if got[0] != nil || errs.CodeOf(got[1]) != errs.IO || errs.CodeOf(got[2]) != errs.IO {
			t.Fatalf("after truncation: %v", got)
		}
		if !strings.Contains(got[2].Error(), "shorter than its registered range") {
			t.Fatalf("message: %v", got[2])
		}
	})
}

// Cancel ends ops once the kernel is done with them: after Done nothing
// writes the memory (checked by filling it and looking again later).
func TestCancelIsAFence(t *testing.T) {
	modes(t, func(t *testing.T, x *Executor) {
		const n, size = 32, 1 << 20
		f, err := x.Open(filepath.Join(directDir(t), "cancel"), 0, size, OpenOptions{Create: true})
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		src := mem.MustAlloc(size)
		defer mem.Free(src)
		fill(src, 9)
		if err := run(t, x, &Op{Write: true, File: f, Addr: mem.Addr(src), Len: size})[0]; err != nil {
			t.Fatal(err)
		}
		dst := mem.MustAlloc(n * size)
		defer mem.Free(dst)
		for round := 0; round < 5; round++ {
			ops := make([]*Op, n)
			var wg sync.WaitGroup
			wg.Add(n)
			res := make([]error, n)
			for i := range ops {
				i := i
				ops[i] = &Op{File: f, Addr: mem.Addr(dst) + uint64(i)*size, Len: size, Done: func(_ *Op, err error) {
					res[i] = err
					// The fence: nothing of this op touches its memory
					// from here on.
					b := mem.Bytes(mem.Addr(dst)+uint64(i)*size, size)
					for j := range b {
						b[j] = 0xEE
					}
					wg.Done()
				}}
			}
			x.Submit(ops...)
			// Round 0 cancels before the worker takes the ops; later
			// rounds let I/Os reach the kernel first.
			time.Sleep(time.Duration(round*round) * 300 * time.Microsecond)
			x.Cancel(ops[n/2:]...)
			x.Cancel(ops[n/2:]...) // twice is harmless
			wg.Wait()
			x.Cancel(ops...) // after the end: nothing happens
			canceled := 0
			for i, err := range res {
				switch errs.CodeOf(err) {
				case errs.OK:
				case errs.Canceled:
					canceled++
					if i < n/2 {
						t.Fatalf("op %d was not canceled but ended %v", i, err)
					}
				default:
					t.Fatalf("op %d: %v", i, err)
				}
			}
			time.Sleep(20 * time.Millisecond)
			for i := 0; i < n*size; i++ {
				if dst[i] != 0xEE {
					t.Fatalf("round %d: byte %d written after its op ended", round, i)
				}
			}
			t.Logf("round %d: %d of %d canceled", round, canceled, n/2)
		}
	})
}

// File.Close refuses new ops at once and returns only after the running ones
// ended; the executor's Close fails what is queued and waits for the rest.
func TestCloseWaitsForInflight(t *testing.T) {
	modes(t, func(t *testing.T, x *Executor) {
		const n, size = 64, 1 << 20
		f, err := x.Open(filepath.Join(t.TempDir(), "close"), 0, size, OpenOptions{Create: true})
		if err != nil {
			t.Fatal(err)
		}
		dst := mem.MustAlloc(n * size)
		defer mem.Free(dst)
		var ended atomic.Int64
		ops := make([]*Op, n)
		for i := range ops {
			ops[i] = &Op{File: f, Addr: mem.Addr(dst) + uint64(i)*size, Len: size, Done: func(*Op, error) { ended.Add(1) }}
		}
		x.Submit(ops...)
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
		if ended.Load() != n {
			t.Fatalf("Close returned with %d of %d ops ended", ended.Load(), n)
		}
		if err := run(t, x, &Op{File: f, Addr: mem.Addr(dst), Len: 4096})[0]; errs.CodeOf(err) != errs.Closed {
			t.Fatalf("op on a closed file: %v", err)
		}
		if f.Close() != nil {
			t.Fatal("second close")
		}
		// Executor close with ops queued.
		g, err := x.Open(filepath.Join(t.TempDir(), "close2"), 0, size, OpenOptions{Create: true})
		if err != nil {
			t.Fatal(err)
		}
		defer g.Close()
		ended.Store(0)
		for i := range ops {
			ops[i] = &Op{File: g, Addr: mem.Addr(dst) + uint64(i)*size, Len: size, Done: func(_ *Op, err error) {
				if err != nil && errs.CodeOf(err) != errs.Closed {
					t.Errorf("closing executor: %v", err)
				}
				ended.Add(1)
			}}
		}
		x.Submit(ops...)
		x.Close()
		if ended.Load() != n {
			t.Fatalf("executor Close returned with %d of %d ops ended", ended.Load(), n)
		}
		if err := run(t, x, &Op{File: g, Addr: mem.Addr(dst), Len: 4096})[0]; errs.CodeOf(err) != errs.Closed {
			t.Fatalf("op after executor close: %v", err)
		}
	})
}

// Many small ops and one op much larger than a chunk, concurrently from
// several goroutines.
func TestConcurrentMixed(t *testing.T) {
	modes(t, func(t *testing.T, x *Executor) {
		const size = 16 << 20
		f, err := x.Open(filepath.Join(directDir(t), "mixed"), 0, size, OpenOptions{Create: true})
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		src, dst := mem.MustAlloc(size), mem.MustAlloc(size)
		defer mem.Free(src)
		defer mem.Free(dst)
		fill(src, 5)
		if err := run(t, x, &Op{Write: true, File: f, Addr: mem.Addr(src), Len: size})[0]; err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		for g := 0; g < 4; g++ {
			wg.Add(1)
			go func(g int) {
				defer wg.Done()
				lo := uint64(g) * size / 4
				var ops []*Op
				for off := lo; off < lo+size/4; off += 4096 {
					ops = append(ops, &Op{File: f, Off: off, Addr: mem.Addr(dst) + off, Len: 4096})
				}
				for i, err := range run(t, x, ops...) {
					if err != nil {
						t.Errorf("goroutine %d op %d: %v", g, i, err)
						return
					}
				}
			}(g)
		}
		wg.Wait()
		if !bytes.Equal(src, dst) {
			t.Fatal("small reads differ")
		}
	})
}

// TestNoSpaceTmpfs fills a 1 MiB tmpfs (mounted for the test; needs root):
// the write that does not fit fails with NoSpace, the others complete.
func TestNoSpaceTmpfs(t *testing.T) {
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=1m"); err != nil {
		t.Skipf("cannot mount a tmpfs here (%v); TestFileSizeLimit covers a full file", err)
	}
	defer unix.Unmount(dir, unix.MNT_DETACH)
	modes(t, func(t *testing.T, x *Executor) {
		p := filepath.Join(dir, "full")
		defer os.Remove(p)
		f, err := x.Open(p, 0, 4<<20, OpenOptions{Create: true}) // sparse: fits until written
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		buf := mem.MustAlloc(4 << 20)
		defer mem.Free(buf)
		fill(buf, 2)
		got := run(t, x, &Op{Write: true, File: f, Off: 0, Addr: mem.Addr(buf), Len: 512 << 10})
		if got[0] != nil {
			t.Fatal(got[0])
		}
		got = run(t, x, &Op{Write: true, File: f, Off: 1 << 20, Addr: mem.Addr(buf), Len: 3 << 20})
		if errs.CodeOf(got[0]) != errs.NoSpace || !strings.Contains(got[0].Error(), "no space left") {
			t.Fatalf("write past the tmpfs size: %v", got[0])
		}
		// What fit is intact.
		dst := mem.MustAlloc(512 << 10)
		defer mem.Free(dst)
		if err := run(t, x, &Op{File: f, Addr: mem.Addr(dst), Len: 512 << 10})[0]; err != nil || !bytes.Equal(dst, buf[:512<<10]) {
			t.Fatalf("read back after ENOSPC: %v", err)
		}
	})
}

// TestFileSizeLimit runs in a child process with RLIMIT_FSIZE of 1 MiB (Go
// ignores SIGXFSZ, so the write fails with EFBIG): NoSpace on that task only.
func TestFileSizeLimit(t *testing.T) {
	if os.Getenv("TE_FILEIO_CHILD") == "fsize" {
		childFileSizeLimit(t)
		return
	}
	cmd := testexec.Command(os.Args[0], "-test.run=^TestFileSizeLimit$", "-test.v")
	cmd.Env = append(os.Environ(), "TE_FILEIO_CHILD=fsize", "TE_FILEIO_DIR="+t.TempDir())
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "limit checked") {
		t.Fatalf("child: %v\n%s", err, out)
	}
}

func childFileSizeLimit(t *testing.T) {
	if err := unix.Setrlimit(unix.RLIMIT_FSIZE, &unix.Rlimit{Cur: 1 << 20, Max: 1 << 20}); err != nil {
		t.Fatal(err)
	}
	modes(t, func(t *testing.T, x *Executor) {
		p := filepath.Join(os.Getenv("TE_FILEIO_DIR"), "big-"+x.Mode())
		f, err := x.Open(p, 0, 1<<20, OpenOptions{Create: true})
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		// The range is 1 MiB: reopen a larger range of the same file.
		fd, err := unix.Open(p, unix.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(fd)
		buf := mem.MustAlloc(2 << 20)
		defer mem.Free(buf)
		fill(buf, 4)
		if err := run(t, x, &Op{Write: true, File: f, Addr: mem.Addr(buf), Len: 1 << 20})[0]; err != nil {
			t.Fatal(err)
		}
		g := &File{x: x, path: p, dfd: -1, bfd: fd, size: 2 << 20, memAlign: 1, offAlign: 1, idle: make(chan struct{})}
		g.refs.Store(1)
		got := run(t, x, &Op{Write: true, File: g, Off: 1 << 20, Addr: mem.Addr(buf), Len: 4096})
		if errs.CodeOf(got[0]) != errs.NoSpace || !strings.Contains(got[0].Error(), "file size limit") {
			t.Fatalf("write past RLIMIT_FSIZE: %v", got[0])
		}
	})
	fmt.Println("limit checked")
}

// Staging buffers lent to a server may come back after the executor
// closed: the memory stays mapped until the last one does.
func TestStagingOutlivesClose(t *testing.T) {
	modes(t, func(t *testing.T, x *Executor) {
		if x.StageCount() == 0 {
			t.Fatal("no staging buffers")
		}
		a, ok := x.TakeStage(nil)
		if !ok {
			t.Fatal("no staging buffer")
		}
		b := mem.Bytes(a, x.Chunk())
		x.Close()
		for i := range b {
			b[i] = byte(i) // still mapped: a server may be reading into it
		}
		if _, ok := x.TakeStage(nil); ok {
			t.Fatal("a staging buffer lent after Close")
		}
		x.PutStage(a)
		x.stageMu.Lock()
		gone := x.stage == nil
		x.stageMu.Unlock()
		if !gone {
			t.Fatal("staging memory kept after the last buffer came back")
		}
		// Without a pool: none to lend, at once.
		y, err := New(Config{Staging: -1, ForcePool: true})
		if err != nil {
			t.Fatal(err)
		}
		defer y.Close()
		if _, ok := y.TakeStage(make(chan struct{})); ok || y.StageCount() != 0 {
			t.Fatal("lent a staging buffer without a pool")
		}
	})
}

// SetFixed registers memory with the rings: I/O into it goes READ_FIXED /
// WRITE_FIXED (counted), every byte still right; dropping the set makes it
// plain again, and a bad range is refused.
func TestSetFixed(t *testing.T) {
	modes(t, func(t *testing.T, x *Executor) {
		const n = 4 << 20
		f, err := x.Open(filepath.Join(directDir(t), "fixed"), 0, n, OpenOptions{Create: true})
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		src, dst := mem.MustAlloc(n), mem.MustAlloc(n)
		defer mem.Free(src)
		defer mem.Free(dst)
		fill(src, 12)
		if err := x.SetFixed([][2]uint64{{mem.Addr(src), n}, {mem.Addr(dst), n}}); err != nil {
			t.Skipf("the kernel refused to register the buffers: %v", err)
		}
		before := x.Stats().FixedIOs
		if err := run(t, x, &Op{Write: true, File: f, Addr: mem.Addr(src), Len: n})[0]; err != nil {
			t.Fatal(err)
		}
		if err := run(t, x, &Op{File: f, Addr: mem.Addr(dst), Len: n})[0]; err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(src, dst) {
			t.Fatal("read back through fixed buffers differs")
		}
		got := x.Stats().FixedIOs - before
		if x.Mode() == "io_uring" && got == 0 {
			t.Fatal("no I/O used the fixed buffers")
		}
		if err := x.SetFixed(nil); err != nil {
			t.Fatal(err)
		}
		before = x.Stats().FixedIOs
		if err := run(t, x, &Op{File: f, Addr: mem.Addr(dst), Len: n})[0]; err != nil {
			t.Fatal(err)
		}
		if x.Stats().FixedIOs != before {
			t.Fatal("I/O used a dropped fixed buffer")
		}
		if err := x.SetFixed([][2]uint64{{mem.Addr(src), 0}}); errs.CodeOf(err) != errs.InvalidArgument {
			t.Fatalf("empty range: %v", err)
		}
		// Sets swapped while reads run: each swap waits for the I/O on
		// the old table, and every read lands right.
		stop := make(chan struct{})
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				set := [][2]uint64{{mem.Addr(dst), n}}
				if i%2 == 1 {
					set = nil
				}
				if err := x.SetFixed(set); err != nil {
					t.Errorf("swap %d: %v", i, err)
					return
				}
			}
		}()
		for round := 0; round < 20; round++ {
			clear(dst)
			var ops []*Op
			for off := uint64(0); off < n; off += 256 << 10 {
				ops = append(ops, &Op{File: f, Off: off, Addr: mem.Addr(dst) + off, Len: 256 << 10})
			}
			for i, err := range run(t, x, ops...) {
				if err != nil {
					t.Fatalf("round %d op %d: %v", round, i, err)
				}
			}
			if !bytes.Equal(src, dst) {
				t.Fatalf("round %d: read back differs while the table changed", round)
			}
		}
		close(stop)
		wg.Wait()
		x.SetFixed(nil)
	})
}

// TestCreateDoesNotFollowLinks: a symbolic link planted where a file is to
// be created is refused (AccessDenied), and the file it points at is left
// as it was (before, it was grown to the registered size).
func TestCreateDoesNotFollowLinks(t *testing.T) {
	x, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer x.Close()
	dir := t.TempDir()
	victim := filepath.Join(dir, "victim.conf")
	if err := os.WriteFile(victim, []byte("keep"), 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "kv.bin")
	if err := os.Symlink(victim, link); err != nil {
		t.Fatal(err)
	}
	f, err := x.Open(link, 0, 1<<20, OpenOptions{Create: true})
	if err == nil {
		f.Close()
		t.Fatal("created through a symbolic link")
	}
	if errs.CodeOf(err) != errs.AccessDenied || !strings.Contains(err.Error(), "symbolic link") {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(victim); string(b) != "keep" {
		t.Fatalf("victim is now %d bytes", len(b))
	}
}

// TestDefaultRings: one ring per four cores, at least one and at most two.
func TestDefaultRings(t *testing.T) {
	for procs, want := range map[int]int{1: 1, 2: 1, 3: 1, 4: 1, 7: 1, 8: 2, 64: 2} {
		if got := defaultRings(procs); got != want {
			t.Errorf("defaultRings(%d) = %d, want %d", procs, got, want)
		}
	}
}
