package rdma

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/tecache/te/internal/sys/ibv"
)

// nic is one RDMA device as the transport sees it: its port's address, the
// work requests posted through it, and the hardware behind it.
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
	hw        nicHW

	// cqCap bounds work requests outstanding on the NIC: all its queue
	// pairs share one completion queue, which must never overrun.
	cqCap int

	mu       sync.Mutex
	inflight map[uint64]*slice // posted work requests by wr_id
	nextID   uint64
	starved  map[*endpoint]struct{} // endpoints waiting for CQ room
}

// nicHW is what a NIC does in hardware: register memory, create queue
// pairs, and deliver completions. The verbs implementation drives a real
// device; tests drive a fake fabric through the same transport code.
type nicHW interface {
	RegMR(addr, length uint64, access int) (memReg, error)
	CreateQP(depth int) (queuePair, error)
	// Run delivers completions with t.complete until Stop.
	Run(t *Transport, n *nic)
	Stop()
	// Release frees the device; every QP and MR of it must be gone.
	Release()
}

// workRequest is one RDMA READ or WRITE: the local triple (local, n, lkey)
// and the remote pair (remote, rkey).
type workRequest struct {
	id     uint64
	read   bool
	local  uint64
	n      uint32
	lkey   uint32
	remote uint64
	rkey   uint32
}

// queuePair is one RC queue pair.
type queuePair interface {
	Num() uint32
	// Depth is how many work requests may be outstanding on it.
	Depth() int
	// Connect brings a fresh queue pair to RTS, talking to the peer's.
	Connect(p ibv.RCParams) error
	// Post posts the work requests as one chain, signalled; it returns how
	// many the queue pair took.
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

// track records a slice about to be posted and returns its wr_id. It
// refuses (ok false) when the completion queue has no room left, and then
// remembers ep so the next completion on this NIC flushes it.
func (n *nic) track(s *slice, ep *endpoint) (id uint64, ok bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cqCap > 0 && len(n.inflight) >= n.cqCap {
		if n.starved == nil {
			n.starved = map[*endpoint]struct{}{}
		}
		n.starved[ep] = struct{}{}
		return 0, false
	}
	n.nextID++
	n.inflight[n.nextID] = s
	return n.nextID, true
}

// takeStarved returns the endpoints that waited for CQ room.
func (n *nic) takeStarved() []*endpoint {
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
	return out
}

func (n *nic) untrack(id uint64) *slice {
	n.mu.Lock()
	s := n.inflight[id]
	delete(n.inflight, id)
	n.mu.Unlock()
	return s
}

func (n *nic) outstanding() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.inflight)
}

// takeAll removes every tracked slice (for Close when the device stopped
// delivering completions).
func (n *nic) takeAll() []*slice {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := make([]*slice, 0, len(n.inflight))
	for id, s := range n.inflight {
		out = append(out, s)
		delete(n.inflight, id)
	}
	return out
}
