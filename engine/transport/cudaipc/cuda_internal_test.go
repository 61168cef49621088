package cudaipc

import (
	"bytes"
	"context"
	"errors"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tecache/te/engine/segment"
	"github.com/tecache/te/engine/transport"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/sys/gpu"
)

func TestMsgRoundTrip(t *testing.T) {
	for _, m := range []msg{
		{Op: opOpen, Key: 7, Addr: 0x7f0000001000, Length: 1 << 30, Pid: 4242, Instance: "abc", RPC: "127.0.0.1:5000"},
		{Op: opClose, Key: 1<<64 - 1, Instance: "owner"},
		{Op: opRelease, Key: 9, Instance: ""},
	} {
		got, err := decode(m.encode())
		if err != nil || *got != m {
			t.Fatalf("round trip of %+v = %+v, %v", m, got, err)
		}
	}
	for _, b := range [][]byte{nil, {opOpen}, append((&msg{Op: opClose, Key: 1, Instance: "x"}).encode(), 0), {9, 0, 0, 0, 0, 0, 0, 0, 0}} {
		if _, err := decode(b); !errors.Is(err, errs.ErrProtocol) {
			t.Errorf("decode(% x) = %v, want Protocol", b, err)
		}
	}
}

func FuzzDecode(f *testing.F) {
	f.Add((&msg{Op: opOpen, Key: 1, Addr: 2, Length: 3, Pid: 4, Instance: "i", RPC: "r"}).encode())
	f.Add((&msg{Op: opClose, Key: 1, Instance: "o"}).encode())
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decode(b)
		if err != nil {
			return
		}
		if !bytes.Equal(m.encode(), b) {
			t.Fatalf("decode(% x) = %+v re-encodes differently", b, m)
		}
	})
}

// TestDescriptorExtra checks the handle's encoding in a descriptor survives
// the JSON round trip peers see, and that damaged values are refused.
func TestDescriptorExtra(t *testing.T) {
	var h gpu.IPCHandle
	for i := range h {
		h[i] = byte(255 - i)
	}
	d := &segment.Desc{Name: "n", Buffers: []segment.BufferDesc{{Name: "cuda:1", Addr: 0x1000, Length: 4096, Key: 5}}}
	setExport(&d.Buffers[0], "cuda", export{Handle: h, Offset: 512, UUID: strings.Repeat("ab", 16)})
	b, err := d.Encode()
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(b, []byte(`"te_extra":{"cuda_ipc":"`)) {
		t.Fatalf("descriptor JSON lacks the handle: %s", b)
	}
	d2, err := segment.Decode(b)
	if err != nil {
		t.Fatal(err)
	}
	kind, e, ok, err := exportOf(&d2.Buffers[0])
	if err != nil || !ok || kind != "cuda" || e.Handle != h || e.Offset != 512 || e.UUID != strings.Repeat("ab", 16) {
		t.Fatalf("exportOf after JSON = %+v, %v, %v", e, ok, err)
	}
	if _, _, ok, _ := exportOf(&segment.BufferDesc{Name: "cpu"}); ok {
		t.Fatal("host buffer has an export")
	}
	for k, v := range map[string]string{ExtraHandle: "!!", ExtraOffset: "x", ExtraUUID: "zz"} {
		bad := d2.Buffers[0]
		bad.Extra = map[string]string{}
		for kk, vv := range d2.Buffers[0].Extra {
			bad.Extra[kk] = vv
		}
		bad.Extra[k] = v
		if _, _, _, err := exportOf(&bad); !errors.Is(err, errs.ErrMetadata) {
			t.Errorf("%s=%q: %v, want Metadata", k, v, err)
		}
	}
	if _, err := DecodeHandle(EncodeHandle(h)[:40]); err == nil {
		t.Error("short handle accepted")
	}
}

// fakeDriver records what the transport asks of the driver.
type fakeDriver struct {
	k       string // its kind; "cuda" when empty
	mu      sync.Mutex
	maps    map[uint64]int // mapped base -> device
	opens   atomic.Int32
	spans   []span
	calls   int           // copies calls: one synchronisation each
	block   chan struct{} // when set, copy waits on it
	started chan struct{}
	closed  atomic.Bool // set once Close returned: no copy may start
}

