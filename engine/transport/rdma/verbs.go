package rdma

import (
	"golang.org/x/sys/unix"

	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/sys/ibv"
)

// verbsNIC is a NIC driven through libibverbs: context, protection domain,
// one completion queue shared by all its queue pairs, and a non-blocking
// completion channel the poller sleeps on.
type verbsNIC struct {
	name   string
	ctx    *ibv.Context
	pd     *ibv.PD
	ch     *ibv.CompChannel
	cq     *ibv.CQ
	wcs    *ibv.WCArray
	stopFD int // eventfd that ends Run
	done   chan struct{}
}

// openNIC opens device i of list as NIC number idx: the first active port,
// a GID, a PD, and a CQ signalled through a non-blocking completion channel.
func openNIC(list *ibv.DeviceList, i, idx int, o Options) (_ *nic, err error) {
	ctx, err := list.Open(i)
	if err != nil {
		return nil, err
	}
	v := &verbsNIC{name: ctx.Name, ctx: ctx, stopFD: -1, done: make(chan struct{})}
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
	if v.stopFD, err = unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK); err != nil {
		return nil, errs.Wrap(errs.Internal, "rdma", err, "eventfd")
	}
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
// under the endpoint's lock).
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
	d := min(depth, int(qp.Cap.MaxSendWR))
	b, err := ibv.NewWRBatch(d)
	if err != nil {
		_ = qp.Destroy()
		return nil, err
	}
	return &verbsQP{qp: qp, batch: b, depth: d}, nil
}

func (q *verbsQP) Num() uint32                  { return q.qp.Num }
func (q *verbsQP) Depth() int                   { return q.depth }
func (q *verbsQP) Connect(p ibv.RCParams) error { return ibv.ConnectRC(q.qp, p) }
func (q *verbsQP) Fail() error                  { return ibv.ToError(q.qp) }

// Post writes the chain into the queue pair's C memory and posts it with
// one ibv_post_send (a longer chain than the send queue, which the
// transport never builds, takes more).
func (q *verbsQP) Post(wrs []workRequest) (int, error) {
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
	q.batch.Free()
	return err
}

// Run is the completion poller: it drains the CQ, arms it, drains again
// (completions that raced the arming) and sleeps on the channel's fd and
// the stop eventfd.
func (v *verbsNIC) Run(t *Transport, n *nic) {
	defer close(v.done)
	fds := []unix.PollFd{{Fd: int32(v.ch.FD), Events: unix.POLLIN}, {Fd: int32(v.stopFD), Events: unix.POLLIN}}
	for {
		if v.drain(t, n) > 0 {
			continue
		}
		if err := v.cq.ReqNotify(false); err != nil {
			t.h.Logf("te: rdma: arming the CQ of %s: %v", v.name, err)
		}
		if v.drain(t, n) > 0 {
			continue
		}
		fds[0].Revents, fds[1].Revents = 0, 0
		if _, err := unix.Poll(fds, -1); err != nil && err != unix.EINTR {
			t.h.Logf("te: rdma: poll on %s: %v", v.name, err)
			return
		}
		if fds[1].Revents != 0 {
			return
		}
		if fds[0].Revents&(unix.POLLERR|unix.POLLHUP|unix.POLLNVAL) != 0 {
			// The device went away: no completion will come. Close fails
			// what is outstanding; until then, wait for it.
			t.h.Logf("te: rdma: completion channel of %s failed (revents %#x)", v.name, fds[0].Revents)
			for {
				if _, err := unix.Poll(fds[1:], -1); err != unix.EINTR {
					return
				}
			}
		}
		if fds[0].Revents != 0 {
			for v.ch.GetEvent() == nil {
			}
		}
	}
}

// drain handles the completions the CQ holds and returns how many.
func (v *verbsNIC) drain(t *Transport, n *nic) int {
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
	if v.stopFD >= 0 {
		one := [8]byte{1}
		_, _ = unix.Write(v.stopFD, one[:])
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
	if v.stopFD >= 0 {
		unix.Close(v.stopFD)
		v.stopFD = -1
	}
	_ = v.ctx.Close()
}
