package storetest

import (
	_ "github.com/tecache/te/engine/std"

	"bufio"
	"bytes"
	"context"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/tecache/te/engine"
	"github.com/tecache/te/engine/meta"
	"github.com/tecache/te/engine/segment"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/sys/mem"
)

// envChild makes a re-executed test binary run an engine on the store named
// by its value, print the segment name and live until stdin closes.
const envChild = "TE_STORETEST_CHILD"

// Main runs the tests, or the child engine when the binary was re-executed
// by the killed-engine test; call it from TestMain. It checks for leaked
// goroutines, except fasthttp's server housekeeping (a worker-pool cleaner
// that notices a shutdown on its next 10 s tick, and a process-wide clock),
// which tests that run te-sidecar's server in process leave behind.
func Main(m *testing.M) {
	if conn := os.Getenv(envChild); conn != "" {
		os.Exit(runChild(conn))
	}
	goleak.VerifyTestMain(m,
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*workerPool).Start.func2"),
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.updateServerDate.func1"))
}

// The child engine's buffer and its contents.
const childLen = 1 << 16

func childByte(i int) byte { return byte(i*7 + 3) }

func runChild(conn string) int {
	e, err := engine.New(engine.Config{Metadata: conn, ListenAddr: "127.0.0.1:0", Hostname: "127.0.0.1",
		RPCTimeout: time.Second, Logger: quiet()})
	if err != nil {
		os.Stdout.WriteString("error " + err.Error() + "\n")
		return 1
	}
	buf := mem.MustAlloc(childLen)
	for i := range buf {
		buf[i] = childByte(i)
	}
	if err := e.RegisterMemory(mem.Addr(buf), childLen, "cpu:0", true); err != nil {
		os.Stdout.WriteString("error " + err.Error() + "\n")
		return 1
	}
	os.Stdout.WriteString("segment " + e.Name() + " " + strconv.FormatUint(mem.Addr(buf), 10) + "\n")
	io.Copy(io.Discard, os.Stdin)
	e.Close()
	return 0
}

