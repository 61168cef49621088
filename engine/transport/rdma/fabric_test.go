package rdma

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tecache/te/engine/segment"
	"github.com/tecache/te/engine/transport"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/sys/ibv"
	"github.com/tecache/te/internal/sys/mem"
	"github.com/tecache/te/internal/wire"
)

// The fake fabric stands in for RDMA NICs and the wire between them, so the
// transport's data path (handshake, slicing, posting, completions, retries,
// endpoint re-establishment, Close) runs here without hardware. A work
// request is checked as a NIC would check it — the lkey against the local
// NIC's regions, the rkey against the regions of the NIC that owns the
// connected remote queue pair — and then copied with memcpy.
type fabric struct {
	mu         sync.Mutex
	nextQPN    uint32
	nextKey    uint32
	qps        map[uint32]*fakeQP
	mrs        map[uint32]*fabMR // by lkey and by rkey
	handlers   map[string]func(context.Context, []byte) ([]byte, error)
	posted     map[string]int // work requests per NIC
	posts      map[string]int // Post calls (ibv_post_send) per NIC
	cqes       map[string]int // completions delivered per NIC
	failNext   map[string]int // work requests to fail per NIC
	refuseNext map[string]int // posts to refuse per NIC (after taking one request)
	hold       bool           // keep completions until the QP fails
	gate       chan struct{}  // when set, handshakes wait for it to close
	handshakes int
}

func newFabric() *fabric {
	return &fabric{nextQPN: 0x100, nextKey: 0x10, qps: map[uint32]*fakeQP{}, mrs: map[uint32]*fabMR{},
		handlers: map[string]func(context.Context, []byte) ([]byte, error){}, posted: map[string]int{}, posts: map[string]int{}, cqes: map[string]int{}, failNext: map[string]int{}, refuseNext: map[string]int{}}
}

type fabMR struct {
	hw           *fakeHW
	addr, length uint64
	backing      uint64 // where the bytes are: addr, or a dma-buf's mapping
	mapping      []byte
	access       int
	lkey, rkey   uint32
	live         bool
}

func (m *fabMR) Keys() (uint32, uint32) { return m.lkey, m.rkey }
func (m *fabMR) Dereg() error {
	m.hw.f.mu.Lock()
	defer m.hw.f.mu.Unlock()
	if !m.live {
		return errs.New(errs.Internal, "fake", "double dereg")
	}
	m.live = false
	delete(m.hw.f.mrs, m.lkey)
	delete(m.hw.f.mrs, m.rkey)
	if m.mapping != nil {
		unix.Munmap(m.mapping)
	}
	return nil
}

// at translates an address of the region to where its bytes are.
func (m *fabMR) at(addr uint64) uint64 { return m.backing + (addr - m.addr) }

func (m *fabMR) covers(addr uint64, n uint32) bool {
	return m.live && addr >= m.addr && addr+uint64(n) <= m.addr+m.length
}

// fakeHW is one fake NIC.
type fakeHW struct {
	f    *fabric
	name string
	gid  ibv.GID

	refuse error // RegMR and RegDmabuf fail with it (a NIC that cannot pin the memory)

	qmu    sync.Mutex
	queue  []fabCompletion
	paused bool // completions wait until resume
	wake   chan struct{}
	stop   chan struct{}
	done   chan struct{}
}

func (hw *fakeHW) RegMR(addr, length uint64, access int) (memReg, error) {
	if hw.refuse != nil {
		return nil, hw.refuse
	}
	return hw.reg(addr, length, addr, nil, access), nil
}

func (hw *fakeHW) reg(addr, length, backing uint64, mapping []byte, access int) *fabMR {
	f := hw.f
	f.mu.Lock()
	defer f.mu.Unlock()
	f.nextKey++
	m := &fabMR{hw: hw, addr: addr, length: length, backing: backing, mapping: mapping, access: access,
		lkey: f.nextKey, rkey: f.nextKey | 1<<31, live: true}
	f.mrs[m.lkey], f.mrs[m.rkey] = m, m
	return m
}

