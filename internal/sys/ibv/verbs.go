package ibv

import (
	"sync"
	"syscall"
	"unsafe"

	"github.com/ebitengine/purego"

	"github.com/tecache/te/internal/errs"
)

// DeviceList is the result of ibv_get_device_list. Contexts opened from it
// stay valid after Free.
type DeviceList struct {
	lib  *Lib
	list uintptr
	devs []uintptr
}

// Devices lists the RDMA devices. No device is not an error: the list is
// empty (this is what a machine with rdma-core but no NIC sees).
func (l *Lib) Devices() (*DeviceList, error) {
	s, err := NewScratch(8)
	if err != nil {
		return nil, err
	}
	defer s.Free()
	list, e := l.call(l.getDeviceList, s.Addr(0))
	if list == 0 {
		if e == syscall.ENOSYS || e == syscall.ENODEV || e == 0 {
			// No uverbs in the kernel: the same as no device.
			return &DeviceList{lib: l}, nil
		}
		return nil, errnoError("ibv", e, "ibv_get_device_list")
	}
	n := int(*at[int32](s.Addr(0)))
	d := &DeviceList{lib: l, list: list}
	for i := 0; i < n; i++ {
		d.devs = append(d.devs, loadPtr(list+uintptr(i)*8))
	}
	return d, nil
}

// Len returns the number of devices.
func (d *DeviceList) Len() int { return len(d.devs) }

// Name returns device i's kernel name, e.g. mlx5_0 or rxe0.
func (d *DeviceList) Name(i int) string { return d.lib.getDeviceName(d.devs[i]) }

// Free releases the list.
func (d *DeviceList) Free() {
	if d.list != 0 {
		d.lib.freeDeviceList(d.list)
		d.list, d.devs = 0, nil
	}
}

// Open opens device i.
func (d *DeviceList) Open(i int) (*Context, error) {
	name := d.Name(i)
	s, err := NewScratch(4096)
	if err != nil {
		return nil, err
	}
	p, e := d.lib.call(d.lib.openDevice, d.devs[i])
	if p == 0 {
		s.Free()
		return nil, errnoError("ibv", e, "ibv_open_device(%s)", name)
	}
	return &Context{lib: d.lib, ptr: p, Name: name, scratch: s}, nil
}

// Context is an opened device (struct ibv_context).
type Context struct {
	Name    string
	lib     *Lib
	ptr     uintptr
	mu      sync.Mutex // guards scratch
	scratch *Scratch
}

// Close closes the device. Every PD, MR, CQ and QP of it must be gone.
func (c *Context) Close() error {
	// The lock: a call still using the scratch finishes before it is
	// unmapped.
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ptr == 0 {
		return nil
	}
	rc := c.lib.closeDevice(c.ptr)
	c.ptr = 0
	c.scratch.Free()
	if rc != 0 {
		return errnoError("ibv", syscall.Errno(-rc), "ibv_close_device(%s)", c.Name)
	}
	return nil
}

func (c *Context) ops() *ContextOps { return &at[RawContext](c.ptr).Ops }

// QueryDevice returns the device's attributes.
func (c *Context) QueryDevice() (DeviceAttr, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.scratch.Clear(unsafe.Sizeof(DeviceAttr{}))
	if rc := c.lib.queryDevice(c.ptr, c.scratch.Addr(0)); rc != 0 {
		return DeviceAttr{}, errnoError("ibv", syscall.Errno(rc), "ibv_query_device(%s)", c.Name)
	}
	return *at[DeviceAttr](c.scratch.Addr(0)), nil
}

// QueryPort returns a port's attributes. As the header's ibv_query_port
// macro does, it calls the provider's extended query_port when the context is
// a verbs_context that has one, and the compat entry point otherwise.
func (c *Context) QueryPort(port uint8) (PortAttr, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	attr := c.scratch.Addr(0)
	c.scratch.Clear(unsafe.Sizeof(PortAttr{}))
	var rc int32
	if fn := c.extQueryPort(); fn != 0 {
		r, _, _ := purego.SyscallN(fn, c.ptr, uintptr(port), attr, unsafe.Sizeof(PortAttr{}))
		rc = int32(r)
	} else {
		rc = c.lib.queryPortCompat(c.ptr, port, attr)
	}
	if rc != 0 {
		return PortAttr{}, errnoError("ibv", syscall.Errno(abs(rc)), "ibv_query_port(%s, %d)", c.Name, port)
	}
	return *at[PortAttr](attr), nil
}

