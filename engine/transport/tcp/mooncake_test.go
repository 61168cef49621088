package tcp_test

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"io"
	"net"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tecache/te/engine"
	"github.com/tecache/te/engine/segment"
	"github.com/tecache/te/engine/transport"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/sys/mem"
	"github.com/tecache/te/internal/wire"
)

// mcTarget is an engine (tcp only) with a 1 MiB remote-accessible buffer and
// a 4 KiB private one; accept turns on AcceptMooncakePeers.
type mcTarget struct {
	e       *engine.Engine
	buf     []byte
	private []byte
	data    string // the data listener, host:tcp_data_port
}

func newMcTarget(t *testing.T, accept bool, adjust func(*engine.Config)) *mcTarget {
	t.Helper()
	buf, private := alloc(t, 1<<20), alloc(t, 4096)
	cfg := engine.Config{ListenAddr: "127.0.0.1:0", Hostname: "127.0.0.1", Transports: []string{"tcp"},
		AcceptMooncakePeers: accept, TransferTimeout: 10 * time.Second}
	if adjust != nil {
		adjust(&cfg)
	}
	e, err := engine.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	if err := e.RegisterMemory(mem.Addr(buf), 1<<20, "cpu", true); err != nil {
		t.Fatal(err)
	}
	if err := e.RegisterMemory(mem.Addr(private), 4096, "cpu", false); err != nil {
		t.Fatal(err)
	}
	d := e.Descriptor()
	if d.TCPProtoVersion != 2 {
		t.Fatalf("descriptor publishes tcp_proto_version %d, want 2", d.TCPProtoVersion)
	}
	return &mcTarget{e: e, buf: buf, private: private, data: net.JoinHostPort("127.0.0.1", strconv.Itoa(d.TCPDataPort))}
}

// mooncakeView is the descriptor a Mooncake engine would publish for tg: no
// te fields, so a te initiator speaks Mooncake's framing to it.
func (tg *mcTarget) mooncakeView() *segment.Desc {
	d := tg.e.Descriptor()
	v := &segment.Desc{Name: d.Name, Protocol: "tcp", TCPDataPort: d.TCPDataPort, TCPProtoVersion: 2, RPC: d.RPC}
	for _, b := range d.Buffers {
		v.Buffers = append(v.Buffers, segment.BufferDesc{Name: b.Name, Addr: b.Addr, Length: b.Length})
	}
	return v
}

// mcConn is a hand-driven Mooncake initiator connection.
type mcRaw struct {
	t  *testing.T
	nc net.Conn
	br *bufio.Reader
}

func dialMc(t *testing.T, ep string) *mcRaw {
	t.Helper()
	nc, err := net.Dial("tcp", ep)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	nc.SetDeadline(time.Now().Add(10 * time.Second))
	return &mcRaw{t: t, nc: nc, br: bufio.NewReader(nc)}
}

func (r *mcRaw) send(op uint8, v2 bool, addr, n uint64, payload []byte) {
	r.t.Helper()
	var h [wire.MooncakeHeaderSize]byte
	wire.PutMooncakeRequest(h[:], wire.MooncakeRequest{Size: n, Addr: addr, Op: op, V2: v2})
	// What follows a refused header may not be read: a reset is fine.
	r.nc.Write(append(h[:], payload...))
}

// status reads a status frame; ok false if the connection ended first.
func (r *mcRaw) status() (uint32, bool) {
	r.t.Helper()
	var b [8]byte
	if _, err := io.ReadFull(r.br, b[:]); err != nil {
		return 0, false
	}
	c, err := wire.DecodeMooncakeStatus(b[:])
	if err != nil {
		r.t.Fatal(err)
	}
	return c, true
}

func (r *mcRaw) expectStatus(want uint32) {
	r.t.Helper()
	if c, ok := r.status(); !ok || c != want {
		r.t.Fatalf("status %d (frame read: %v), want %d", c, ok, want)
	}
}

