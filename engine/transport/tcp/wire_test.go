package tcp_test

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/tecache/te/engine"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/peerauth"
	"github.com/tecache/te/internal/sys/mem"
	"github.com/tecache/te/internal/wire"
)

// target is an engine with one registered remote-accessible buffer and one
// registered local-only buffer.
type target struct {
	e        *engine.Engine
	buf      []byte // remote-accessible
	private  []byte // registered, not remote-accessible
	endpoint string
	key      uint64
}

func newEngine(t *testing.T, listen string, params map[string]string) *engine.Engine {
	t.Helper()
	if listen == "" {
		listen = "127.0.0.1:0"
	}
	e, err := engine.New(engine.Config{
		ListenAddr: listen, Hostname: "127.0.0.1", Transports: []string{"tcp"}, ForceTransport: "tcp",
		Params: params, TransferTimeout: 10 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

func alloc(t *testing.T, n int) []byte {
	t.Helper()
	b, err := mem.Alloc(n)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mem.Free(b) })
	return b
}

func newTarget(t *testing.T) *target {
	t.Helper()
	// Memory first: cleanups run last-in first-out, so the engine (and its
	// in-flight accesses) is gone before the memory is unmapped.
	buf, private := alloc(t, 1<<20), alloc(t, 4096)
	e := newEngine(t, "", nil)
	tg := &target{e: e, buf: buf, private: private}
	if err := e.RegisterMemory(mem.Addr(tg.buf), uint64(len(tg.buf)), "cpu:0", true); err != nil {
		t.Fatal(err)
	}
	if err := e.RegisterMemory(mem.Addr(tg.private), 4096, "cpu:0", false); err != nil {
		t.Fatal(err)
	}
	d := e.Descriptor()
	tg.endpoint = d.Endpoints["tcp"]
	if tg.endpoint == "" || d.TCPDataPort == 0 {
		t.Fatalf("descriptor publishes no tcp endpoint: %+v", d)
	}
	tg.key = d.Buffers[0].Key
	return tg
}

// raw is a hand-driven data connection.
type raw struct {
	t  *testing.T
	nc net.Conn
	br *bufio.Reader
}

func dialRaw(t *testing.T, endpoint string, preface bool) *raw {
	t.Helper()
	nc, err := net.Dial("tcp", endpoint)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	nc.SetDeadline(time.Now().Add(10 * time.Second))
	r := &raw{t: t, nc: nc, br: bufio.NewReader(nc)}
	if preface {
		r.write([]byte(wire.DataPreface))
		// No secret on either side: the exchange is HELLO and "no
		// authentication here".
		if _, err := peerauth.Client(peerauth.WithReader(nc, r.br), nil, "raw-initiator", time.Now().Add(10*time.Second)); err != nil {
			t.Fatal(err)
		}
		nc.SetDeadline(time.Now().Add(10 * time.Second))
	}
	return r
}

func (r *raw) write(b []byte) {
	r.t.Helper()
	if _, err := r.nc.Write(b); err != nil {
		r.t.Fatal(err)
	}
}

func (r *raw) send(kind uint8, id, addr, n, key uint64, payload []byte) {
	r.t.Helper()
	r.write(append(wire.AppendDataRequest(nil, wire.DataRequest{Kind: kind, ID: id, Addr: addr, Length: n, Key: key}), payload...))
}

func (r *raw) recv() (wire.Completion, []byte) {
	r.t.Helper()
	var h [wire.CompHeaderSize]byte
	if _, err := io.ReadFull(r.br, h[:]); err != nil {
		r.t.Fatalf("reading completion: %v", err)
	}
	c, err := wire.DecodeCompletion(h[:])
	if err != nil {
		r.t.Fatal(err)
	}
	p := make([]byte, c.Length)
	if _, err := io.ReadFull(r.br, p); err != nil {
		r.t.Fatalf("reading payload: %v", err)
	}
	return c, p
}

// expectClosed checks the target closed the connection (EOF or reset, not a
// timeout).
func (r *raw) expectClosed() {
	r.t.Helper()
	_, err := r.br.ReadByte()
	var ne net.Error
	if err == nil || (errors.As(err, &ne) && ne.Timeout()) {
		r.t.Fatalf("connection still open: %v", err)
	}
}

// TestOwnerValidates drives the target with hand-made frames: every refused
// request gets its status, a refused WRITE's payload is drained and never
// written, and the connection stays usable after each refusal.
func TestOwnerValidates(t *testing.T) {
	tg := newTarget(t)
	base := mem.Addr(tg.buf)
	for i := range tg.buf[:8192] {
		tg.buf[i] = 0xAA
	}
	r := dialRaw(t, tg.endpoint, true)
	junk := bytes.Repeat([]byte{0x55}, 4096)
	cases := []struct {
		name      string
		kind      uint8
		addr, n   uint64
		key       uint64
		want      errs.Code
		withBytes bool
	}{
		{"wrong key write", wire.DataWrite, base, 4096, tg.key ^ 1, errs.StaleDescriptor, true},
		{"wrong key read", wire.DataRead, base, 4096, tg.key ^ 1, errs.StaleDescriptor, false},
		{"no key", wire.DataWrite, base, 4096, 0, errs.AccessDenied, true},
		{"out of range", wire.DataWrite, base + uint64(len(tg.buf)) - 100, 4096, tg.key, errs.AddressNotRegistered, true},
		{"overflowing range", wire.DataRead, ^uint64(0) - 10, 4096, tg.key, errs.InvalidArgument, false},
		{"unregistered", wire.DataWrite, 4096, 4096, tg.key, errs.AddressNotRegistered, true},
		{"private buffer", wire.DataWrite, mem.Addr(tg.private), 4096, tg.key, errs.AccessDenied, true},
		{"zero length write", wire.DataWrite, base, 0, tg.key, errs.InvalidArgument, false},
		{"zero length read", wire.DataRead, base, 0, tg.key, errs.InvalidArgument, false},
	}
	for i, c := range cases {
		var p []byte
		if c.withBytes {
			p = junk[:c.n]
		}
		r.send(c.kind, uint64(100+i), c.addr, c.n, c.key, p)
		comp, _ := r.recv()
		if comp.ID != uint64(100+i) || comp.Status != c.want || comp.Length != 0 {
			t.Errorf("%s: completion %+v, want status %v", c.name, comp, c.want)
		}
	}
	if !bytes.Equal(tg.buf[:8192], bytes.Repeat([]byte{0xAA}, 8192)) {
		t.Fatal("a refused WRITE changed the target's memory")
	}
	for i := range tg.private[:16] {
		if tg.private[i] != 0 {
			t.Fatal("a refused WRITE changed a private buffer")
		}
	}
	// The same connection still works: a valid WRITE, then a READ of it.
	data := bytes.Repeat([]byte{0x11, 0x22, 0x33}, 1000)
	r.send(wire.DataWrite, 1, base+5, uint64(len(data)), tg.key, data)
	if comp, _ := r.recv(); comp.Status != errs.OK || comp.ID != 1 {
		t.Fatalf("valid write: %+v", comp)
	}
	if !bytes.Equal(tg.buf[5:5+len(data)], data) {
		t.Fatal("valid write did not land")
	}
	r.send(wire.DataRead, 2, base+5, uint64(len(data)), tg.key, nil)
	if comp, p := r.recv(); comp.Status != errs.OK || !bytes.Equal(p, data) {
		t.Fatalf("valid read: %+v", comp)
	}
}

// TestOversizeHeader: a length beyond the limit is answered TooLarge and the
// connection closed, before the target reads or allocates anything for it.
func TestOversizeHeader(t *testing.T) {
	tg := newTarget(t)
	for _, n := range []uint64{wire.MaxDataLength + 1, ^uint64(0)} {
		r := dialRaw(t, tg.endpoint, true)
		r.send(wire.DataWrite, 7, mem.Addr(tg.buf), n, tg.key, nil)
		comp, _ := r.recv()
		if comp.Status != errs.TooLarge || comp.ID != 7 {
			t.Fatalf("length %d: %+v", n, comp)
		}
		r.expectClosed()
	}
}

// TestBadFrames: a wrong preface, an unknown kind and non-zero reserved
// bytes close the connection without an answer.
func TestBadFrames(t *testing.T) {
	tg := newTarget(t)
	r := dialRaw(t, tg.endpoint, false)
	r.write([]byte("GET / HTTP/1.1\r\n\r\n"))
	r.expectClosed()

	r = dialRaw(t, tg.endpoint, true)
	h := wire.AppendDataRequest(nil, wire.DataRequest{Kind: wire.DataRead, ID: 1, Addr: mem.Addr(tg.buf), Length: 1, Key: tg.key})
	h[wire.OffReqKind] = 9
	r.write(h)
	r.expectClosed()

	r = dialRaw(t, tg.endpoint, true)
	h[wire.OffReqKind] = wire.DataRead
	h[wire.OffReqReserved] = 1
	r.write(h)
	r.expectClosed()
}

// TestTruncatedFrames: connections that end inside a header or inside a
// WRITE's payload leave nothing held: the buffer unregisters at once (no
// access left in flight) and the target keeps serving.
func TestTruncatedFrames(t *testing.T) {
	tg := newTarget(t)
	base := mem.Addr(tg.buf)
	// Inside the preface.
	r := dialRaw(t, tg.endpoint, false)
	r.write([]byte(wire.DataPreface[:3]))
	r.nc.Close()
	// Inside a header.
	r = dialRaw(t, tg.endpoint, true)
	h := wire.AppendDataRequest(nil, wire.DataRequest{Kind: wire.DataWrite, ID: 1, Addr: base, Length: 4096, Key: tg.key})
	r.write(h[:wire.ReqHeaderSize/2])
	r.nc.Close()
	// Inside a WRITE's payload: the region is acquired while it arrives.
	r = dialRaw(t, tg.endpoint, true)
	r.write(append(h, make([]byte, 100)...))
	time.Sleep(50 * time.Millisecond)
	r.nc.Close()
	// Inside a refused WRITE's payload (being drained).
	r = dialRaw(t, tg.endpoint, true)
	h2 := wire.AppendDataRequest(nil, wire.DataRequest{Kind: wire.DataWrite, ID: 1, Addr: base, Length: 1 << 20, Key: tg.key + 1})
	r.write(append(h2, make([]byte, 1000)...))
	r.nc.Close()

	// Still serving.
	r = dialRaw(t, tg.endpoint, true)
	r.send(wire.DataRead, 5, base, 16, tg.key, nil)
	if comp, _ := r.recv(); comp.Status != errs.OK {
		t.Fatalf("after truncated frames: %+v", comp)
	}
	r.nc.Close()
	// Nothing left in flight: unregistering does not wait out a timeout.
	t0 := time.Now()
	done := make(chan error, 1)
	go func() { done <- tg.e.UnregisterMemory(base) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("unregister still waits for an access from a dead connection")
	}
	t.Logf("unregister took %v", time.Since(t0))
}

// TestIdleConnectionDropped: a connection that never sends its preface is
// closed by the target (it does not hold a goroutine forever).
func TestIdleConnectionDropped(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for the preface timeout")
	}
	tg := newTarget(t)
	r := dialRaw(t, tg.endpoint, false)
	r.nc.SetDeadline(time.Now().Add(20 * time.Second))
	r.expectClosed()
}