// extQueryPort is verbs_get_ctx_op(ctx, query_port).
func (c *Context) extQueryPort() uintptr {
	if at[RawContext](c.ptr).ABICompat != abiIsExtended {
		return 0
	}
	vctx := c.ptr - VerbsContextCtxOff
	sz := *at[uint64](vctx + VerbsContextSzOff)
	if sz < uint64(VerbsContextSize-VerbsContextQueryPortOff) {
		return 0
	}
	return loadPtr(vctx + VerbsContextQueryPortOff)
}

func abs(x int32) int32 {
	if x < 0 {
		return -x
	}
	return x
}

// QueryGID returns entry index of a port's GID table.
func (c *Context) QueryGID(port uint8, index int) (GID, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.scratch.Clear(16)
	if rc := c.lib.queryGID(c.ptr, port, int32(index), c.scratch.Addr(0)); rc != 0 {
		return GID{}, errnoError("ibv", syscall.Errno(abs(rc)), "ibv_query_gid(%s, %d, %d)", c.Name, port, index)
	}
	return *at[GID](c.scratch.Addr(0)), nil
}

// PD is a protection domain.
type PD struct {
	c   *Context
	ptr uintptr
}

// AllocPD allocates a protection domain.
func (c *Context) AllocPD() (*PD, error) {
	p, e := c.lib.call(c.lib.allocPD, c.ptr)
	if p == 0 {
		return nil, errnoError("ibv", e, "ibv_alloc_pd(%s)", c.Name)
	}
	return &PD{c: c, ptr: p}, nil
}

// Dealloc frees the protection domain.
func (pd *PD) Dealloc() error {
	if pd.ptr == 0 {
		return nil
	}
	rc := pd.c.lib.deallocPD(pd.ptr)
	pd.ptr = 0
	if rc != 0 {
		return errnoError("ibv", syscall.Errno(rc), "ibv_dealloc_pd(%s)", pd.c.Name)
	}
	return nil
}

// MemRegion is a registered memory region (struct ibv_mr).
type MemRegion struct {
	c      *Context
	ptr    uintptr
	Addr   uint64
	Length uint64
	Lkey   uint32
	Rkey   uint32
}

// RegMR registers [addr, addr+length) with the access flags. Flags in the
// optional range (relaxed ordering) go through ibv_reg_mr_iova2 as the
// header's ibv_reg_mr macro does; plain flags through ibv_reg_mr.
func (pd *PD) RegMR(addr, length uint64, access int) (*MemRegion, error) {
	var p uintptr
	var e syscall.Errno
	if access&accessOptionalRangeMask != 0 && pd.c.lib.regMRIova2 != 0 {
		p, e = pd.c.lib.call(pd.c.lib.regMRIova2, pd.ptr, uintptr(addr), uintptr(length), uintptr(addr), uintptr(uint32(access)))
	} else {
		p, e = pd.c.lib.call(pd.c.lib.regMR, pd.ptr, uintptr(addr), uintptr(length), uintptr(uint32(access&^accessOptionalRangeMask)))
	}
	if p == 0 {
		return nil, errnoError("ibv", e, "ibv_reg_mr(%s, %#x, %d)", pd.c.Name, addr, length)
	}
	return pd.c.newMR(p), nil
}

// RegDmabufMR registers length bytes at offset of a dma-buf (GPU memory
// exported by its driver), mapped at iova.
func (pd *PD) RegDmabufMR(offset, length, iova uint64, fd int, access int) (*MemRegion, error) {
	if pd.c.lib.regDmabufMR == 0 {
		return nil, errs.New(errs.NotSupported, "ibv", "%s has no ibv_reg_dmabuf_mr", pd.c.lib.Path).
			WithHint("rdma-core 34 or newer is needed")
	}
	p, e := pd.c.lib.call(pd.c.lib.regDmabufMR, pd.ptr, uintptr(offset), uintptr(length), uintptr(iova), uintptr(fd), uintptr(uint32(access)))
	if p == 0 {
		return nil, errnoError("ibv", e, "ibv_reg_dmabuf_mr(%s, fd %d)", pd.c.Name, fd)
	}
	return pd.c.newMR(p), nil
}