// Setup describes the store under test.
type Setup struct {
	// Conn is the connection string the engines use.
	Conn string
	// Down makes the store unreachable; Up brings it back (with or without
	// its data).
	Down, Up func()
	// Expires is the TTL after which a killed engine's segment leaves the
	// store (the test allows 3 s more for the server's expiry sweep). Zero:
	// the store keeps a dead engine's keys (the HTTP protocol has no TTL).
	Expires time.Duration
	// Watch says the store pushes changes (meta.Watcher): an open handle
	// to a vanished segment fails without a transfer having to fail first.
	Watch bool
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func newEngine(t *testing.T, conn string) *engine.Engine {
	t.Helper()
	e, err := engine.New(engine.Config{Metadata: conn, ListenAddr: "127.0.0.1:0", Hostname: "127.0.0.1",
		RPCTimeout: time.Second, Logger: quiet()})
	if err != nil {
		t.Fatalf("engine on %s: %v", conn, err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

type buf struct {
	b    []byte
	addr uint64
}

func register(t *testing.T, e *engine.Engine, n int, fill byte) buf {
	t.Helper()
	b := mem.MustAlloc(n)
	t.Cleanup(func() { mem.Free(b) })
	for i := range b {
		b[i] = fill + byte(i%251)
	}
	if err := e.RegisterMemory(mem.Addr(b), uint64(n), "cpu:0", true); err != nil {
		t.Fatal(err)
	}
	return buf{b, mem.Addr(b)}
}

func transfer(t *testing.T, e *engine.Engine, op engine.Opcode, local buf, seg *engine.Segment, remote buf) {
	t.Helper()
	bt, err := e.AllocateBatch(1)
	if err != nil {
		t.Fatal(err)
	}
	defer bt.Free()
	n := uint64(len(local.b))
	if err := bt.Submit(engine.Request{Op: op, Local: local.addr, Segment: seg, Remote: remote.addr, Length: n}); err != nil {
		t.Fatalf("submit: %v", err)
	}
	st, err := bt.Wait(5 * time.Second)
	if err != nil || st.State != engine.Completed {
		ts, _ := bt.TaskStatus(0)
		t.Fatalf("transfer: %v %v %+v", st, err, ts)
	}
	if !bytes.Equal(local.b, remote.b) {
		t.Fatal("bytes differ after the transfer")
	}
}

func openStore(t *testing.T, conn string) meta.Store {
	t.Helper()
	s, err := meta.Open(conn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// storedDesc reads a segment's descriptor straight from the store.
func storedDesc(s meta.Store, name string) (*segment.Desc, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	b, err := s.Get(ctx, meta.KeyRAM(name))
	if err != nil {
		return nil, err
	}
	return segment.Decode(b)
}

// Eventually polls f until it succeeds and returns how long that took; it
// fails the test when f still fails after within.
func Eventually(t testing.TB, within time.Duration, what string, f func() error) time.Duration {
	t.Helper()
	t0 := time.Now()
	for {
		err := f()
		if err == nil {
			return time.Since(t0)
		}
		if time.Since(t0) >= within {
			t.Fatalf("%s: not within %v: %v", what, within, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Holds checks f every 50 ms for d and fails the test at the first
// failure: what must stay true for a while (a key kept alive past its TTL,
// a deleted key staying deleted) is watched all along, not looked at once
// after a sleep.
func Holds(t testing.TB, d time.Duration, what string, f func() error) {
	t.Helper()
	t0 := time.Now()
	for {
		if err := f(); err != nil {
			t.Fatalf("%s: failed after %v: %v", what, time.Since(t0), err)
		}
		if time.Since(t0) >= d {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func eventually(t *testing.T, within time.Duration, what string, f func() error) time.Duration {
	t.Helper()
	return Eventually(t, within, what, f)
}

// Run runs the store test body over s.
func Run(t *testing.T, s Setup) {
	t.Run("Transfer", func(t *testing.T) { testTransfer(t, s) })
	t.Run("Closed", func(t *testing.T) { testClosed(t, s) })
	t.Run("Killed", func(t *testing.T) { testKilled(t, s) })
	if s.Down != nil {
		t.Run("Outage", func(t *testing.T) { Outage(t, s) })
	}
}

func testTransfer(t *testing.T, s Setup) {
	a, b := newEngine(t, s.Conn), newEngine(t, s.Conn)
	src := register(t, a, 1<<20, 1)
	dst := register(t, b, 1<<20, 9)
	st := openStore(t, s.Conn)
	d, err := storedDesc(st, b.Name())
	if err != nil {
		t.Fatalf("b's descriptor in the store: %v", err)
	}
	if len(d.Buffers) != 1 || d.Buffers[0].Addr != dst.addr || d.Instance != b.Instance() {
		t.Fatalf("stored descriptor %+v does not describe b", d)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	rpc, err := st.Get(ctx, meta.KeyRPC(b.Name()))
	if err != nil || !strings.Contains(string(rpc), `"rpc_port":`) {
		t.Fatalf("rpc_meta of b: %s %v", rpc, err)
	}
	seg, err := a.OpenSegment(b.Name())
	if err != nil {
		t.Fatal(err)
	}
	defer a.CloseSegment(seg)
	transfer(t, a, engine.Write, src, seg, dst)
	for i := range src.b {
		src.b[i] = 0
	}
	copy(dst.b, bytes.Repeat([]byte{0x5a}, len(dst.b)))
	transfer(t, a, engine.Read, src, seg, dst)

	// b re-registers: the open handle follows the new descriptor.
	if err := b.UnregisterMemory(dst.addr); err != nil {
		t.Fatal(err)
	}
	dst2 := register(t, b, 1<<20, 3)
	transferEventually(t, a, src, seg, dst2)
}

// transferEventually writes src to dst through seg, allowing the first tries
// to fail while the handle's descriptor catches up with the store.
func transferEventually(t *testing.T, a *engine.Engine, src buf, seg *engine.Segment, dst buf) {
	t.Helper()
	eventually(t, 5*time.Second, "transfer after a republication", func() error {
		bt, err := a.AllocateBatch(1)
		if err != nil {
			return err
		}
		defer bt.Free()
		if err := bt.Submit(engine.Request{Op: engine.Write, Local: src.addr, Segment: seg, Remote: dst.addr, Length: uint64(len(src.b))}); err != nil {
			return err
		}
		st, err := bt.Wait(5 * time.Second)
		if err != nil {
			return err
		}
		if st.State != engine.Completed {
			ts, _ := bt.TaskStatus(0)
			return ts.Err
		}
		if !bytes.Equal(src.b, dst.b) {
			t.Fatal("bytes differ after the transfer")
		}
		return nil
	})
}

func testClosed(t *testing.T, s Setup) {
	a, b := newEngine(t, s.Conn), newEngine(t, s.Conn)
	register(t, b, 4096, 0)
	st := openStore(t, s.Conn)
	if _, err := storedDesc(st, b.Name()); err != nil {
		t.Fatal(err)
	}
	b.Close()
	if _, err := storedDesc(st, b.Name()); errs.CodeOf(err) != errs.NotFound {
		t.Fatalf("a closed engine's descriptor: %v, want NotFound", err)
	}
	if _, err := a.OpenSegment(b.Name()); errs.CodeOf(err) != errs.SegmentNotFound {
		t.Fatalf("opening a closed engine's segment: %v, want SegmentNotFound", err)
	}
}

func testKilled(t *testing.T, s Setup) {
	a := newEngine(t, s.Conn)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envChild+"="+s.Conn)
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { in.Close(); cmd.Process.Kill(); cmd.Wait() }()
	line, err := bufio.NewReader(out).ReadString('\n')
	f := strings.Fields(line)
	if err != nil || len(f) != 3 || f[0] != "segment" {
		t.Fatalf("child engine: %q %v", line, err)
	}
	name := f[1]
	addr, _ := strconv.ParseUint(f[2], 10, 64)
	seg, err := a.OpenSegment(name)
	if err != nil {
		t.Fatal(err)
	}
	// Two processes found each other through the store: read the child's
	// buffer (over whichever transport reaches another process).
	dst := register(t, a, childLen, 0)
	bt, err := a.AllocateBatch(1)
	if err != nil {
		t.Fatal(err)
	}
	if err := bt.Submit(engine.Request{Op: engine.Read, Local: dst.addr, Segment: seg, Remote: addr, Length: childLen}); err != nil {
		t.Fatal(err)
	}
	if st, err := bt.Wait(5 * time.Second); err != nil || st.State != engine.Completed {
		ts, _ := bt.TaskStatus(0)
		t.Fatalf("read from the child engine: %v %v %+v", st, err, ts)
	}
	ts, _ := bt.TaskStatus(0)
	bt.Free()
	for i, c := range dst.b {
		if c != childByte(i) {
			t.Fatalf("byte %d read from the child is %d, want %d", i, c, childByte(i))
		}
	}
	t.Logf("read %d bytes from another process over %s", childLen, ts.Transport)
	st := openStore(t, s.Conn)
	if _, err := storedDesc(st, name); err != nil {
		t.Fatal(err)
	}

	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()
	if s.Expires == 0 {
		// No TTL in this store: the dead engine's keys stay (as with
		// Mooncake's servers) until something deletes them.
		Holds(t, time.Second, "a store without TTL keeps a killed engine's descriptor", func() error {
			_, err := storedDesc(st, name)
			return err
		})
		a.CloseSegment(seg)
		return
	}
	// Each key expires on its own (redis refreshes them one by one), so
	// each is waited for with the same deadline.
	gone := func(key string) func() error {
		return func() error {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			if _, err := st.Get(ctx, key); errs.CodeOf(err) != errs.NotFound {
				return errs.New(errs.Internal, "test", "%s still there (%v)", key, err)
			}
			return nil
		}
	}
	took := eventually(t, s.Expires+3*time.Second, "killed engine's segment leaves the store", gone(meta.KeyRAM(name)))
	t.Logf("killed engine's segment gone after %v (TTL %v)", took, s.Expires)
	eventually(t, s.Expires+3*time.Second, "killed engine's rpc_meta leaves the store", gone(meta.KeyRPC(name)))
	if s.Watch {
		// The watch marked the open handle stale: it fails at once, not
		// after a transfer to a dead peer timed out.
		eventually(t, 2*time.Second, "open handle sees the segment gone", func() error {
			if _, err := seg.Descriptor(); errs.CodeOf(err) != errs.SegmentNotFound {
				return errs.New(errs.Internal, "test", "descriptor still served (%v)", err)
			}
			return nil
		})
	}
	a.CloseSegment(seg)
	if _, err := a.OpenSegment(name); errs.CodeOf(err) != errs.SegmentNotFound {
		t.Fatalf("opening a killed engine's segment: %v, want SegmentNotFound", err)
	}
}

// Outage stops the store under three engines and starts it again: open
// segments keep working, new opens fail with a metadata error, and the
// engines' segments, including a registration made during the outage, are
// in the store again soon after it is back.
func Outage(t *testing.T, s Setup) {
	a, b, c := newEngine(t, s.Conn), newEngine(t, s.Conn), newEngine(t, s.Conn)
	src := register(t, a, 1<<16, 1)
	dst := register(t, b, 1<<16, 2)
	register(t, c, 4096, 3)
	seg, err := a.OpenSegment(b.Name())
	if err != nil {
		t.Fatal(err)
	}
	defer a.CloseSegment(seg)
	transfer(t, a, engine.Write, src, seg, dst)

	s.Down()
	// Open segments keep working: the data path needs no metadata.
	src.b[7]++
	transfer(t, a, engine.Write, src, seg, dst)
	// New opens fail with a metadata error, within the RPC timeout.
	t0 := time.Now()
	_, err = a.OpenSegment(c.Name())
	if errs.CodeOf(err) != errs.Metadata {
		t.Fatalf("open while the store is down: %v, want a metadata error", err)
	}
	if d := time.Since(t0); d > 10*time.Second { // bounded by the 1 s RPC timeout; generous for loaded machines
		t.Fatalf("open while the store is down took %v", d)
	}
	t.Logf("open while down: %v", err)
	// A registration while the store is down succeeds locally; the store
	// gets it when it is back.
	late := register(t, b, 1<<16, 4)

	s.Up()
	st := openStore(t, s.Conn)
	took := eventually(t, 15*time.Second, "segments published again", func() error {
		if _, err := storedDesc(st, c.Name()); err != nil {
			return err
		}
		d, err := storedDesc(st, b.Name())
		if err != nil {
			return err
		}
		if _, err := d.Find(late.addr, uint64(len(late.b))); err != nil {
			return err
		}
		return nil
	})
	t.Logf("store back: republished within %v", took)
	// a's own connection comes back on its client's reconnection schedule,
	// which may lag the others'.
	took = eventually(t, 15*time.Second, "open after the store is back", func() error {
		segC, err := a.OpenSegment(c.Name())
		if err == nil {
			a.CloseSegment(segC)
		}
		return err
	})
	t.Logf("open after the store is back: within %v", took)
	src.b[9]++
	transfer(t, a, engine.Write, src, seg, dst)
	transferEventually(t, a, src, seg, late)
	// And a new engine joins.
	d := newEngine(t, s.Conn)
	segD, err := a.OpenSegment(d.Name())
	if err != nil {
		t.Fatal(err)
	}
	a.CloseSegment(segD)
}