func (r *mcRaw) expectClosed() {
	r.t.Helper()
	if _, err := r.br.ReadByte(); err == nil {
		r.t.Fatal("connection still open")
	} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
		r.t.Fatal("connection still open (timed out)")
	}
}

func mcPattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed ^ byte((uint32(i)*2654435761)>>24)
	}
	return b
}

// TestMooncakeTargetServes: version 2 WRITE and READ from a Mooncake
// initiator, both with a new connection per request (Mooncake's default) and
// several requests on one connection; te's own peers still work beside them.
func TestMooncakeTargetServes(t *testing.T) {
	tg := newMcTarget(t, true, nil)
	base := mem.Addr(tg.buf)
	data := mcPattern(64<<10, 0xCD)
	for i := 0; i < 4; i++ { // one connection each
		r := dialMc(t, tg.data)
		r.send(wire.MooncakeWrite, true, base+uint64(i)*(64<<10), 64<<10, data)
		r.expectStatus(wire.MooncakeOK)
		r.nc.Close()
	}
	for i := 0; i < 4; i++ {
		if !bytes.Equal(tg.buf[i*(64<<10):(i+1)*(64<<10)], data) {
			t.Fatalf("write %d did not land", i)
		}
	}
	r := dialMc(t, tg.data) // one persistent connection
	r.send(wire.MooncakeWrite, true, base+7, 3, []byte{1, 2, 3})
	r.expectStatus(wire.MooncakeOK)
	r.send(wire.MooncakeRead, true, base, 64<<10, nil)
	r.expectStatus(wire.MooncakeOK)
	got := make([]byte, 64<<10)
	if _, err := io.ReadFull(r.br, got); err != nil {
		t.Fatal(err)
	}
	want := append(append(append([]byte{}, data[:7]...), 1, 2, 3), data[10:]...)
	if !bytes.Equal(got, want) {
		t.Fatal("read returned other bytes")
	}
	r.send(wire.MooncakeRead, true, base+(1<<20)-1, 1, nil) // the last byte
	r.expectStatus(wire.MooncakeOK)
	if b, err := r.br.ReadByte(); err != nil || b != tg.buf[len(tg.buf)-1] {
		t.Fatal(b, err)
	}
	// te's own protocol on the same listener.
	te := dialRaw(t, tg.data, true)
	te.send(wire.DataRead, 9, base, 16, tg.e.Descriptor().Buffers[0].Key, nil)
	if c, p := te.recv(); c.Status != errs.OK || !bytes.Equal(p, want[:16]) {
		t.Fatalf("te request beside Mooncake ones: %+v", c)
	}
}