func newFakeDriver() *fakeDriver { return &fakeDriver{maps: map[uint64]int{}} }

func (f *fakeDriver) kind() string {
	if f.k == "" {
		return "cuda"
	}
	return f.k
}
func (f *fakeDriver) devices() int        { return 2 }
func (f *fakeDriver) uuid(dev int) string { return strings.Repeat(string(rune('a'+dev)), 32) }
func (f *fakeDriver) export(dev int, addr, length uint64) (export, error) {
	var h gpu.IPCHandle
	h[0] = byte(dev)
	return export{Handle: h, Offset: 256, UUID: f.uuid(dev)}, nil
}
func (f *fakeDriver) open(dev int, h gpu.IPCHandle) (uint64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	base := uint64(0x10000000 * (len(f.maps) + 1))
	f.maps[base] = dev
	f.opens.Add(1)
	return base, nil
}
func (f *fakeDriver) close(dev int, base uint64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.maps[base]; !ok {
		return errs.New(errs.InvalidArgument, "fake", "close of unopened %#x", base)
	}
	delete(f.maps, base)
	return nil
}
func (f *fakeDriver) copies(dev int, spans []span) []error {
	if f.closed.Load() {
		panic("copy after the transport closed")
	}
	if f.block != nil {
		f.started <- struct{}{}
		<-f.block
	}
	f.mu.Lock()
	f.spans = append(f.spans, spans...)
	f.calls++
	f.mu.Unlock()
	return make([]error, len(spans))
}
func (f *fakeDriver) release() {}
func (f *fakeDriver) mapped() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.maps)
}

type fakeHost struct {
	inst string
	reg  *segment.Registry
}

func (h *fakeHost) SegmentName() string             { return h.inst }
func (h *fakeHost) Instance() string                { return h.inst }
func (h *fakeHost) Registry() *segment.Registry     { return h.reg }
func (h *fakeHost) Control() transport.Control      { return nopControl{} }
func (h *fakeHost) Logf(format string, args ...any) {}
func (h *fakeHost) Param(string) (string, bool)     { return "", false }

type nopControl struct{}

func (nopControl) Handle(uint8, func(context.Context, []byte) ([]byte, error)) {}
func (nopControl) Call(context.Context, string, uint8, []byte) ([]byte, error) {
	return nil, errors.New("no control plane in this test")
}

// pair wires an owner and a peer transport together through their control
// handlers, with fake drivers.
type pair struct {
	owner, peer  *Transport
	odrv, pdrv   *fakeDriver
	ohost, phost *fakeHost
	peerDown     atomic.Bool                   // the peer's control plane does not answer
	ownerGate    atomic.Pointer[chan struct{}] // when set, calls to the owner wait for it
	desc         *segment.Desc
}

func newPair(t *testing.T) *pair {
	p := &pair{odrv: newFakeDriver(), pdrv: newFakeDriver(),
		ohost: &fakeHost{inst: "owner", reg: segment.NewRegistry()}, phost: &fakeHost{inst: "peer", reg: segment.NewRegistry()}}
	p.owner, p.peer = New(), New()
	p.owner.drvs, p.peer.drvs = map[string]driver{"cuda": p.odrv}, map[string]driver{"cuda": p.pdrv}
	p.owner.opt.CloseTimeout = 200 * time.Millisecond
	p.owner.call = func(ctx context.Context, rpc string, body []byte) ([]byte, error) {
		if rpc != "peer-rpc" || p.peerDown.Load() {
			return nil, errs.New(errs.PeerUnreachable, "test", "peer down")
		}
		return p.peer.handle(ctx, body)
	}
	p.peer.call = func(ctx context.Context, rpc string, body []byte) ([]byte, error) {
		if rpc != "owner-rpc" {
			return nil, errs.New(errs.PeerUnreachable, "test", "no such owner")
		}
		if g := p.ownerGate.Load(); g != nil {
			<-*g
		}
		return p.owner.handle(ctx, body)
	}
	for _, x := range []struct {
		tr  *Transport
		h   *fakeHost
		rpc string
	}{{p.owner, p.ohost, "owner-rpc"}, {p.peer, p.phost, "peer-rpc"}} {
		if err := x.tr.Start(x.h); err != nil {
			t.Fatal(err)
		}
		x.tr.Describe(&segment.Desc{Name: x.h.inst, RPC: x.rpc})
	}
	p.desc = &segment.Desc{Name: "owner", Instance: "owner", RPC: "owner-rpc"}
	p.owner.Describe(p.desc)
	return p
}

