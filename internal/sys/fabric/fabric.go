package fabric

import (
	crand "crypto/rand"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/sys/sigkeep"
)

// Offer is one entry fi_getinfo returned: a provider's domain with the
// attributes te plans by. It stays valid until its list is freed; Open
// copies what it needs.
type Offer struct {
	lib  *Lib
	info uintptr

	Provider     string // e.g. "tcp;ofi_rxm", "shm", "efa"
	Fabric       string
	Domain       string // e.g. "lo", "rdmap16s27-rdm"
	Caps         uint64
	Mode         uint64
	MRMode       uint64
	MRKeySize    int
	TxSize       int // transmit queue depth
	MaxMsgSize   uint64
	DataProgress int
	Threading    int
}

// Name is "provider/domain".
func (o *Offer) Name() string { return o.Provider + "/" + o.Domain }

// HasProvider reports whether the provider is name or is layered on it
// (efa, "tcp;ofi_rxm" for tcp).
func (o *Offer) HasProvider(name string) bool {
	for _, p := range strings.Split(o.Provider, ";") {
		if strings.EqualFold(p, name) {
			return true
		}
	}
	return false
}

// Offers is a list from fi_getinfo.
type Offers struct {
	lib  *Lib
	head uintptr
	List []*Offer
}

// Free releases the list.
func (o *Offers) Free() {
	if o.head != 0 {
		call(o.lib.freeinfo, o.head)
		o.head, o.List = 0, nil
	}
}

// Query says what to ask fi_getinfo for.
type Query struct {
	// Node is the source address (an IP of the NIC te listens on) whose
	// domain is wanted; "" asks for every domain.
	Node string
	// Caps are the capabilities asked for (FlagRMA|...).
	Caps uint64
	// MRMode is the registration modes the caller handles (MRHandled).
	MRMode uint64
	// OpFlags are the transmit context's default operation flags
	// (FlagDeliveryComp, so that a write completes once in the target's
	// memory).
	OpFlags uint64
}

// GetInfo asks fi_getinfo (API version APIVersion) for reliable-datagram
// endpoints with q's capabilities; te accepts FI_CONTEXT and FI_CONTEXT2
// modes (its op contexts are C memory of fi_context2's size). No provider
// matching is an empty list, not an error.
func (l *Lib) GetInfo(q Query) (*Offers, error) {
	s, err := newScratch(4096)
	if err != nil {
		return nil, err
	}
	defer s.free()
	hints := callPtr(l.dupinfo, 0)
	if hints == 0 {
		return nil, errs.New(errs.NoMemory, "fabric", "fi_dupinfo(NULL) failed")
	}
	defer call(l.freeinfo, hints)
	hi := at[Info](hints)
	hi.Caps = q.Caps
	hi.Mode = ModeContext | ModeContext2
	at[EPAttr](hi.EPAttr).Type = EPRDM
	da := at[DomainAttr](hi.DomainAttr)
	da.MRMode = int32(q.MRMode)
	da.Threading = ThreadSafe
	da.AVType = AVTable
	at[TxAttr](hi.TxAttr).OpFlags = q.OpFlags
	var node uintptr
	var flags uint64
	if q.Node != "" {
		node = s.cstring(64, q.Node)
		flags = FlagSource
	}
	out := s.addr(0)
	*at[uintptr](out) = 0
	// The first fi_getinfo loads libfabric's provider plugins, whose
	// constructors run then.
	var rc int64
	sigkeep.Around(func() { rc = call(l.getinfo, uintptr(APIVersion), node, 0, uintptr(flags), hints, out) })
	if rc == -errNoData { // -FI_ENODATA: no provider matches
		return &Offers{lib: l}, nil
	}
	if rc != 0 {
		return nil, l.fail("fi_getinfo", rc)
	}
	res := &Offers{lib: l, head: loadPtr(out)}
	for p := res.head; p != 0; p = at[Info](p).Next {
		res.List = append(res.List, l.offer(p))
	}
	return res, nil
}