// TestMooncakeTargetRefuses: every request te does not serve gets a refusal
// status (version 2) and the connection closes, as Mooncake's own target
// does; version 1 requests, which cannot be refused, are closed at once; no
// refused WRITE changes memory.
func TestMooncakeTargetRefuses(t *testing.T) {
	on := newMcTarget(t, true, nil)
	off := newMcTarget(t, false, nil)
	for _, tg := range []*mcTarget{on, off} {
		fill(tg.buf, 0xAA)
	}
	junk := bytes.Repeat([]byte{0x55}, 64<<10)
	cases := []struct {
		name    string
		tg      *mcTarget
		op      uint8
		v2      bool
		addr    uint64
		n       uint64
		payload []byte
		want    uint32 // status; 0xffffffff: closed with no status
	}{
		{"not accepted write", off, wire.MooncakeWrite, true, mem.Addr(off.buf), 4096, junk[:4096], wire.MooncakeRefused},
		{"not accepted read", off, wire.MooncakeRead, true, mem.Addr(off.buf), 4096, nil, wire.MooncakeRefused},
		{"out of range write", on, wire.MooncakeWrite, true, mem.Addr(on.buf) + (1 << 20) - 4096, 64 << 10, junk, wire.MooncakeAddrRejected},
		{"out of range read", on, wire.MooncakeRead, true, mem.Addr(on.buf) - 1, 16, nil, wire.MooncakeAddrRejected},
		{"private buffer", on, wire.MooncakeWrite, true, mem.Addr(on.private), 4096, junk[:4096], wire.MooncakeAddrRejected},
		{"unregistered", on, wire.MooncakeRead, true, 4096, 4096, nil, wire.MooncakeAddrRejected},
		{"zero length", on, wire.MooncakeRead, true, mem.Addr(on.buf), 0, nil, wire.MooncakeAddrRejected},
		{"overflow", on, wire.MooncakeRead, true, ^uint64(0) - 10, 4096, nil, wire.MooncakeAddrRejected},
		{"version 1 write", on, wire.MooncakeWrite, false, mem.Addr(on.buf), 4096, junk[:4096], 0xffffffff},
		{"version 1 read", on, wire.MooncakeRead, false, mem.Addr(on.buf), 4096, nil, 0xffffffff},
	}
	for _, c := range cases {
		r := dialMc(t, c.tg.data)
		r.send(c.op, c.v2, c.addr, c.n, c.payload)
		if c.want == 0xffffffff {
			r.expectClosed()
		} else {
			r.expectStatus(c.want)
			r.expectClosed()
		}
	}
	// An opcode that is neither READ nor WRITE: closed, no answer.
	r := dialMc(t, on.data)
	var h [wire.MooncakeHeaderSize]byte
	binary.LittleEndian.PutUint64(h[:], 16)
	binary.LittleEndian.PutUint64(h[8:], mem.Addr(on.buf))
	h[wire.OffMcOpcode] = 0x85
	r.nc.Write(h[:])
	r.expectClosed()
	for _, tg := range []*mcTarget{on, off} {
		if !bytes.Equal(tg.buf, bytes.Repeat([]byte{0xAA}, len(tg.buf))) {
			t.Fatal("a refused WRITE changed the target's memory")
		}
	}
	if !bytes.Equal(on.private, make([]byte, 4096)) {
		t.Fatal("a refused WRITE changed a private buffer")
	}
}

// TestMooncakeUnregisterCutsStalledWrite: the unregister fence covers Mooncake
// peers' accesses too: a Mooncake WRITE stalled halfway holds the buffer,
// UnregisterMemory cuts that connection after its grace and returns, and the
// rest of the payload never lands.
func TestMooncakeUnregisterCutsStalledWrite(t *testing.T) {
	const grace = 300 * time.Millisecond
	buf := alloc(t, 1<<20)
	e, err := engine.New(engine.Config{ListenAddr: "127.0.0.1:0", Hostname: "127.0.0.1", Transports: []string{"tcp"},
		AcceptMooncakePeers: true, UnregisterGrace: grace})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if err := e.RegisterMemory(mem.Addr(buf), 1<<20, "cpu", true); err != nil {
		t.Fatal(err)
	}
	fill(buf, 0)
	r := dialMc(t, net.JoinHostPort("127.0.0.1", strconv.Itoa(e.Descriptor().TCPDataPort)))
	half := bytes.Repeat([]byte{0xAB}, 512<<10)
	r.send(wire.MooncakeWrite, true, mem.Addr(buf), 1<<20, half)
	waitFor(t, 10*time.Second, "first half of the payload in the target", func() bool { return buf[len(half)-1] == 0xAB })
	t0 := time.Now()
	if err := e.UnregisterMemory(mem.Addr(buf)); err != nil {
		t.Fatalf("unregister with a stalled Mooncake writer: %v", err)
	}
	if took := time.Since(t0); took > grace+2*time.Second {
		t.Errorf("unregister took %v (grace %v)", took, grace)
	}
	fill(buf, 0xC3)
	r.nc.Write(half)
	r.expectClosed()
	time.Sleep(50 * time.Millisecond)
	for i, c := range buf {
		if c != 0xC3 {
			t.Fatalf("a byte landed at %d after UnregisterMemory returned: %#x", i, c)
		}
	}
}