// RegDmabuf maps the dma-buf (a memfd in these tests) and serves the
// region's addresses from the mapping.
func (hw *fakeHW) RegDmabuf(offset, length, iova uint64, fd int, access int) (memReg, error) {
	if hw.refuse != nil {
		return nil, hw.refuse
	}
	page := uint64(unix.Getpagesize())
	base := offset &^ (page - 1)
	b, err := unix.Mmap(fd, int64(base), int(offset-base+length), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, errs.Wrap(errs.InvalidArgument, "fake", err, "mmap dma-buf")
	}
	return hw.reg(iova, length, mem.Addr(b)+(offset-base), b, access), nil
}

func (hw *fakeHW) CreateQP(depth int) (queuePair, error) {
	f := hw.f
	f.mu.Lock()
	defer f.mu.Unlock()
	f.nextQPN++
	q := &fakeQP{hw: hw, num: f.nextQPN, depth: depth}
	f.qps[q.num] = q
	return q, nil
}

type fabCompletion struct {
	id     uint64
	status uint32
}

// deliver queues a completion for Run.
func (hw *fakeHW) deliver(c fabCompletion) {
	hw.qmu.Lock()
	hw.queue = append(hw.queue, c)
	hw.qmu.Unlock()
	select {
	case hw.wake <- struct{}{}:
	default:
	}
}

func (hw *fakeHW) Run(t *Transport, n *nic) {
	defer close(hw.done)
	for {
		hw.qmu.Lock()
		var q []fabCompletion
		if !hw.paused {
			q, hw.queue = hw.queue, nil
		}
		hw.qmu.Unlock()
		for _, c := range q {
			t.complete(n, c.id, c.status, 0)
		}
		if len(q) > 0 {
			continue
		}
		select {
		case <-hw.wake:
		case <-hw.stop:
			return
		}
	}
}

func (hw *fakeHW) Stop() { close(hw.stop); <-hw.done }

// pause holds completions back until resume.
func (hw *fakeHW) pause() {
	hw.qmu.Lock()
	hw.paused = true
	hw.qmu.Unlock()
}

func (hw *fakeHW) resume() {
	hw.qmu.Lock()
	hw.paused = false
	hw.qmu.Unlock()
	select {
	case hw.wake <- struct{}{}:
	default:
	}
}
func (hw *fakeHW) Release() {}

type fakeQP struct {
	hw        *fakeHW
	num       uint32
	depth     int
	remote    uint32
	state     int // ibv.QPState*
	destroyed bool
	held      []uint64 // completions kept back (fabric.hold)
}

// Completions follow verbs: a work request that succeeds completes only if
// it was signaled; one that fails always does; moving the queue pair to the
// error state flushes what is outstanding (here: held) with a completion
// each.

func (q *fakeQP) Num() uint32 { return q.num }
func (q *fakeQP) Depth() int  { return q.depth }

func (q *fakeQP) Connect(p ibv.RCParams) error {
	f := q.hw.f
	f.mu.Lock()
	defer f.mu.Unlock()
	peer := f.qps[p.RemoteQPN]
	if q.state != ibv.QPStateReset || peer == nil || peer.hw.gid != p.RemoteGID || ibv.MTUBytes(p.MTU) == 0 || !p.Global {
		return errs.New(errs.InvalidArgument, "fake", "bad connect %+v", p)
	}
	q.remote, q.state = p.RemoteQPN, ibv.QPStateRTS
	return nil
}

func (q *fakeQP) Post(wrs []workRequest) (int, error) {
	f := q.hw.f
	f.mu.Lock()
	defer f.mu.Unlock()
	if q.destroyed {
		return 0, errs.New(errs.Internal, "fake", "post on a destroyed QP")
	}
	f.posts[q.hw.name]++
	if f.refuseNext[q.hw.name] > 0 && len(wrs) > 1 {
		// Take the first request of the chain, refuse the rest.
		f.refuseNext[q.hw.name]--
		wrs = wrs[:1]
		defer func() { q.state = ibv.QPStateErr }()
		n, _ := f.postLocked(q, wrs)
		return n, errs.New(errs.NoMemory, "fake", "send queue full")
	}
	return f.postLocked(q, wrs)
}

