package rdma

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/tecache/te/internal/sys/ibv"
)

// nic is one RDMA device as the transport sees it: its port's address, the
// queue pairs whose work requests complete on its completion queue, and the
// hardware behind it.
type nic struct {
	idx       int
	name      string
	port      uint8
	lid       uint16
	gid       ibv.GID
	gidIndex  int
	mtu       uint32 // enum ibv_mtu
	link      uint8
	maxRdAtom uint8
	maxQPWR   int
	maxMR     uint64 // max_mr_size: the longest memory region; 0 if unknown
	hw        nicHW

	// cqCap bounds work requests outstanding on the NIC: all its queue
	// pairs share one completion queue, which must never overrun (a queue
	// pair in error completes every outstanding request, signalled or not).
	cqCap int
	used  atomic.Int64 // work requests posted and not yet accounted complete

	// slots maps a wr_id's upper half to its queue pair: a copy-on-write
	// snapshot the poller reads without a lock.
	slots atomic.Pointer[[]*qpState]
	smu   sync.Mutex // guards slot changes and free
	free  []uint32

	mu      sync.Mutex
	starved map[*endpoint]struct{} // endpoints waiting for CQ room
	nStarve atomic.Int32

	posts  atomic.Uint64 // ibv_post_send calls
	parks  atomic.Uint64 // times the poller slept on the completion channel
	reaped atomic.Uint64 // completions a waiter harvested (Transport.Harvest)

	// What the stall watchdog asks of the NIC (see endpoint.checkStall):
	// when it last completed work for any endpoint, whether the poller is
	// parked with the CQ drained, and when it last found the CQ empty. A
	// poller the machine has not scheduled for a while is not a dead link.
	doneAt  atomic.Int64
	parked  atomic.Bool
	emptyAt atomic.Int64

	scratch outcome // the poller's, reused for every completion
}

// nicHW is what a NIC does in hardware: register memory, create queue
// pairs, and deliver completions. The verbs implementation drives a real
// device; tests drive a fake fabric through the same transport code.
type nicHW interface {
	RegMR(addr, length uint64, access int) (memReg, error)
	RegDmabuf(offset, length, iova uint64, fd int, access int) (memReg, error)
	CreateQP(depth int) (queuePair, error)
	// Run delivers completions with t.complete until Stop.
	Run(t *Transport, n *nic)
	Stop()
	// Release frees the device; every QP and MR of it must be gone.
	Release()
}

// workRequest is one RDMA READ or WRITE: the local triple (local, n, lkey)
// and the remote pair (remote, rkey). Only signaled ones produce a
// completion when they succeed; a failed or flushed one always does.
type workRequest struct {
	id       uint64
	read     bool
	signaled bool
	local    uint64
	n        uint32
	lkey     uint32
	remote   uint64
	rkey     uint32
}

// queuePair is one RC queue pair.
type queuePair interface {
	Num() uint32
	// Depth is how many work requests may be outstanding on it.
	Depth() int
	// Connect brings a fresh queue pair to RTS, talking to the peer's.
	Connect(p ibv.RCParams) error
	// Post posts the work requests as one chain (one ibv_post_send); it
	// returns how many the queue pair took.
	Post(wrs []workRequest) (int, error)
	// Fail moves it to the error state: outstanding work requests complete
	// as flushed.
	Fail() error
	Destroy() error
}

func (n *nic) info() nicInfo { return nicInfo{name: n.name, link: linkName(n.link)} }

// Name and RegMR make a nic a registrar for the key table.
func (n *nic) Name() string { return n.name }

// RegMR registers memory on the NIC.
func (n *nic) RegMR(addr, length uint64, access int) (memReg, error) {
	return n.hw.RegMR(addr, length, access)
}

// maxMRSize is the longest memory region the NIC takes (0: unknown).
func (n *nic) maxMRSize() uint64 { return n.maxMR }

// RegDmabuf registers a dma-buf's bytes on the NIC.
func (n *nic) RegDmabuf(offset, length, iova uint64, fd int, access int) (memReg, error) {
	return n.hw.RegDmabuf(offset, length, iova, fd, access)
}