func (l *Lib) offer(p uintptr) *Offer {
	in := at[Info](p)
	o := &Offer{lib: l, info: p, Caps: in.Caps, Mode: in.Mode}
	if in.FabricAttr != 0 {
		fa := at[FabricAttr](in.FabricAttr)
		o.Provider, o.Fabric = gostring(fa.ProvName), gostring(fa.Name)
	}
	if in.DomainAttr != 0 {
		da := at[DomainAttr](in.DomainAttr)
		o.Domain = gostring(da.Name)
		o.MRMode = uint64(uint32(da.MRMode))
		o.MRKeySize = int(da.MRKeySize)
		o.DataProgress = int(da.DataProgress)
		o.Threading = int(da.Threading)
	}
	if in.TxAttr != 0 {
		o.TxSize = int(at[TxAttr](in.TxAttr).Size)
	}
	if in.EPAttr != 0 {
		o.MaxMsgSize = at[EPAttr](in.EPAttr).MaxMsgSize
	}
	return o
}

func callPtr(fn uintptr, args ...uintptr) uintptr {
	return uintptr(callSize(fn, args...))
}

var shmSeq atomic.Uint64

// shmDir is where libfabric's shm provider keeps its regions (shm_open).
var shmDir = "/dev/shm"

// shmName is a name of its own for an shm endpoint, which shm names its
// region after (by default this process's pid): the sequence number keeps
// several engines of one process from colliding (EBUSY at fi_enable), the
// random part a process whose pid was used before by one that was killed
// and left its region behind (pids wrap at 32768 on a small machine), and
// the pid namespace lets reapShm tell whose regions it may judge. Stale
// regions of this namespace are removed first, once per process.
func shmName() string {
	ns := pidNS()
	reapOnce.Do(func() { reapShm(ns) })
	var r [8]byte
	_, _ = crand.Read(r[:])
	return fmt.Sprintf("te-%s-%d-%d-%x", ns, os.Getpid(), shmSeq.Add(1), r)
}

var reapOnce sync.Once

// pidNS is the inode number of this process's pid namespace ("0" if it
// cannot be read).
func pidNS() string {
	l, err := os.Readlink("/proc/self/ns/pid") // "pid:[4026531836]"
	if err != nil {
		return "0"
	}
	if i, j := strings.IndexByte(l, '['), strings.IndexByte(l, ']'); i >= 0 && j > i+1 {
		return l[i+1 : j]
	}
	return "0"
}

// reapShm removes the regions that shm endpoints of te processes of pid
// namespace ns left in shmDir when they were killed (a process that exits
// normally unlinks its own): each holds its queues' memory, 16 MiB in
// libfabric 1.17, on a tmpfs. A region is stale when the process its name
// names no longer exists; one whose pid is alive (or was reused) is left,
// and regions of other namespaces (a shared /dev/shm) are never judged.
// Mappings a live peer still has stay valid: unlinking only drops the name.
func reapShm(ns string) int {
	if ns == "0" {
		return 0
	}
	ents, err := os.ReadDir(shmDir)
	if err != nil {
		return 0
	}
	prefix, n := "te-"+ns+"-", 0
	for _, e := range ents {
		rest, ok := strings.CutPrefix(e.Name(), prefix)
		if !ok {
			continue
		}
		p, _, _ := strings.Cut(rest, "-")
		pid, err := strconv.Atoi(p)
		if err != nil || pid <= 0 || pid == os.Getpid() {
			continue
		}
		if syscall.Kill(pid, 0) != syscall.ESRCH {
			continue
		}
		if os.Remove(filepath.Join(shmDir, e.Name())) == nil {
			n++
		}
	}
	return n
}

// Domain is an opened fabric and domain of one offer (fi_fabric,
// fi_domain), with the copy of its fi_info that endpoints are opened from.
type Domain struct {
	lib    *Lib
	info   uintptr // fi_dupinfo of the offer
	fabric uintptr
	dom    uintptr
	Offer  Offer // as it was when opened (its info pointer is not kept)

	mu sync.Mutex // guards s (out-parameters of the control calls)
	s  *scratch
}