// TestAcceptMooncakeRules: a cluster secret shuts Mooncake peers out unless
// explicitly allowed; TE_ACCEPT_MOONCAKE_PEERS=1 accepts them like the field;
// a user's Params cannot turn acceptance on behind the engine's back.
func TestAcceptMooncakeRules(t *testing.T) {
	_, err := engine.New(engine.Config{ListenAddr: "127.0.0.1:0", Transports: []string{"tcp"}, AcceptMooncakePeers: true, AuthSecret: "s3cret-cluster-secret-0123"})
	if errs.CodeOf(err) != errs.InvalidArgument {
		t.Fatalf("accepting Mooncake peers with a secret and no allowance: %v", err)
	}
	allowed := newMcTarget(t, true, func(c *engine.Config) { c.AuthSecret, c.AllowMooncakeWithSecret = "s3cret-cluster-secret-0123", true })
	r := dialMc(t, allowed.data)
	r.send(wire.MooncakeWrite, true, mem.Addr(allowed.buf), 4, []byte{1, 2, 3, 4})
	r.expectStatus(wire.MooncakeOK)

	sneaky := newMcTarget(t, false, func(c *engine.Config) { c.Params = map[string]string{"mooncake.accept": "1"} })
	r = dialMc(t, sneaky.data)
	r.send(wire.MooncakeWrite, true, mem.Addr(sneaky.buf), 4, []byte{1, 2, 3, 4})
	r.expectStatus(wire.MooncakeRefused)

	t.Setenv("TE_ACCEPT_MOONCAKE_PEERS", "1")
	env := newMcTarget(t, false, nil)
	r = dialMc(t, env.data)
	r.send(wire.MooncakeWrite, true, mem.Addr(env.buf), 4, []byte{1, 2, 3, 4})
	r.expectStatus(wire.MooncakeOK)
	if !bytes.Equal(env.buf[:4], []byte{1, 2, 3, 4}) {
		t.Fatal("write did not land")
	}
}

func mcReqs(d *segment.Desc, op transport.Opcode, local []byte, remote uint64, slice int, r *result) []transport.Request {
	var out []transport.Request
	for off := 0; off < len(local); off += slice {
		n := min(slice, len(local)-off)
		out = append(out, transport.Request{Op: op, Local: mem.Addr(local) + uint64(off), Remote: remote + uint64(off), Length: uint64(n),
			Peer: d, Buffer: &d.Buffers[0], Owner: transport.DoneFunc(r.done)})
	}
	return out
}

// TestMooncakeInitiator drives te's Mooncake initiator against te's Mooncake
// target: requests larger than a slice, pipelined on persistent connections,
// WRITE then READ back.
func TestMooncakeInitiator(t *testing.T) {
	tg := newMcTarget(t, true, nil)
	d := tg.mooncakeView()
	tr := startFake(t, map[string]string{"tcp.conns": "2", "tcp.slice": "64KiB"})
	if err := tr.Reachable(d); err != nil {
		t.Fatal(err)
	}
	src := mcPattern(1<<20, 0x5A)
	res := newResult(16)
	tr.Submit(mcReqs(d, transport.Write, src, d.Buffers[0].Addr, 64<<10, res))
	for _, err := range res.wait(t, 10*time.Second) {
		if err != nil {
			t.Fatal(err)
		}
	}
	if !bytes.Equal(tg.buf, src) {
		t.Fatal("writes did not land")
	}
	dst := alloc(t, 1<<20)
	res = newResult(4)
	tr.Submit(mcReqs(d, transport.Read, dst, d.Buffers[0].Addr, 256<<10, res))
	for _, err := range res.wait(t, 10*time.Second) {
		if err != nil {
			t.Fatal(err)
		}
	}
	if !bytes.Equal(dst, src) {
		t.Fatal("reads returned other bytes")
	}
}

