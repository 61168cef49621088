package rdma

import (
	"errors"
	"os"
	"runtime"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/sys/ibv"
)

// verbsNIC is a NIC driven through libibverbs: context, protection domain,
// one completion queue shared by all its queue pairs, and a non-blocking
// completion channel the poller sleeps on.
type verbsNIC struct {
	name string
	ctx  *ibv.Context
	pd   *ibv.PD
	ch   *ibv.CompChannel
	cq   *ibv.CQ
	wcs  *ibv.WCArray
	// chFile is a duplicate of the channel's descriptor in Go's network
	// poller: Run parks on it, Stop closes it.
	chFile  *os.File
	stop    chan struct{}
	stopped bool
	done    chan struct{}
	// pollMu makes one goroutine at a time poll the CQ and use wcs and the
	// NIC's scratch: the poller, or a waiter harvesting (Transport.Harvest).
	pollMu sync.Mutex
}

// openNIC opens device i of list as NIC number idx: the first active port,
// a GID, a PD, and a CQ signalled through a non-blocking completion channel.
func openNIC(list *ibv.DeviceList, i, idx int, o Options) (_ *nic, err error) {
	ctx, err := list.Open(i)
	if err != nil {
		return nil, err
	}
	v := &verbsNIC{name: ctx.Name, ctx: ctx, stop: make(chan struct{}), done: make(chan struct{})}
	defer func() {
		if err != nil {
			v.Release()
		}
	}()
	n := &nic{idx: idx, name: ctx.Name, hw: v}
	da, err := ctx.QueryDevice()
	if err != nil {
		return nil, err
	}
	var pa ibv.PortAttr
	for p := uint8(1); p <= da.PhysPortCnt && n.port == 0; p++ {
		if a, err := ctx.QueryPort(p); err == nil && a.State == ibv.PortActive {
			n.port, pa = p, a
		}
	}
	if n.port == 0 {
		return nil, errs.New(errs.NotSupported, "rdma", "%s has no active port", n.name).
			WithHint("check the link (ibv_devinfo) or leave the device out of rdma.devices")
	}
	n.lid, n.mtu, n.link = pa.LID, pa.ActiveMTU, pa.LinkLayer
	n.maxRdAtom = uint8(max(1, min(16, da.MaxQPRdAtom, da.MaxQPInitRdAtom)))
	n.maxQPWR = int(da.MaxQPWR)
	n.maxMR = da.MaxMRSize
	n.gidIndex = o.GIDIndex
	if n.gidIndex < 0 {
		n.gidIndex = pickGIDIndex(n.name, n.port, n.link, int(pa.GIDTblLen))
	}
	if n.gid, err = ctx.QueryGID(n.port, n.gidIndex); err != nil {
		return nil, err
	}
	if n.link == ibv.LinkLayerEthernet && n.gid == (ibv.GID{}) {
		return nil, errs.New(errs.NotSupported, "rdma", "%s port %d: GID index %d is empty", n.name, n.port, n.gidIndex).
			WithHint("give the interface an IP address or set rdma.gid_index")
	}
	if v.pd, err = ctx.AllocPD(); err != nil {
		return nil, err
	}
	if v.ch, err = ctx.CreateCompChannel(); err != nil {
		return nil, err
	}
	if err = unix.SetNonblock(v.ch.FD, true); err != nil {
		return nil, errs.Wrap(errs.Internal, "rdma", err, "completion channel of %s", n.name)
	}
	cqe := DefaultCQE
	if da.MaxCQE > 0 {
		cqe = min(cqe, int(da.MaxCQE))
	}
	if v.cq, err = ctx.CreateCQ(cqe, v.ch, 0); err != nil {
		return nil, err
	}
	n.cqCap = min(cqe, v.cq.CQE)
	if v.wcs, err = ibv.NewWCArray(64); err != nil {
		return nil, err
	}
	fd, err := unix.FcntlInt(uintptr(v.ch.FD), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, errs.Wrap(errs.Internal, "rdma", err, "completion channel of %s", n.name)
	}
	// A non-blocking descriptor: os.NewFile adds it to the network poller.
	v.chFile = os.NewFile(uintptr(fd), n.name+" completion channel")
	return n, nil
}

type mrAdapter struct{ *ibv.MemRegion }

func (m mrAdapter) Keys() (uint32, uint32) { return m.Lkey, m.Rkey }

func (v *verbsNIC) RegMR(addr, length uint64, access int) (memReg, error) {
	m, err := v.pd.RegMR(addr, length, access)
	if err != nil {
		return nil, err
	}
	return mrAdapter{m}, nil
}

func (v *verbsNIC) RegDmabuf(offset, length, iova uint64, fd int, access int) (memReg, error) {
	m, err := v.pd.RegDmabufMR(offset, length, iova, fd, access)
	if err != nil {
		return nil, err
	}
	return mrAdapter{m}, nil
}