// OpenDomain opens the offer's fabric and domain.
func (o *Offer) OpenDomain() (*Domain, error) {
	l := o.lib
	s, err := newScratch(4096)
	if err != nil {
		return nil, err
	}
	d := &Domain{lib: l, s: s, Offer: *o}
	d.Offer.info = 0
	d.info = callPtr(l.dupinfo, o.info)
	if d.info == 0 {
		s.free()
		return nil, errs.New(errs.NoMemory, "fabric", "fi_dupinfo failed")
	}
	out := s.addr(0)
	in := at[Info](d.info)
	if o.HasProvider("shm") {
		name := "fi_shm://" + shmName()
		p := callPtr(l.malloc, uintptr(len(name)+1))
		if p == 0 {
			d.Close()
			return nil, errs.New(errs.NoMemory, "fabric", "malloc")
		}
		copy(unsafe.Slice(at[byte](p), len(name)+1), name+"\x00")
		if in.SrcAddr != 0 {
			call(l.free, in.SrcAddr)
		}
		in.SrcAddr, in.SrcAddrLen = p, uint64(len(name)+1)
	}
	if rc := call(l.fabric, in.FabricAttr, out, 0); rc != 0 {
		d.Close()
		return nil, l.fail("fi_fabric("+o.Name()+")", rc)
	}
	d.fabric = loadPtr(out)
	ops := at[OpsFabric](at[FabricFid](d.fabric).Ops)
	if rc := call(ops.Domain, d.fabric, d.info, out, 0); rc != 0 {
		d.Close()
		return nil, l.fail("fi_domain("+o.Name()+")", rc)
	}
	d.dom = loadPtr(out)
	return d, nil
}

// progress orders the provider calls of every domain in the process:
// calls that can progress a provider (posts, completion reads) hold it
// shared, fi_close holds it alone. A software provider (shm, tcp) copies a
// peer's RMA into this process's memory, and walks its endpoints and
// regions, inside those calls on whichever thread makes them, and the shm
// provider shares that state between the domains of one process; fi_close
// on another thread does not wait for a call in progress, so a region or
// endpoint closed (and its memory freed) under one crashed it in
// fi_cq_read. Once a Close returns, no call that could still touch what it
// closed is running.
var progress sync.RWMutex

// closeFid is fi_close.
func closeFid(l *Lib, what string, fid uintptr) error {
	if fid == 0 {
		return nil
	}
	ops := at[FiOps](at[Fid](fid).Ops)
	progress.Lock()
	defer progress.Unlock()
	if rc := call(ops.Close, fid); rc != 0 {
		return l.fail("fi_close("+what+")", rc)
	}
	return nil
}

// Close closes the domain and its fabric. Every endpoint, region, address
// vector and queue of it must be closed first.
func (d *Domain) Close() error {
	var first error
	keep := func(err error) {
		if first == nil {
			first = err
		}
	}
	keep(closeFid(d.lib, "domain", d.dom))
	keep(closeFid(d.lib, "fabric", d.fabric))
	d.dom, d.fabric = 0, 0
	if d.info != 0 {
		call(d.lib.freeinfo, d.info)
		d.info = 0
	}
	d.s.free()
	return first
}

// AV is an address vector (FI_AV_TABLE).
type AV struct {
	d   *Domain
	fid uintptr
}

// OpenAV opens an address vector for count peers.
func (d *Domain) OpenAV(count int) (*AV, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.s.clear(256)
	attr := at[AVAttr](d.s.addr(64))
	attr.Type = AVTable
	attr.Count = uint64(count)
	ops := at[OpsDomain](at[DomainFid](d.dom).Ops)
	if rc := call(ops.AVOpen, d.dom, d.s.addr(64), d.s.addr(0), 0); rc != 0 {
		return nil, d.lib.fail("fi_av_open", rc)
	}
	return &AV{d: d, fid: loadPtr(d.s.addr(0))}, nil
}