// TestMooncakeInitiatorAfterRefusal: a target refuses one request among
// pipelined ones and closes; that request fails with the refusal, the ones
// after it are sent again on a new connection and succeed.
func TestMooncakeInitiatorAfterRefusal(t *testing.T) {
	tg := newMcTarget(t, true, nil)
	d := tg.mooncakeView()
	d.Buffers[0].Length += 1 << 20 // the initiator believes in more than the target has
	tr := startFake(t, map[string]string{"tcp.conns": "2", "tcp.slice": "1MiB"})
	src := alloc(t, 5*(64<<10))
	copy(src, mcPattern(len(src), 0x33))
	base := d.Buffers[0].Addr
	var errsByIdx [5]atomic.Value
	done := make(chan struct{}, 5)
	var reqs []transport.Request
	for i := 0; i < 5; i++ {
		remote := base + uint64(i)*(64<<10)
		if i == 2 {
			remote = base + (1 << 20) // past the target's buffer
		}
		reqs = append(reqs, transport.Request{Op: transport.Write, Local: mem.Addr(src) + uint64(i)*(64<<10), Remote: remote, Length: 64 << 10,
			Peer: d, Buffer: &d.Buffers[0], Index: i, Owner: transport.CompleteFunc(func(i int, err error) {
				errsByIdx[i].Store([]error{err})
				done <- struct{}{}
			})})
	}
	// Striped over the two connections: the refused request shares its
	// connection with others before and after it.
	tr.Submit(reqs)
	for range 5 {
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("requests did not finish")
		}
	}
	for i := range 5 {
		err := errsByIdx[i].Load().([]error)[0]
		if i == 2 {
			if errs.CodeOf(err) != errs.AddressNotRegistered {
				t.Fatalf("refused request: %v", err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("request %d after a refusal on its connection: %v", i, err)
		}
		if !bytes.Equal(tg.buf[i*(64<<10):(i+1)*(64<<10)], src[i*(64<<10):(i+1)*(64<<10)]) {
			t.Fatalf("request %d did not land", i)
		}
	}
}

// TestMooncakeInitiatorCancel: a request sent to a target that never answers
// is canceled: its connection is closed and it completes Canceled once the
// connection's goroutines stopped; nothing is left running (goleak).
func TestMooncakeInitiatorCancel(t *testing.T) {
	got := make(chan []byte, 4)
	ep := fakeServer(t, func(nc net.Conn) {
		var h [wire.MooncakeHeaderSize]byte
		if _, err := io.ReadFull(nc, h[:]); err == nil {
			got <- h[:]
		}
		io.Copy(io.Discard, nc) // never answers
	})
	host, port, _ := net.SplitHostPort(ep)
	p, _ := strconv.Atoi(port)
	d := &segment.Desc{Name: "mc", Protocol: "tcp", TCPDataPort: p, TCPProtoVersion: 2, RPC: net.JoinHostPort(host, "1"),
		Buffers: []segment.BufferDesc{{Name: "mc", Addr: 1 << 40, Length: 1 << 30}}}
	tr := startFake(t, nil)
	local := alloc(t, 4096)
	res := newResult(1)
	reqs := mcReqs(d, transport.Read, local, 1<<40, 4096, res)
	tr.Submit(reqs)
	select {
	case h := <-got:
		r, err := wire.DecodeMooncakeRequest(h)
		if err != nil || !r.V2 || r.Op != wire.MooncakeRead || r.Size != 4096 || r.Addr != 1<<40 {
			t.Fatalf("header %+v %v", r, err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("request not sent")
	}
	tr.Cancel([]*transport.Request{&reqs[0]})
	if e := res.wait(t, 5*time.Second)[0]; errs.CodeOf(e) != errs.Canceled {
		t.Fatalf("canceled request ended %v", e)
	}
}

// TestMooncakeCancelResendsOthers: cancelling a request already sent closes
// its connection; another request that connection carried behind it is sent
// again on a new connection and succeeds, and one on another connection is
// not disturbed.
func TestMooncakeCancelResendsOthers(t *testing.T) {
	const stuck = 1 << 40 // the fake target never answers a READ of this address
	ep := fakeServer(t, func(nc net.Conn) {
		var h [wire.MooncakeHeaderSize]byte
		for {
			if _, err := io.ReadFull(nc, h[:]); err != nil {
				return
			}
			r, err := wire.DecodeMooncakeRequest(h[:])
			if err != nil {
				return
			}
			if r.Addr == stuck {
				io.Copy(io.Discard, nc)
				return
			}
			var st [8]byte
			wire.PutMooncakeStatus(st[:], wire.MooncakeOK)
			nc.Write(append(st[:], bytes.Repeat([]byte{byte(r.Addr >> 12)}, int(r.Size))...))
		}
	})
	host, port, _ := net.SplitHostPort(ep)
	p, _ := strconv.Atoi(port)
	d := &segment.Desc{Name: "mc", Protocol: "tcp", TCPDataPort: p, TCPProtoVersion: 2, RPC: net.JoinHostPort(host, "1"),
		Buffers: []segment.BufferDesc{{Name: "mc", Addr: 1 << 40, Length: 1 << 30}}}
	tr := startFake(t, map[string]string{"tcp.conns": "2"})
	local := alloc(t, 3*4096)
	got := make(chan [2]any, 3)
	var reqs []transport.Request
	// With two connections, requests 0 and 2 share one, 1 has the other.
	for i, remote := range []uint64{stuck, stuck + 4096, stuck + 8192} {
		reqs = append(reqs, transport.Request{Op: transport.Read, Local: mem.Addr(local) + uint64(i)*4096, Remote: remote, Length: 4096,
			Peer: d, Buffer: &d.Buffers[0], Index: i, Owner: transport.CompleteFunc(func(i int, err error) { got <- [2]any{i, err} })})
	}
	tr.Submit(reqs)
	select {
	case x := <-got: // request 1, on its own connection
		if x[0].(int) != 1 || x[1] != nil {
			t.Fatalf("request %v ended %v", x[0], x[1])
		}
	case <-time.After(10 * time.Second):
		t.Fatal("request 1 not served")
	}
	tr.Cancel([]*transport.Request{&reqs[0]})
	for range 2 {
		select {
		case x := <-got:
			i, err := x[0].(int), x[1]
			if i == 0 {
				if e, _ := err.(error); errs.CodeOf(e) != errs.Canceled {
					t.Fatalf("canceled request ended %v", err)
				}
			} else if i != 2 || err != nil {
				t.Fatalf("request %d ended %v", i, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("requests not finished")
		}
	}
	if local[2*4096] != byte((stuck+8192)>>12&0xff) || local[4096] != byte((stuck+4096)>>12&0xff) {
		t.Fatal("reads returned other bytes")
	}
}

// TestMooncakeReachable: a Mooncake descriptor is reachable over tcp only
// with a data port, the acknowledged framing and a known RPC host.
func TestMooncakeReachable(t *testing.T) {
	tr := startFake(t, nil)
	good := &segment.Desc{Name: "mc", Protocol: "tcp", TCPDataPort: 15000, TCPProtoVersion: 2, RPC: "10.0.0.1:16000"}
	if !good.IsMooncake() || !good.HasTransport("tcp") || good.HasTransport("shm") {
		t.Fatal("not taken for a Mooncake tcp peer")
	}
	if err := tr.Reachable(good); err != nil {
		t.Fatal(err)
	}
	for _, d := range []*segment.Desc{
		{Name: "v1", TCPDataPort: 15000, RPC: "10.0.0.1:16000"},
		{Name: "noport", TCPProtoVersion: 2, RPC: "10.0.0.1:16000"},
		{Name: "nohost", TCPDataPort: 15000, TCPProtoVersion: 2},
	} {
		if err := tr.Reachable(d); errs.CodeOf(err) != errs.TransportUnavailable {
			t.Errorf("%s: %v", d.Name, err)
		}
	}
}