// TestPrivateFileRefusedOverTCP: a peer that knows the address and key of
// a file registered without Remote (private: in no descriptor a peer
// reads) is refused READ and WRITE with AccessDenied, and the file keeps
// its bytes; a published file on the same connection is served.
func TestPrivateFileRefusedOverTCP(t *testing.T) {
	e, err := engine.New(engine.Config{
		ListenAddr: "127.0.0.1:0", Hostname: "127.0.0.1", Transports: []string{"tcp", "file"}, TransferTimeout: 10 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	dir := t.TempDir()
	content := bytes.Repeat([]byte{0xC3, 0x5A}, 4096)
	paths := [2]string{filepath.Join(dir, "private"), filepath.Join(dir, "published")}
	var addrs [2]uint64
	for i, p := range paths {
		if err := os.WriteFile(p, content, 0o600); err != nil {
			t.Fatal(err)
		}
		if addrs[i], err = e.RegisterFile(p, 0, uint64(len(content)), engine.FileOptions{Remote: i == 1}); err != nil {
			t.Fatalf("%s: %v", p, err)
		}
	}
	d := e.Descriptor()
	for _, b := range d.Buffers {
		if b.Addr == addrs[0] {
			t.Fatalf("private file published: %+v", b)
		}
	}
	// The keys as the owner's own segment holds them.
	own, err := e.OpenSegment(e.Name())
	if err != nil {
		t.Fatal(err)
	}
	defer e.CloseSegment(own)
	od, err := own.Descriptor()
	if err != nil {
		t.Fatal(err)
	}
	var keys [2]uint64
	for _, b := range od.Buffers {
		for i, a := range addrs {
			if b.Addr == a {
				keys[i] = b.Key
			}
		}
	}
	if keys[0] == 0 || keys[1] == 0 {
		t.Fatalf("keys %v: the owner's own segment lacks a file", keys)
	}
	r := dialRaw(t, d.Endpoints["tcp"], true)
	r.send(wire.DataRead, 1, addrs[0], 4096, keys[0], nil)
	if comp, p := r.recv(); comp.Status != errs.AccessDenied || len(p) != 0 {
		t.Fatalf("READ of the private file: %+v, %d bytes", comp, len(p))
	}
	r.send(wire.DataWrite, 2, addrs[0]+4096, 4096, keys[0], bytes.Repeat([]byte{0xEE}, 4096))
	if comp, _ := r.recv(); comp.Status != errs.AccessDenied {
		t.Fatalf("WRITE of the private file: %+v", comp)
	}
	r.send(wire.DataRead, 3, addrs[1]+4096, 4096, keys[1], nil)
	if comp, p := r.recv(); comp.Status != errs.OK || !bytes.Equal(p, content[4096:]) {
		t.Fatalf("READ of the published file: %+v", comp)
	}
	if disk, _ := os.ReadFile(paths[0]); !bytes.Equal(disk, content) {
		t.Fatal("a refused WRITE changed the private file")
	}
}