func (p *pair) register(t *testing.T, addr uint64) *segment.Region {
	r, err := segment.NewRegion(addr, 1<<20, "cuda:1", true)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.owner.Register(r); err != nil {
		t.Fatal(err)
	}
	if _, _, err := p.ohost.reg.Add(r); err != nil {
		t.Fatal(err)
	}
	return r
}

// do runs one request through the peer transport and returns how it ended.
func (p *pair) do(r *transport.Request) error {
	done := make(chan error, 1)
	r.Owner = transport.DoneFunc(func(err error) { done <- err })
	if r.Key == 0 && r.Buffer != nil {
		r.Key = r.Buffer.Key
	}
	p.peer.Submit([]transport.Request{*r})
	return <-done
}

func (p *pair) write(r *segment.Region, off uint64) error {
	buf := r.Desc
	return p.do(&transport.Request{Op: transport.Write, Local: 0x5000, Remote: r.Addr + off, Length: 64, Peer: p.desc, Buffer: &buf})
}

// TestVendorsDoNotPair: a hip buffer is exported under hip_ipc, not
// cuda_ipc; a peer without a HIP runtime does not offer to move it, nor
// does one whose local memory is CUDA's (no runtime copies between the
// two); from host memory, the HIP runtime copies it and the CUDA one is not
// asked. A handle under another runtime's keys than the buffer's location
// is no export at all.
func TestVendorsDoNotPair(t *testing.T) {
	p := newPair(t)
	ohip, phip := &fakeDriver{k: "hip", maps: map[uint64]int{}}, &fakeDriver{k: "hip", maps: map[uint64]int{}}
	p.owner.drvs["hip"] = ohip
	r, err := segment.NewRegion(0xa00000, 1<<20, "hip:1", true)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.owner.Register(r); err != nil {
		t.Fatal(err)
	}
	if _, _, err := p.ohost.reg.Add(r); err != nil {
		t.Fatal(err)
	}
	hk, _, _ := ExtraKeys("hip")
	if r.Desc.Extra[hk] == "" || r.Desc.Extra[ExtraHandle] != "" {
		t.Fatalf("hip buffer exported as %v, want %s only", r.Desc.Extra, hk)
	}
	host, _ := segment.NewRegion(0x5000, 4096, "cpu", false)
	cudaMem, _ := segment.NewRegion(0x6000, 4096, "cuda:0", false)
	buf := r.Desc
	if p.peer.DeviceMemory(p.desc, &buf, host) {
		t.Fatal("a peer without a HIP runtime offers to move hip memory")
	}
	if err := p.do(&transport.Request{Op: transport.Write, Local: 0x5000, Region: host, Remote: r.Addr, Length: 64, Peer: p.desc, Buffer: &buf}); !errors.Is(err, errs.ErrNotSupported) {
		t.Fatalf("write to hip memory without a HIP runtime: %v, want NotSupported", err)
	}
	p.peer.drvs["hip"] = phip
	if p.peer.DeviceMemory(p.desc, &buf, cudaMem) {
		t.Fatal("cuda memory pairs with a hip buffer")
	}
	if err := p.do(&transport.Request{Op: transport.Write, Local: 0x6000, Region: cudaMem, Remote: r.Addr, Length: 64, Peer: p.desc, Buffer: &buf}); !errors.Is(err, errs.ErrNotSupported) {
		t.Fatalf("write from cuda memory to hip memory: %v, want NotSupported", err)
	}
	if !p.peer.DeviceMemory(p.desc, &buf, host) {
		t.Fatal("host memory does not pair with a hip buffer")
	}
	if err := p.do(&transport.Request{Op: transport.Write, Local: 0x5000, Region: host, Remote: r.Addr, Length: 64, Peer: p.desc, Buffer: &buf}); err != nil {
		t.Fatal(err)
	}
	if phip.opens.Load() != 1 || len(phip.spans) != 1 || p.pdrv.opens.Load() != 0 || len(p.pdrv.spans) != 0 {
		t.Fatalf("hip opens %d copies %d, cuda opens %d copies %d: want the hip runtime only",
			phip.opens.Load(), len(phip.spans), p.pdrv.opens.Load(), len(p.pdrv.spans))
	}
	// The same handle under a cuda buffer's name is not an export.
	mislabeled := buf
	mislabeled.Name = "cuda:1"
	if _, _, ok, _ := exportOf(&mislabeled); ok || p.peer.DeviceMemory(p.desc, &mislabeled, host) {
		t.Fatal("a hip handle counts as the export of a cuda buffer")
	}
}