func (c *Context) newMR(p uintptr) *MemRegion {
	m := at[RawMR](p)
	return &MemRegion{c: c, ptr: p, Addr: uint64(m.Addr), Length: m.Length, Lkey: m.Lkey, Rkey: m.Rkey}
}

// Dereg deregisters the region; its keys stop working at once.
func (m *MemRegion) Dereg() error {
	if m.ptr == 0 {
		return nil
	}
	rc := m.c.lib.deregMR(m.ptr)
	m.ptr = 0
	if rc != 0 {
		return errnoError("ibv", syscall.Errno(rc), "ibv_dereg_mr(%s)", m.c.Name)
	}
	return nil
}

// CompChannel is a completion event channel; its FD becomes readable when
// an armed CQ gets a completion.
type CompChannel struct {
	c       *Context
	ptr     uintptr
	FD      int
	scratch *Scratch
}

// CreateCompChannel creates a completion channel.
func (c *Context) CreateCompChannel() (*CompChannel, error) {
	s, err := NewScratch(16)
	if err != nil {
		return nil, err
	}
	p, e := c.lib.call(c.lib.createCompChannel, c.ptr)
	if p == 0 {
		s.Free()
		return nil, errnoError("ibv", e, "ibv_create_comp_channel(%s)", c.Name)
	}
	return &CompChannel{c: c, ptr: p, FD: int(at[RawCompChannel](p).FD), scratch: s}, nil
}

// GetEvent reads one completion event (ibv_get_cq_event) and acknowledges it.
// It blocks unless FD was made non-blocking, in which case it returns
// EAGAIN as a te error when there is none.
func (ch *CompChannel) GetEvent() error {
	r, e := ch.c.lib.call(ch.c.lib.getCQEvent, ch.ptr, ch.scratch.Addr(0), ch.scratch.Addr(8))
	if int32(r) != 0 {
		return errnoError("ibv", e, "ibv_get_cq_event(%s)", ch.c.Name)
	}
	ch.c.lib.ackCQEvents(loadPtr(ch.scratch.Addr(0)), 1)
	return nil
}

// TryEvent reads one completion event (ibv_get_cq_event) from a
// non-blocking channel without acknowledging it, in one call into the
// library: false means none was there, or the read failed (ReadEvent says
// why). Acknowledge what it read with CQ.Ack.
func (ch *CompChannel) TryEvent() bool {
	r, _, _ := purego.SyscallN(ch.c.lib.getCQEvent, ch.ptr, ch.scratch.Addr(0), ch.scratch.Addr(8))
	return int32(r) == 0
}

// ReadEvent is TryEvent with the reason it failed: EAGAIN (as a te error)
// when a non-blocking channel holds no event.
func (ch *CompChannel) ReadEvent() error {
	r, e := ch.c.lib.call(ch.c.lib.getCQEvent, ch.ptr, ch.scratch.Addr(0), ch.scratch.Addr(8))
	if int32(r) != 0 {
		return errnoError("ibv", e, "ibv_get_cq_event(%s)", ch.c.Name)
	}
	return nil
}

// Destroy destroys the channel; its CQs must be gone.
func (ch *CompChannel) Destroy() error {
	if ch.ptr == 0 {
		return nil
	}
	rc := ch.c.lib.destroyCompChannel(ch.ptr)
	ch.ptr = 0
	ch.scratch.Free()
	if rc != 0 {
		return errnoError("ibv", syscall.Errno(rc), "ibv_destroy_comp_channel(%s)", ch.c.Name)
	}
	return nil
}

// CQ is a completion queue.
type CQ struct {
	c   *Context
	ptr uintptr
	CQE int
}

// CreateCQ creates a completion queue of at least cqe entries, signalling
// ch (may be nil) on comp vector vec.
func (c *Context) CreateCQ(cqe int, ch *CompChannel, vec int) (*CQ, error) {
	var chp uintptr
	if ch != nil {
		chp = ch.ptr
	}
	p, e := c.lib.call(c.lib.createCQ, c.ptr, uintptr(cqe), 0, chp, uintptr(vec))
	if p == 0 {
		return nil, errnoError("ibv", e, "ibv_create_cq(%s, %d)", c.Name, cqe)
	}
	return &CQ{c: c, ptr: p, CQE: int(at[CQHead](p).CQE)}, nil
}