// pickGIDIndex chooses the GID entry when rdma.gid_index is not set: on
// Ethernet the first RoCE v2 entry with an IPv4-mapped address (else the
// first RoCE v2 one), as sysfs lists them; on InfiniBand entry 0.
func pickGIDIndex(dev string, port uint8, link uint8, tblLen int) int {
	if link != ibv.LinkLayerEthernet {
		return 0
	}
	dir := filepath.Join("/sys/class/infiniband", dev, "ports", fmt.Sprint(port))
	first := -1
	for i := 0; i < min(tblLen, 256); i++ {
		typ, err := os.ReadFile(filepath.Join(dir, "gid_attrs", "types", fmt.Sprint(i)))
		if err != nil || !strings.Contains(strings.ToLower(string(typ)), "v2") {
			continue
		}
		gid, err := os.ReadFile(filepath.Join(dir, "gids", fmt.Sprint(i)))
		if err != nil {
			continue
		}
		g, err := parseGID(string(bytes.TrimSpace(gid)))
		if err != nil || g == (ibv.GID{}) {
			continue
		}
		if isRoCEGID(g) {
			return i
		}
		if first < 0 {
			first = i
		}
	}
	return max(first, 0)
}

// reserve takes room for up to k work requests on the completion queue and
// returns how many it got; with none left it remembers ep so the next
// completion on this NIC flushes it.
func (n *nic) reserve(k int, ep *endpoint) int {
	if n.cqCap <= 0 {
		n.used.Add(int64(k))
		return k
	}
	for {
		cur := n.used.Load()
		room := int64(n.cqCap) - cur
		if room <= 0 {
			n.mu.Lock()
			if n.starved == nil {
				n.starved = map[*endpoint]struct{}{}
			}
			n.starved[ep] = struct{}{}
			n.nStarve.Store(int32(len(n.starved)))
			n.mu.Unlock()
			// A completion may have freed room between the load and the
			// mark: look once more so the endpoint is not left waiting.
			if n.used.Load() < int64(n.cqCap) {
				continue
			}
			return 0
		}
		take := min(int64(k), room)
		if n.used.CompareAndSwap(cur, cur+take) {
			return int(take)
		}
	}
}

// unreserve gives back room for k work requests.
func (n *nic) unreserve(k int) { n.used.Add(-int64(k)) }

// takeStarved returns the endpoints that waited for CQ room.
func (n *nic) takeStarved() []*endpoint {
	if n.nStarve.Load() == 0 {
		return nil
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if len(n.starved) == 0 {
		return nil
	}
	out := make([]*endpoint, 0, len(n.starved))
	for ep := range n.starved {
		out = append(out, ep)
	}
	clear(n.starved)
	n.nStarve.Store(0)
	return out
}

// outstanding returns the work requests posted on the NIC and not yet
// accounted complete.
func (n *nic) outstanding() int { return int(n.used.Load()) }

// addQP gives a queue pair a slot, the upper half of its wr_ids.
func (n *nic) addQP(q *qpState) {
	n.smu.Lock()
	defer n.smu.Unlock()
	var cur []*qpState
	if p := n.slots.Load(); p != nil {
		cur = *p
	}
	next := append([]*qpState(nil), cur...)
	if k := len(n.free); k > 0 {
		q.slot = n.free[k-1]
		n.free = n.free[:k-1]
		next[q.slot] = q
	} else {
		q.slot = uint32(len(next))
		next = append(next, q)
	}
	n.slots.Store(&next)
}

// dropQP frees a destroyed queue pair's slot.
func (n *nic) dropQP(q *qpState) {
	n.smu.Lock()
	defer n.smu.Unlock()
	cur := *n.slots.Load()
	if int(q.slot) >= len(cur) || cur[q.slot] != q {
		return
	}
	next := append([]*qpState(nil), cur...)
	next[q.slot] = nil
	n.free = append(n.free, q.slot)
	n.slots.Store(&next)
}

// qpAt returns the queue pair of a wr_id's slot, or nil.
func (n *nic) qpAt(slot uint32) *qpState {
	p := n.slots.Load()
	if p == nil || int(slot) >= len(*p) {
		return nil
	}
	return (*p)[slot]
}