func (f *fabric) postLocked(q *fakeQP, wrs []workRequest) (int, error) {
	for _, w := range wrs {
		f.posted[q.hw.name]++
		status := uint32(ibv.WCSuccess)
		switch {
		case q.state == ibv.QPStateErr:
			status = ibv.WCWRFlushErr
		case q.state != ibv.QPStateRTS:
			return 0, errs.New(errs.InvalidArgument, "fake", "post in state %d", q.state)
		case f.failNext[q.hw.name] > 0:
			f.failNext[q.hw.name]--
			status = ibv.WCRetryExcErr
		default:
			status = f.execute(q, w)
		}
		if status != ibv.WCSuccess && status != ibv.WCWRFlushErr {
			q.state = ibv.QPStateErr
		}
		if f.hold && status == ibv.WCSuccess {
			q.held = append(q.held, w.id)
			continue
		}
		if status == ibv.WCSuccess && !w.signaled {
			continue
		}
		q.complete(w.id, status)
	}
	return len(wrs), nil
}

// execute checks the keys as the two NICs would and moves the bytes.
func (f *fabric) execute(q *fakeQP, w workRequest) uint32 {
	lm := f.mrs[w.lkey]
	if lm == nil || lm.lkey != w.lkey || lm.hw != q.hw || !lm.covers(w.local, w.n) {
		return 4 // IBV_WC_LOC_PROT_ERR
	}
	peer := f.qps[q.remote]
	rm := f.mrs[w.rkey]
	need := ibv.AccessRemoteWrite
	if w.read {
		need = ibv.AccessRemoteRead
	}
	if peer == nil || peer.destroyed || rm == nil || rm.rkey != w.rkey || rm.hw != peer.hw || !rm.covers(w.remote, w.n) || rm.access&need == 0 {
		return ibv.WCRemAccessErr
	}
	if w.read {
		mem.Copy(lm.at(w.local), rm.at(w.remote), uint64(w.n))
	} else {
		mem.Copy(rm.at(w.remote), lm.at(w.local), uint64(w.n))
	}
	return ibv.WCSuccess
}

func (q *fakeQP) complete(id uint64, status uint32) {
	q.hw.f.cqes[q.hw.name]++ // under f.mu
	q.hw.deliver(fabCompletion{id, status})
}

func (q *fakeQP) Fail() error {
	f := q.hw.f
	f.mu.Lock()
	defer f.mu.Unlock()
	q.state = ibv.QPStateErr
	for _, id := range q.held {
		q.complete(id, ibv.WCWRFlushErr)
	}
	q.held = nil
	return nil
}

func (q *fakeQP) Destroy() error {
	f := q.hw.f
	f.mu.Lock()
	defer f.mu.Unlock()
	if q.destroyed {
		return errs.New(errs.Internal, "fake", "double destroy of QP %d", q.num)
	}
	if len(q.held) > 0 {
		return errs.New(errs.Internal, "fake", "QP %d destroyed with work outstanding", q.num)
	}
	q.destroyed = true
	delete(f.qps, q.num)
	return nil
}

// fakeControl routes control-plane calls between transports on the fabric.
type fakeControl struct {
	f   *fabric
	rpc string
}

func (c fakeControl) Handle(kind uint8, h func(context.Context, []byte) ([]byte, error)) {
	if kind != wire.KindRDMA {
		panic("unexpected kind")
	}
	c.f.mu.Lock()
	c.f.handlers[c.rpc] = h
	c.f.mu.Unlock()
}

func (c fakeControl) Call(ctx context.Context, rpc string, kind uint8, body []byte) ([]byte, error) {
	c.f.mu.Lock()
	h := c.f.handlers[rpc]
	c.f.handshakes++
	gate := c.f.gate
	c.f.mu.Unlock()
	if gate != nil {
		<-gate
	}
	if h == nil || kind != wire.KindRDMA {
		return nil, errs.New(errs.PeerUnreachable, "fake", "nobody at %s", rpc)
	}
	return h(ctx, body)
}

