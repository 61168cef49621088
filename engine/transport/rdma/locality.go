package rdma

import (
	"strconv"
	"strings"
	"sync"

	"github.com/tecache/te/engine/segment"
	"github.com/tecache/te/internal/sys/gpu"
	"github.com/tecache/te/internal/sys/topo"
)

// ExtraNear is the BufferDesc.Extra key (te_extra in the descriptor) under
// which a buffer names the NICs near it: indexes into the descriptor's
// devices, comma-separated. A peer spreads its requests to the buffer over
// those NICs first. Absent, every NIC is as near.
const ExtraNear = "rdma_near"

// localTiers are the local NICs for one memory location, by index.
type localTiers struct {
	pref, other []int
	near        string // pref as ExtraNear writes it
}

// locality answers which local NICs are near a memory location, from the
// sysfs tree (package topo) and, for GPUs, their PCI addresses from their
// runtime (gpu.Driver), asked the first time a GPU location comes up.
type locality struct {
	root  string
	names []string                   // the transport's NICs, in index order
	gpus  func() map[string][]string // PCI addresses by runtime and ordinal

	mu      sync.Mutex
	machine *topo.Machine // GPUs placed once asked for
	withGPU bool
	cache   sync.Map // segment.Location -> *localTiers
}

func newLocality(root string, names []string, gpus func() map[string][]string) *locality {
	return &locality{root: root, names: names, gpus: gpus}
}

// machineLocked returns the topology, with GPUs when asked for.
func (l *locality) machineLocked(gpus bool) *topo.Machine {
	if l.machine != nil && (l.withGPU || !gpus) {
		return l.machine
	}
	o := topo.Options{Root: l.root, NICs: l.names}
	if gpus && l.gpus != nil {
		o.GPUsByKind = l.gpus()
		l.withGPU = true
	}
	m, err := topo.Discover(o)
	if err != nil {
		// No sysfs to read: every NIC is as near as any other.
		m = &topo.Machine{}
		for _, n := range l.names {
			m.NICs = append(m.NICs, topo.NIC{Name: n, Device: topo.Device{NUMA: -1}})
		}
	}
	l.machine = m
	return m
}

// tiers returns the local NICs near loc.
func (l *locality) tiers(loc segment.Location) *localTiers {
	if v, ok := l.cache.Load(loc); ok {
		return v.(*localTiers)
	}
	l.mu.Lock()
	m := l.machineLocked(gpu.IsDevice(loc.Kind))
	l.mu.Unlock()
	t := m.Near(loc.String())
	idx := make(map[string]int, len(l.names))
	for i, n := range l.names {
		idx[n] = i
	}
	lt := &localTiers{}
	var near []string
	for _, n := range t.Preferred {
		lt.pref = append(lt.pref, idx[n])
		near = append(near, strconv.Itoa(idx[n]))
	}
	for _, n := range t.Others {
		lt.other = append(lt.other, idx[n])
	}
	lt.near = strings.Join(near, ",")
	v, _ := l.cache.LoadOrStore(loc, lt)
	return v.(*localTiers)
}

// matrix is Mooncake's topology JSON of this transport's NICs.
func (l *locality) matrix() topo.Matrix {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.machineLocked(true).Matrix()
}

// parseNear reads a peer buffer's ExtraNear: valid indexes below n, in
// order, without repeats; nil when absent or unusable (every NIC).
func parseNear(s string, n int) []int {
	if s == "" {
		return nil
	}
	var out []int
	seen := map[int]bool{}
	for _, f := range strings.Split(s, ",") {
		i, err := strconv.Atoi(f)
		if err != nil || i < 0 || i >= n || seen[i] {
			return nil
		}
		seen[i] = true
		out = append(out, i)
	}
	return out
}