// Poll is ibv_poll_cq through the context's ops table: it fills up to
// wcs.Cap() completions and returns how many.
func (cq *CQ) Poll(wcs *WCArray) (int, error) {
	r, _, _ := purego.SyscallN(cq.c.ops().PollCQ, cq.ptr, uintptr(wcs.n), wcs.s.Addr(0))
	n := int(int32(r))
	if n < 0 {
		return 0, errs.New(errs.Internal, "ibv", "ibv_poll_cq(%s) failed: %d", cq.c.Name, n)
	}
	return n, nil
}

// ReqNotify is ibv_req_notify_cq: arm the CQ so its channel gets an event at
// the next completion.
func (cq *CQ) ReqNotify(solicitedOnly bool) error {
	var so uintptr
	if solicitedOnly {
		so = 1
	}
	r, _, _ := purego.SyscallN(cq.c.ops().ReqNotifyCQ, cq.ptr, so)
	if int32(r) != 0 {
		return errnoError("ibv", syscall.Errno(abs(int32(r))), "ibv_req_notify_cq(%s)", cq.c.Name)
	}
	return nil
}

// Ack acknowledges n completion events of the CQ read with TryEvent or
// ReadEvent (ibv_ack_cq_events, which takes a lock: batch them). Every
// event must be acknowledged before the CQ is destroyed.
func (cq *CQ) Ack(n uint32) {
	if n > 0 {
		cq.c.lib.ackCQEvents(cq.ptr, n)
	}
}

// Destroy destroys the CQ; its QPs must be gone.
func (cq *CQ) Destroy() error {
	if cq.ptr == 0 {
		return nil
	}
	rc := cq.c.lib.destroyCQ(cq.ptr)
	cq.ptr = 0
	if rc != 0 {
		return errnoError("ibv", syscall.Errno(rc), "ibv_destroy_cq(%s)", cq.c.Name)
	}
	return nil
}

// WCArray is room for completions in C memory.
type WCArray struct {
	s *Scratch
	n int
}

// NewWCArray allocates room for n completions.
func NewWCArray(n int) (*WCArray, error) {
	s, err := NewScratch(n * int(unsafe.Sizeof(WC{})))
	if err != nil {
		return nil, err
	}
	return &WCArray{s: s, n: n}, nil
}

// Cap returns the number of completions the array holds.
func (a *WCArray) Cap() int { return a.n }

// At returns completion i as filled by the last Poll.
func (a *WCArray) At(i int) WC { return *at[WC](a.s.Addr(uintptr(i) * unsafe.Sizeof(WC{}))) }

// Free releases the array.
func (a *WCArray) Free() { a.s.Free() }

// QP is a queue pair.
type QP struct {
	c   *Context
	ptr uintptr
	Num uint32
	Cap QPCap // the capacities the provider granted
}

// CreateQP creates a queue pair in pd.
func (pd *PD) CreateQP(attr QPInitAttr) (*QP, error) {
	c := pd.c
	c.mu.Lock()
	defer c.mu.Unlock()
	a := at[QPInitAttr](c.scratch.Addr(0))
	*a = attr
	p, e := c.lib.call(c.lib.createQP, pd.ptr, c.scratch.Addr(0))
	if p == 0 {
		return nil, errnoError("ibv", e, "ibv_create_qp(%s)", c.Name)
	}
	return &QP{c: c, ptr: p, Num: at[QPHead](p).QPNum, Cap: a.Cap}, nil
}

// Modify is ibv_modify_qp with the attribute mask.
func (qp *QP) Modify(attr *QPAttr, mask int) error {
	c := qp.c
	c.mu.Lock()
	defer c.mu.Unlock()
	*at[QPAttr](c.scratch.Addr(0)) = *attr
	if rc := c.lib.modifyQP(qp.ptr, c.scratch.Addr(0), int32(mask)); rc != 0 {
		return errnoError("ibv", syscall.Errno(abs(rc)), "ibv_modify_qp(%s, qp %d, state %d)", c.Name, qp.Num, attr.QPState)
	}
	return nil
}