type fabricHost struct {
	testHost
	name, instance string
	ctl            fakeControl
}

func (h *fabricHost) SegmentName() string         { return h.name }
func (h *fabricHost) Instance() string            { return h.instance }
func (h *fabricHost) Control() transport.Control  { return h.ctl }
func (h *fabricHost) Registry() *segment.Registry { return h.reg }

// side is one engine's worth on the fabric: a started transport, its host
// and a registered buffer.
type side struct {
	t    *testing.T
	tr   *Transport
	h    *fabricHost
	hws  []*fakeHW
	buf  []byte
	reg  *segment.Region
	desc *segment.Desc
}

func newSide(t *testing.T, f *fabric, name string, nics int, params map[string]string) *side {
	t.Helper()
	h := &fabricHost{testHost: *host(params), name: name, instance: name + "-1", ctl: fakeControl{f: f, rpc: name + "-rpc"}}
	o, err := optionsOf(h)
	if err != nil {
		t.Fatal(err)
	}
	tr := New()
	tr.h, tr.opt = h, o
	if o.MRCache {
		tr.keys.cache = &mrCache{}
	}
	s := &side{t: t, tr: tr, h: h}
	var ns []*nic
	for i := 0; i < nics; i++ {
		hw := &fakeHW{f: f, name: fmt.Sprintf("%s_nic%d", name, i), wake: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
		hw.gid[0], hw.gid[1], hw.gid[15] = 0xfe, 0x80, byte(len(f.qps)+i+1)
		hw.gid[14] = name[0]
		n := &nic{idx: i, name: hw.name, port: 1, lid: uint16(i + 1), gid: hw.gid, mtu: ibv.MTU4096,
			link: ibv.LinkLayerInfiniBand, maxRdAtom: 16, hw: hw}
		s.hws = append(s.hws, hw)
		ns = append(ns, n)
	}
	tr.start(ns)
	s.buf = mem.MustAlloc(4 << 20)
	s.reg, err = segment.NewRegion(mem.Addr(s.buf), uint64(len(s.buf)), "cpu:0", true)
	if err != nil {
		t.Fatal(err)
	}
	if err := tr.Register(s.reg); err != nil {
		t.Fatal(err)
	}
	if _, _, err := h.reg.Add(s.reg); err != nil {
		t.Fatal(err)
	}
	s.publish()
	t.Cleanup(func() {
		tr.Close()
		mem.Free(s.buf)
	})
	return s
}

// publish builds the side's descriptor as the engine would.
func (s *side) publish() {
	d := &segment.Desc{Name: s.h.name, Protocol: "rdma", RPC: s.h.ctl.rpc, Instance: s.h.instance,
		Transports: []string{Name}, Buffers: []segment.BufferDesc{s.reg.Desc}}
	s.tr.Describe(d)
	s.desc = d
}

// req builds a request from a's buffer to b's, as the engine would.
func req(a, b *side, op transport.Opcode, localOff, remoteOff, n uint64, c transport.Completer) transport.Request {
	return transport.Request{Op: op, Local: a.reg.Addr + localOff, Remote: b.reg.Addr + remoteOff, Length: n,
		Peer: b.desc, Buffer: &b.desc.Buffers[0], Key: b.desc.Buffers[0].Key, Region: a.reg, Owner: c}
}

// do runs one request from a to b and returns its result.
func do(t *testing.T, a, b *side, op transport.Opcode, localOff, remoteOff, n uint64) error {
	t.Helper()
	done := make(chan error, 2)
	a.tr.Submit([]transport.Request{req(a, b, op, localOff, remoteOff, n, transport.DoneFunc(func(err error) { done <- err }))})
	select {
	case err := <-done:
		// It completes exactly once.
		select {
		case <-done:
			t.Fatal("completed twice")
		case <-time.After(time.Millisecond):
		}
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("request did not end in 10s")
		return nil
	}
}