// verbsQP is an RC queue pair with the C memory its work requests are built
// in, room for a whole send queue, so one chain is one ibv_post_send (used
// under the endpoint's lock). The memory comes with the first post: the
// queue pairs that peers connect to are never posted on.
type verbsQP struct {
	qp    *ibv.QP
	batch *ibv.WRBatch
	depth int
}

func (v *verbsNIC) CreateQP(depth int) (queuePair, error) {
	qp, err := v.pd.CreateQP(ibv.QPInitAttr{SendCQ: v.cq.Handle(), RecvCQ: v.cq.Handle(), QPType: ibv.QPTypeRC,
		Cap: ibv.QPCap{MaxSendWR: uint32(depth), MaxRecvWR: 1, MaxSendSge: 1, MaxRecvSge: 1}})
	if err != nil {
		return nil, err
	}
	return &verbsQP{qp: qp, depth: min(depth, int(qp.Cap.MaxSendWR))}, nil
}

func (q *verbsQP) Num() uint32                  { return q.qp.Num }
func (q *verbsQP) Depth() int                   { return q.depth }
func (q *verbsQP) Connect(p ibv.RCParams) error { return ibv.ConnectRC(q.qp, p) }
func (q *verbsQP) Fail() error                  { return ibv.ToError(q.qp) }

// Post writes the chain into the queue pair's C memory and posts it with
// one ibv_post_send (a longer chain than the send queue, which the
// transport never builds, takes more).
func (q *verbsQP) Post(wrs []workRequest) (int, error) {
	if q.batch == nil {
		b, err := ibv.NewWRBatch(q.depth)
		if err != nil {
			return 0, err
		}
		q.batch = b
	}
	posted := 0
	for posted < len(wrs) {
		q.batch.Reset()
		for _, w := range wrs[posted:] {
			op := uint32(ibv.WRRDMAWrite)
			if w.read {
				op = ibv.WRRDMARead
			}
			var flags uint32
			if w.signaled {
				flags = ibv.SendSignaled
			}
			if !q.batch.Add(w.id, op, w.local, w.n, w.lkey, w.remote, w.rkey, flags) {
				break
			}
		}
		k, err := q.qp.PostSend(q.batch)
		posted += k
		if err != nil {
			return posted, err
		}
	}
	return posted, nil
}

func (q *verbsQP) Destroy() error {
	err := q.qp.Destroy()
	if q.batch != nil {
		q.batch.Free()
		q.batch = nil
	}
	return err
}

// Run is the completion poller. It drains the CQ; while work requests are
// outstanding and completions have lately come within maxSpin of going
// idle, it keeps polling that long (a poll is a read of the CQ, no system
// call); then it arms the CQ, drains once more (completions that raced the
// arming) and parks on the completion channel in Go's network poller, so a
// waiting poller holds no thread in a system call and the wake-up is the
// runtime's own, not a blocking poll(2) the scheduler must hand a thread
// around for.
func (v *verbsNIC) Run(t *Transport, n *nic) {
	defer close(v.done)
	rc, err := v.chFile.SyscallConn()
	if err != nil {
		t.h.Logf("te: rdma: completion channel of %s: %v", v.name, err)
		<-v.stop
		return
	}
	var sp spinner
	var unacked uint32 // events read and not yet acknowledged
	defer func() { v.cq.Ack(unacked) }()
	for {
		if v.drain(t, n) > 0 {
			sp.hit(nanotime())
			continue
		}
		if t.opt.Poll == PollBusy {
			if v.busy(t, n) {
				continue
			}
		} else if n.outstanding() > 0 {
			now := nanotime()
			n.emptyAt.Store(now)
			sp.idle(now)
			if d := sp.budget(); d > 0 && v.spin(t, n, d) {
				sp.hit(nanotime())
				continue
			}
		} else {
			sp.reset() // waiting for posts, not for the NIC
		}
		if err := v.cq.ReqNotify(false); err != nil {
			t.h.Logf("te: rdma: arming the CQ of %s: %v", v.name, err)
		}
		if v.drain(t, n) > 0 {
			sp.hit(nanotime())
			continue
		}
		// The first look for an event is one call into the library; only
		// a wake-up that finds none asks for errno, to tell a spurious
		// wake-up (EAGAIN) from a channel that broke.
		var evErr error
		looks := 0
		n.parked.Store(true)
		n.parks.Add(1)
		err := rc.Read(func(uintptr) bool {
			if v.ch.TryEvent() {
				unacked++
				return true
			}
			if looks++; looks == 1 {
				return false
			}
			if evErr = v.ch.ReadEvent(); evErr == nil {
				unacked++
				return true
			}
			return !errors.Is(evErr, unix.EAGAIN)
		})
		n.parked.Store(false)
		if unacked >= 64 {
			v.cq.Ack(unacked)
			unacked = 0
		}
		if err != nil {
			return // Stop closed the channel's file
		}
		if evErr != nil && !errors.Is(evErr, unix.EAGAIN) {
			// The device went away: no completion will come. Close fails
			// what is outstanding; until then, wait for it.
			t.h.Logf("te: rdma: completion channel of %s failed: %v", v.name, evErr)
			<-v.stop
			return
		}
		// One event per arming: any other one that came meanwhile is read
		// before the next park (the callback reads until EAGAIN first).
	}
}