func TestOpenOnceAndCopyAddress(t *testing.T) {
	p := newPair(t)
	r := p.register(t, 0x900000)
	if _, ok := r.Desc.Extra[ExtraHandle]; !ok {
		t.Fatal("Register did not export the GPU buffer")
	}
	for i := 0; i < 3; i++ {
		if err := p.write(r, uint64(i)*100); err != nil {
			t.Fatal(err)
		}
	}
	if n := p.pdrv.opens.Load(); n != 1 {
		t.Fatalf("handle opened %d times, want once", n)
	}
	// Host-memory local range: the peer picks the device whose UUID the
	// owner published (device 1), maps there, and copies to base+offset+delta.
	c := p.pdrv.spans[2]
	var dev int
	for base, d := range p.pdrv.maps {
		dev = d
		if c.dst != base+256+200 || c.src != 0x5000 || c.n != 64 {
			t.Fatalf("copy %#x <- %#x (%d), want %#x <- 0x5000", c.dst, c.src, c.n, base+256+200)
		}
	}
	if dev != 1 {
		t.Fatalf("mapped on device %d, want the owner's GPU (1) by UUID", dev)
	}
	if len(p.owner.exports[r.Desc.Key].openers) != 1 {
		t.Fatal("owner did not record the opener")
	}
}

// TestUnregisterWaitsForPeer: the owner's Unregister returns only after the
// peer's copy in flight ended and its mapping is closed; afterwards the old
// descriptor is refused.
func TestUnregisterWaitsForPeer(t *testing.T) {
	p := newPair(t)
	r := p.register(t, 0x900000)
	if err := p.write(r, 0); err != nil {
		t.Fatal(err)
	}
	p.pdrv.block, p.pdrv.started = make(chan struct{}), make(chan struct{}, 1)
	copyDone := make(chan error, 1)
	go func() { copyDone <- p.write(r, 64) }()
	<-p.pdrv.started
	p.owner.opt.CloseTimeout = 5 * time.Second
	unreg := make(chan error, 1)
	go func() { unreg <- p.owner.Unregister(r) }()
	select {
	case err := <-unreg:
		t.Fatalf("Unregister returned (%v) while the peer's copy was in flight", err)
	case <-time.After(100 * time.Millisecond):
	}
	if p.pdrv.mapped() != 1 {
		t.Fatal("mapping closed under a copy in flight")
	}
	close(p.pdrv.block)
	if err := <-copyDone; err != nil {
		t.Fatal(err)
	}
	if err := <-unreg; err != nil {
		t.Fatalf("Unregister: %v", err)
	}
	if p.pdrv.mapped() != 0 {
		t.Fatal("peer mapping still open after Unregister returned")
	}
	p.pdrv.block = nil
	if err := p.write(r, 0); !errors.Is(err, errs.ErrStaleDescriptor) {
		t.Fatalf("write with the old descriptor = %v, want StaleDescriptor", err)
	}
}