// Destroy destroys the queue pair.
func (qp *QP) Destroy() error {
	if qp.ptr == 0 {
		return nil
	}
	rc := qp.c.lib.destroyQP(qp.ptr)
	qp.ptr = 0
	if rc != 0 {
		return errnoError("ibv", syscall.Errno(rc), "ibv_destroy_qp(%s)", qp.c.Name)
	}
	return nil
}

// PostSend is ibv_post_send through the context's ops table. It posts the
// batch's work requests as one chain and returns how many the provider
// accepted; on error the rest were not posted.
func (qp *QP) PostSend(b *WRBatch) (int, error) {
	if b.used == 0 {
		return 0, nil
	}
	first := b.wrAddr(0)
	for i := 0; i < b.used; i++ {
		w := at[SendWR](b.wrAddr(i))
		w.Next = 0
		if i+1 < b.used {
			w.Next = b.wrAddr(i + 1)
		}
	}
	bad := b.badAddr()
	*at[uintptr](bad) = 0
	r, _, _ := purego.SyscallN(qp.c.ops().PostSend, qp.ptr, first, bad)
	if int32(r) == 0 {
		return b.used, nil
	}
	// bad_wr names the first request not posted; without it (a provider
	// that did not set it) assume none was, so none waits for a completion
	// that will not come.
	posted := 0
	if bw := loadPtr(bad); bw >= first {
		posted = int((bw - first) / unsafe.Sizeof(SendWR{}))
	}
	if posted > b.used {
		posted = 0
	}
	return posted, errnoError("ibv", syscall.Errno(abs(int32(r))), "ibv_post_send(%s, qp %d)", qp.c.Name, qp.Num)
}

// WRBatch holds up to n RDMA READ/WRITE work requests, one SGE each, in C
// memory, to be posted as one chain.
type WRBatch struct {
	s    *Scratch
	n    int
	used int
}

// NewWRBatch allocates room for n work requests.
func NewWRBatch(n int) (*WRBatch, error) {
	size := uintptr(n)*(unsafe.Sizeof(SendWR{})+unsafe.Sizeof(Sge{})) + 8
	s, err := NewScratch(int(size))
	if err != nil {
		return nil, err
	}
	return &WRBatch{s: s, n: n}, nil
}

func (b *WRBatch) wrAddr(i int) uintptr  { return b.s.Addr(uintptr(i) * unsafe.Sizeof(SendWR{})) }
func (b *WRBatch) sgeAddr(i int) uintptr { return b.wrAddr(b.n) + uintptr(i)*unsafe.Sizeof(Sge{}) }
func (b *WRBatch) badAddr() uintptr      { return b.sgeAddr(b.n) }

// Add appends a work request: opcode (WRRDMARead or WRRDMAWrite) with the
// local triple (addr, length, lkey) in its SGE and the remote pair
// (remote_addr, rkey) in wr.rdma. It reports false when the batch is full.
func (b *WRBatch) Add(wrID uint64, opcode uint32, local uint64, length, lkey uint32, remote uint64, rkey uint32, flags uint32) bool {
	if b.used == b.n {
		return false
	}
	i := b.used
	*at[Sge](b.sgeAddr(i)) = Sge{Addr: local, Length: length, Lkey: lkey}
	*at[SendWR](b.wrAddr(i)) = SendWR{
		WRID: wrID, SgList: b.sgeAddr(i), NumSge: 1, Opcode: opcode, SendFlags: flags,
		RemoteAddr: remote, Rkey: rkey,
	}
	b.used++
	return true
}

// Len returns the number of work requests added since the last Reset.
func (b *WRBatch) Len() int { return b.used }

// WR returns work request i and its SGE as they will be posted.
func (b *WRBatch) WR(i int) (SendWR, Sge) {
	return *at[SendWR](b.wrAddr(i)), *at[Sge](b.sgeAddr(i))
}

// Reset empties the batch.
func (b *WRBatch) Reset() { b.used = 0 }

// Free releases the batch's memory.
func (b *WRBatch) Free() { b.s.Free() }

// Handle returns the struct ibv_cq pointer, for QPInitAttr.SendCQ/RecvCQ.
func (cq *CQ) Handle() uintptr { return cq.ptr }