// Insert adds a peer's address (from its Endpoint.Name) and returns its
// fi_addr_t.
func (a *AV) Insert(addr []byte) (uint64, error) {
	d := a.d
	if len(addr) == 0 || len(addr) > maxAddrLen {
		return 0, errs.New(errs.InvalidArgument, "fabric", "endpoint address of %d bytes", len(addr))
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	copy(d.s.b[512:], addr)
	*at[uint64](d.s.addr(0)) = addrNotAvail
	ops := at[OpsAV](at[AVFid](a.fid).Ops)
	rc := call(ops.Insert, a.fid, d.s.addr(512), 1, d.s.addr(0), 0, 0)
	fa := *at[uint64](d.s.addr(0))
	if rc != 1 || fa == addrNotAvail {
		if rc >= 0 {
			rc = -22
		}
		return 0, d.lib.fail("fi_av_insert", rc)
	}
	return fa, nil
}

// Close closes the address vector.
func (a *AV) Close() error {
	err := closeFid(a.d.lib, "av", a.fid)
	a.fid = 0
	return err
}

// CQ is a completion queue of format FI_CQ_FORMAT_CONTEXT. Read and ReadErr
// are for one goroutine at a time (they share the queue's C buffer).
type CQ struct {
	d    *Domain
	fid  uintptr
	ops  *OpsCQ
	buf  *scratch
	wait bool
}

// OpenCQ opens a completion queue of size entries; wait asks for a wait
// object, so that SRead can block until a completion or timeout.
func (d *Domain) OpenCQ(size int, wait bool) (*CQ, error) {
	buf, err := newScratch(cqEntryBatch*cqContextEntrySz + int(unsafe.Sizeof(CQErrEntry{})))
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.s.clear(256)
	attr := at[CQAttr](d.s.addr(64))
	attr.Size = uint64(size)
	attr.Format = CQFormatContext
	attr.WaitObj = WaitNone
	if wait {
		attr.WaitObj = WaitUnspec
	}
	ops := at[OpsDomain](at[DomainFid](d.dom).Ops)
	if rc := call(ops.CQOpen, d.dom, d.s.addr(64), d.s.addr(0), 0); rc != 0 {
		buf.free()
		return nil, d.lib.fail("fi_cq_open", rc)
	}
	fid := loadPtr(d.s.addr(0))
	return &CQ{d: d, fid: fid, ops: at[OpsCQ](at[CQFid](fid).Ops), buf: buf, wait: wait}, nil
}

// ErrAvail is returned by Read when an error completion waits for ReadErr.
var ErrAvail = errs.New(errs.IO, "fabric", "an error completion is queued")

// Read reads up to len(ctx) completions (at most 64) into ctx and returns
// how many; 0 with a nil error when there is none. Reading progresses a
// provider with manual progress.
func (c *CQ) Read(ctx []uintptr) (int, error) {
	n := min(len(ctx), cqEntryBatch)
	progress.RLock()
	rc := callSize(c.ops.Read, c.fid, c.buf.addr(0), uintptr(n))
	progress.RUnlock()
	return c.took(ctx, rc)
}

// SRead is Read that waits up to timeoutMS for a completion (a queue
// opened with wait; else it is Read).
func (c *CQ) SRead(ctx []uintptr, timeoutMS int) (int, error) {
	if !c.wait {
		return c.Read(ctx)
	}
	n := min(len(ctx), cqEntryBatch)
	progress.RLock() // a Close waits out the timeout at most
	rc := callSize(c.ops.SRead, c.fid, c.buf.addr(0), uintptr(n), 0, uintptr(int64(timeoutMS)))
	progress.RUnlock()
	return c.took(ctx, rc)
}

func (c *CQ) took(ctx []uintptr, rc int64) (int, error) {
	switch {
	case rc > 0:
		for i := 0; i < int(rc); i++ {
			ctx[i] = *at[uintptr](c.buf.addr(uintptr(i) * cqContextEntrySz))
		}
		return int(rc), nil
	case rc == -errAgain, rc == 0:
		return 0, nil
	case rc == -errAvail:
		return 0, ErrAvail
	}
	return 0, c.d.lib.fail("fi_cq_read", rc)
}

// CQError is an error completion.
type CQError struct {
	Context uintptr
	Err     error
}

// ReadErr reads one error completion; ok false when there is none.
func (c *CQ) ReadErr() (CQError, bool) {
	off := uintptr(cqEntryBatch * cqContextEntrySz)
	c.buf.clear(off + unsafe.Sizeof(CQErrEntry{}))
	e := at[CQErrEntry](c.buf.addr(off))
	progress.RLock()
	rc := callSize(c.ops.ReadErr, c.fid, c.buf.addr(off), 0)
	progress.RUnlock()
	if rc != 1 {
		return CQError{}, false
	}
	code := int64(e.Err)
	if code == 0 {
		code = 5 // EIO: a provider that failed without saying why
	}
	err := c.d.lib.fail("completion", -code)
	return CQError{Context: e.OpContext, Err: err}, true
}

// Close closes the queue.
func (c *CQ) Close() error {
	err := closeFid(c.d.lib, "cq", c.fid)
	c.fid = 0
	c.buf.free()
	return err
}

// Endpoint is an enabled reliable-datagram endpoint.
type Endpoint struct {
	d   *Domain
	fid uintptr
	rma *OpsRMA
}

// Endpoint opens an endpoint bound to av and cq (both directions) and
// enables it.
func (d *Domain) Endpoint(av *AV, cq *CQ) (*Endpoint, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	ops := at[OpsDomain](at[DomainFid](d.dom).Ops)
	if rc := call(ops.Endpoint, d.dom, d.info, d.s.addr(0), 0); rc != 0 {
		return nil, d.lib.fail("fi_endpoint("+d.Offer.Name()+")", rc)
	}
	fid := loadPtr(d.s.addr(0))
	e := &Endpoint{d: d, fid: fid}
	fops := at[FiOps](at[Fid](fid).Ops)
	if rc := call(fops.Bind, fid, av.fid, 0); rc != 0 {
		_ = closeFid(d.lib, "ep", fid)
		return nil, d.lib.fail("fi_ep_bind(av)", rc)
	}
	if rc := call(fops.Bind, fid, cq.fid, FlagSend|FlagRecv); rc != 0 {
		_ = closeFid(d.lib, "ep", fid)
		return nil, d.lib.fail("fi_ep_bind(cq)", rc)
	}
	if rc := call(fops.Control, fid, ctlEnable, 0); rc != 0 {
		_ = closeFid(d.lib, "ep", fid)
		return nil, d.lib.fail("fi_enable", rc)
	}
	e.rma = at[OpsRMA](at[EPFid](fid).RMA)
	return e, nil
}

// Name returns the endpoint's address (fi_getname), what a peer inserts
// into its address vector.
func (e *Endpoint) Name() ([]byte, error) {
	d := e.d
	d.mu.Lock()
	defer d.mu.Unlock()
	*at[uint64](d.s.addr(0)) = maxAddrLen
	cm := at[OpsCM](at[EPFid](e.fid).CM)
	if rc := call(cm.GetName, e.fid, d.s.addr(512), d.s.addr(0)); rc != 0 {
		return nil, d.lib.fail("fi_getname", rc)
	}
	n := *at[uint64](d.s.addr(0))
	if n > maxAddrLen {
		return nil, errs.New(errs.Internal, "fabric", "fi_getname: address of %d bytes", n)
	}
	return append([]byte(nil), d.s.b[512:512+n]...), nil
}

// ErrAgain is a post the provider has no room for now: progress the
// completion queue and post again.
var ErrAgain = errs.New(errs.ResourceExhausted, "fabric", "transmit queue full (-FI_EAGAIN)")

// Write posts fi_write of [buf, buf+n) (desc: its local descriptor, 0
// when the domain does not need one) to raddr under key at peer dest;
// ctx comes back in the completion.
func (e *Endpoint) Write(buf uint64, n uint64, desc uintptr, dest, raddr, key uint64, ctx uintptr) error {
	progress.RLock()
	rc := callSize(e.rma.Write, e.fid, uintptr(buf), uintptr(n), desc, uintptr(dest), uintptr(raddr), uintptr(key), ctx)
	progress.RUnlock()
	return e.posted("fi_write", rc)
}

// Read posts fi_read into [buf, buf+n) from raddr under key at peer dest.
func (e *Endpoint) Read(buf uint64, n uint64, desc uintptr, dest, raddr, key uint64, ctx uintptr) error {
	progress.RLock()
	rc := callSize(e.rma.Read, e.fid, uintptr(buf), uintptr(n), desc, uintptr(dest), uintptr(raddr), uintptr(key), ctx)
	progress.RUnlock()
	return e.posted("fi_read", rc)
}

func (e *Endpoint) posted(op string, rc int64) error {
	switch rc {
	case 0:
		return nil
	case -errAgain:
		return ErrAgain
	}
	return e.d.lib.fail(op, rc)
}

// Close closes the endpoint. Once it returns the provider no longer
// touches the buffers of operations posted on it: the close is their flush.
func (e *Endpoint) Close() error {
	err := closeFid(e.d.lib, "ep", e.fid)
	e.fid = 0
	return err
}

// MR is a registered memory region.
type MR struct {
	d   *Domain
	fid uintptr
	// Key is what a peer passes to reach the region; Desc is the local
	// descriptor (FI_MR_LOCAL).
	Key  uint64
	Desc uintptr
}

// Reg says what to register.
type Reg struct {
	Addr, Len uint64
	Access    uint64 // FlagRead|FlagWrite|FlagRemoteRead|FlagRemoteWrite
	// Key is the requested key (ignored under FI_MR_PROV_KEY).
	Key uint64
	// Iface and Device place device memory (HMEMCUDA and the ordinal);
	// HMEMSystem for host memory.
	Iface  int32
	Device int32
	// EP binds the region to an endpoint and enables it (FI_MR_ENDPOINT).
	EP *Endpoint
}

// Register registers memory with fi_mr_regattr: offset addressing names
// offsets from r.Addr (the region starts at offset 0) unless the domain
// has FI_MR_VIRT_ADDR.
func (d *Domain) Register(r Reg) (*MR, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.s.clear(512)
	iov := at[Iovec](d.s.addr(128))
	iov.Base, iov.Len = uintptr(r.Addr), r.Len
	attr := at[MRAttr](d.s.addr(192))
	attr.MRIov = d.s.addr(128)
	attr.IovCount = 1
	attr.Access = r.Access
	attr.RequestedKey = r.Key
	attr.Iface = r.Iface
	attr.Device = uint64(uint32(r.Device))
	mrops := at[OpsMR](at[DomainFid](d.dom).MR)
	if rc := call(mrops.RegAttr, d.dom, d.s.addr(192), 0, d.s.addr(0)); rc != 0 {
		return nil, d.lib.fail("fi_mr_regattr", rc)
	}
	fid := loadPtr(d.s.addr(0))
	m := &MR{d: d, fid: fid}
	if r.EP != nil {
		fops := at[FiOps](at[Fid](fid).Ops)
		if rc := call(fops.Bind, fid, r.EP.fid, 0); rc != 0 {
			_ = closeFid(d.lib, "mr", fid)
			return nil, d.lib.fail("fi_mr_bind", rc)
		}
		if rc := call(fops.Control, fid, ctlEnable, 0); rc != 0 {
			_ = closeFid(d.lib, "mr", fid)
			return nil, d.lib.fail("fi_mr_enable", rc)
		}
	}
	mf := at[MRFid](fid)
	m.Key, m.Desc = mf.Key, mf.MemDesc
	return m, nil
}

// Close deregisters the region.
func (m *MR) Close() error {
	err := closeFid(m.d.lib, "mr", m.fid)
	m.fid = 0
	return err
}