func TestUnregisterSilentAndGonePeers(t *testing.T) {
	p := newPair(t)
	r := p.register(t, 0x900000)
	if err := p.write(r, 0); err != nil {
		t.Fatal(err)
	}
	p.peerDown.Store(true)
	// This process (the "peer" pid the open carried) is alive: Timeout.
	err := p.owner.Unregister(r)
	if !errors.Is(err, errs.ErrTimeout) || !strings.Contains(err.Error(), "do not free") {
		t.Fatalf("Unregister with a silent live peer = %v, want Timeout with a hint", err)
	}
	// A peer whose process exited: its mappings died with it.
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Skip(err)
	}
	r2 := p.register(t, 0x2000000)
	p.peerDown.Store(false)
	if err := p.write(r2, 0); err != nil {
		t.Fatal(err)
	}
	p.owner.omu.Lock()
	for k, o := range p.owner.exports[r2.Desc.Key].openers {
		o.pid = cmd.Process.Pid
		p.owner.exports[r2.Desc.Key].openers[k] = o
	}
	p.owner.omu.Unlock()
	p.peerDown.Store(true)
	if err := p.owner.Unregister(r2); err != nil {
		t.Fatalf("Unregister with an exited peer = %v, want nil", err)
	}
	if p.owner.st.PeersGone.Load() != 1 {
		t.Fatal("exited peer not counted")
	}
}

func TestOpenRefusedForStaleKey(t *testing.T) {
	p := newPair(t)
	r := p.register(t, 0x900000)
	buf := r.Desc
	buf.Key++ // a descriptor from an older registration
	err := p.do(&transport.Request{Op: transport.Read, Local: 0x5000, Remote: r.Addr, Length: 8, Peer: p.desc, Buffer: &buf})
	if !errors.Is(err, errs.ErrStaleDescriptor) {
		t.Fatalf("open under a stale key = %v, want StaleDescriptor", err)
	}
	if p.pdrv.opens.Load() != 0 {
		t.Fatal("handle opened although the owner refused")
	}
	// The failed open is not cached: the right key works afterwards.
	if err := p.write(r, 0); err != nil {
		t.Fatal(err)
	}
}