// spin polls the CQ for up to d while nothing completes, and reports
// whether something did.
func (v *verbsNIC) spin(t *Transport, n *nic, d time.Duration) bool {
	end := nanotime() + int64(d)
	for i := 0; ; i++ {
		if v.drain(t, n) > 0 {
			return true
		}
		if i%64 == 63 {
			if nanotime() > end {
				return false
			}
			runtime.Gosched()
		}
	}
}

// busy is the poller of rdma.poll=busy: it polls the CQ without arming it
// or sleeping while work is outstanding and for busyLinger after the last
// of it ended, so a stream of batches never waits for a completion event
// (no interrupt, no channel read, no wake-up): the poller's core is
// spent on it, as Mooncake's worker threads spend theirs. It reports
// whether something completed; false sends the poller to park.
func (v *verbsNIC) busy(t *Transport, n *nic) bool {
	idleSince := int64(0)
	for i := 0; ; i++ {
		if v.drain(t, n) > 0 {
			return true
		}
		if i%64 != 63 {
			continue
		}
		now := nanotime()
		if n.outstanding() > 0 {
			// The watchdog's sign that this poller runs and finds nothing.
			n.emptyAt.Store(now)
			idleSince = 0
		} else if idleSince == 0 {
			idleSince = now
		} else if now-idleSince > int64(busyLinger) {
			return false
		}
		select {
		case <-v.stop:
			return false
		default:
		}
		runtime.Gosched()
	}
}

// busyLinger is how long a busy poller keeps polling once nothing is
// outstanding: longer than the gap between one batch's end and the next
// one's first post in a serving loop, short enough that an idle engine
// gives its core back.
const busyLinger = 2 * time.Millisecond

// spinner decides how long the poller polls an idle CQ before it sleeps:
// twice the recent wait from going idle (work outstanding, nothing
// completed) to the next completion, when that is under maxSpin; else not
// at all, since a wake-up costs less than spinning through a long wait.
type spinner struct {
	idleAt int64 // when the poller went idle with work outstanding; 0: not idle
	avg    int64 // moving average of those waits, ns; 0: none measured
}

// maxSpin bounds a spin: about what a sleep and wake-up cost the host.
const maxSpin = 20 * time.Microsecond

func (s *spinner) idle(now int64) {
	if s.idleAt == 0 {
		s.idleAt = now
	}
}

// hit records that a completion came (after idle).
func (s *spinner) hit(now int64) {
	if s.idleAt == 0 {
		return
	}
	w := now - s.idleAt
	s.idleAt = 0
	if s.avg == 0 {
		s.avg = w
	} else {
		s.avg += (w - s.avg) / 4
	}
}

func (s *spinner) reset() { s.idleAt = 0 }

func (s *spinner) budget() time.Duration {
	if s.avg <= 0 || s.avg > int64(maxSpin) {
		return 0
	}
	return min(2*time.Duration(s.avg), maxSpin)
}

// drain handles the completions the CQ holds and returns how many.
func (v *verbsNIC) drain(t *Transport, n *nic) int {
	v.pollMu.Lock()
	defer v.pollMu.Unlock()
	return v.drainLocked(t, n)
}

// harvest drains the CQ on the calling goroutine unless another goroutine
// is polling it (then that one delivers): it never waits.
func (v *verbsNIC) harvest(t *Transport, n *nic) int {
	if !v.pollMu.TryLock() {
		return 0
	}
	defer v.pollMu.Unlock()
	return v.drainLocked(t, n)
}

func (v *verbsNIC) drainLocked(t *Transport, n *nic) int {
	total := 0
	for {
		got, err := v.cq.Poll(v.wcs)
		if err != nil {
			t.h.Logf("te: rdma: polling the CQ of %s: %v", v.name, err)
			return total
		}
		for i := 0; i < got; i++ {
			wc := v.wcs.At(i)
			t.complete(n, wc.WRID, wc.Status, wc.VendorErr)
		}
		total += got
		if got < v.wcs.Cap() {
			return total
		}
	}
}

// Stop ends Run and waits for it.
func (v *verbsNIC) Stop() {
	if v.chFile != nil && !v.stopped {
		v.stopped = true
		close(v.stop)
		_ = v.chFile.Close() // wakes a parked Run
		<-v.done
	}
}

// Release frees the verbs objects.
func (v *verbsNIC) Release() {
	if v.wcs != nil {
		v.wcs.Free()
	}
	if v.cq != nil {
		_ = v.cq.Destroy()
	}
	if v.ch != nil {
		_ = v.ch.Destroy()
	}
	if v.pd != nil {
		_ = v.pd.Dealloc()
	}
	if v.chFile != nil && !v.stopped {
		_ = v.chFile.Close() // never started
	}
	_ = v.ctx.Close()
}