func TestCloseReleasesEverything(t *testing.T) {
	p := newPair(t)
	r := p.register(t, 0x900000)
	if err := p.write(r, 0); err != nil {
		t.Fatal(err)
	}
	if err := p.peer.Close(); err != nil {
		t.Fatal(err)
	}
	if p.pdrv.mapped() != 0 {
		t.Fatal("Close left a mapping open")
	}
	if n := len(p.owner.exports[r.Desc.Key].openers); n != 0 {
		t.Fatalf("owner still lists %d openers after the peer closed", n)
	}
	done := make(chan error, 1)
	p.peer.Submit([]transport.Request{{Op: transport.Write, Peer: p.desc, Buffer: &r.Desc, Key: r.Desc.Key, Length: 1,
		Owner: transport.DoneFunc(func(err error) { done <- err })}})
	if err := <-done; !errors.Is(err, errs.ErrClosed) {
		t.Fatalf("Submit after Close = %v, want Closed", err)
	}
	if err := p.owner.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestBatchSynchronisesOnce: the requests of one Submit call are enqueued
// together and waited for once per device.
func TestBatchSynchronisesOnce(t *testing.T) {
	p := newPair(t)
	r := p.register(t, 0x900000)
	var wg sync.WaitGroup
	reqs := make([]transport.Request, 100)
	cb := transport.DoneFunc(func(err error) {
		if err != nil {
			t.Error(err)
		}
		wg.Done()
	})
	for i := range reqs {
		wg.Add(1)
		reqs[i] = transport.Request{Op: transport.Write, Local: 0x5000, Remote: r.Addr + uint64(i)*64, Length: 64,
			Peer: p.desc, Buffer: &r.Desc, Key: r.Desc.Key, Owner: cb}
	}
	p.peer.Submit(reqs)
	wg.Wait()
	if p.pdrv.calls != 1 || len(p.pdrv.spans) != 100 {
		t.Fatalf("%d copies calls for %d spans, want 1 for 100", p.pdrv.calls, len(p.pdrv.spans))
	}
	p.peer.Close()
}

// TestSharedAllocation: two buffers in one allocation share one handle; the
// peer maps it once and unmaps it only when both buffers are unregistered.
func TestSharedAllocation(t *testing.T) {
	p := newPair(t)
	r1 := p.register(t, 0x900000)
	r2 := p.register(t, 0x900000+1<<20) // the fake exports the same handle
	if r1.Desc.Extra[ExtraHandle] != r2.Desc.Extra[ExtraHandle] {
		t.Fatal("test needs one handle for both buffers")
	}
	if err := p.write(r1, 0); err != nil {
		t.Fatal(err)
	}
	if err := p.write(r2, 0); err != nil {
		t.Fatal(err)
	}
	if n := p.pdrv.opens.Load(); n != 1 {
		t.Fatalf("one allocation opened %d times", n)
	}
	if err := p.owner.Unregister(r1); err != nil {
		t.Fatal(err)
	}
	if p.pdrv.mapped() != 1 {
		t.Fatal("mapping closed while the second buffer still uses it")
	}
	if err := p.write(r2, 64); err != nil {
		t.Fatal(err)
	}
	if err := p.owner.Unregister(r2); err != nil {
		t.Fatal(err)
	}
	if p.pdrv.mapped() != 0 {
		t.Fatal("mapping left open after both buffers were unregistered")
	}
}

// TestOwnerRestartDropsOldMappings: once the engine at an address has a new
// instance, the mappings of the old one are closed (they would keep a dead
// process's GPU memory allocated).
func TestOwnerRestartDropsOldMappings(t *testing.T) {
	p := newPair(t)
	r := p.register(t, 0x900000)
	if err := p.write(r, 0); err != nil {
		t.Fatal(err)
	}
	p.desc = &segment.Desc{Name: "owner", Instance: "owner-restarted", RPC: "owner-rpc"}
	if err := p.write(r, 0); err != nil {
		t.Fatal(err)
	}
	p.peer.wg.Wait()
	if n := p.pdrv.opens.Load(); n != 2 || p.pdrv.mapped() != 1 {
		t.Fatalf("%d opens, %d mapped; want the old mapping closed and one open", n, p.pdrv.mapped())
	}
}

// TestHandleChecksProvenCaller: with a secret every message's instance must
// be the one its session proved (transport.CallerOf): an engine holding the
// secret cannot record an opener in another's name, drop another's opener,
// or close this engine's mappings of another owner's buffer. Refused with
// Unauthenticated, changing nothing; the proven engine is served.
func TestHandleChecksProvenCaller(t *testing.T) {
	p := newPair(t)
	r := p.register(t, 0x900000)
	if err := p.write(r, 0); err != nil { // the peer maps the owner's buffer
		t.Fatal(err)
	}
	mallory := transport.WithCaller(context.Background(), segment.Caller{Name: "mallory", Instance: "mallory", Known: true})
	for name, m := range map[string]*msg{
		"open in another's name":   {Op: opOpen, Key: r.Desc.Key, Addr: r.Addr, Length: r.Length, Pid: 1, Instance: "peer", RPC: "peer-rpc"},
		"release another's opener": {Op: opRelease, Key: r.Desc.Key, Instance: "peer"},
		"close as another owner":   {Op: opClose, Key: r.Desc.Key, Instance: "owner"},
	} {
		target := p.owner
		if m.Op == opClose {
			target = p.peer
		}
		if _, err := target.handle(mallory, m.encode()); errs.CodeOf(err) != errs.Unauthenticated {
			t.Errorf("%s: %v, want Unauthenticated", name, err)
		}
	}
	p.owner.omu.Lock()
	_, still := p.owner.exports[r.Desc.Key].openers["peer"]
	p.owner.omu.Unlock()
	if !still || p.pdrv.mapped() != 1 {
		t.Fatal("a refused message changed state")
	}
	owner := transport.WithCaller(context.Background(), segment.Caller{Name: "owner", Instance: "owner", Known: true})
	if _, err := p.peer.handle(owner, (&msg{Op: opClose, Key: r.Desc.Key, Instance: "owner"}).encode()); err != nil {
		t.Fatalf("close from the proven owner: %v", err)
	}
	if p.pdrv.mapped() != 0 {
		t.Fatal("the proven owner's close left the mapping open")
	}
}
