package topo

import (
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/tecache/te/internal/errs"
)

// EnvSysfsRoot names the directory that replaces /sys.
const EnvSysfsRoot = "TE_SYSFS_ROOT"

// Root returns where sysfs is read: $TE_SYSFS_ROOT, else /sys.
func Root() string {
	if r := os.Getenv(EnvSysfsRoot); r != "" {
		return r
	}
	return "/sys"
}

// Device is a PCI function as sysfs places it.
type Device struct {
	// BusID is the function's address ("0000:1a:00.0"); empty when the
	// device has no PCI function (Soft-RoCE, say).
	BusID string `json:"bus_id,omitempty"`
	// Complex is the PCI root complex ("pci0000:00"); Bridges the bridges
	// from the root port down to the function, by address.
	Complex string   `json:"root_complex,omitempty"`
	Bridges []string `json:"bridges,omitempty"`
	// NUMA is the node the function is attached to, -1 when sysfs does not
	// say.
	NUMA int `json:"numa_node"`
}

// NIC is an RDMA device.
type NIC struct {
	Name string `json:"name"`
	Device
}

// GPU is a device of a GPU runtime: Kind is the runtime's location kind
// ("cuda", "hip") and Ordinal its ordinal in this process.
type GPU struct {
	Kind    string `json:"kind"`
	Ordinal int    `json:"ordinal"`
	Device
}

// Machine is what Discover found.
type Machine struct {
	NICs  []NIC `json:"nics"`
	GPUs  []GPU `json:"gpus"`
	Nodes []int `json:"numa_nodes"`
}

// Options say what to describe.
type Options struct {
	// Root replaces /sys; empty means Root().
	Root string
	// NICs names the RDMA devices to describe, in order; nil means every
	// entry of class/infiniband, sorted.
	NICs []string
	// Allow, when not empty, keeps only the NICs it names (rdma.devices,
	// TE_RDMA_DEVICES).
	Allow []string
	// GPUs are the PCI addresses of the CUDA devices, by ordinal (from the
	// driver: cuDeviceGetPCIBusId). An empty address is a GPU whose place
	// is unknown.
	GPUs []string
	// GPUsByKind are the PCI addresses of the devices of other runtimes,
	// by location kind ("hip") and ordinal, as GPUs are for CUDA (a "cuda"
	// entry is used when GPUs is empty).
	GPUsByKind map[string][]string
}

// Discover reads the sysfs tree. A NIC or GPU that sysfs does not place is
// described with what is known (no bus address, NUMA -1); only an unusable
// root is an error.
func Discover(o Options) (*Machine, error) {
	root := o.Root
	if root == "" {
		root = Root()
	}
	if st, err := os.Stat(root); err != nil || !st.IsDir() {
		return nil, errs.New(errs.NotFound, "topo", "sysfs root %q is not a directory", root).
			WithHint("unset " + EnvSysfsRoot + " or point it at a sysfs tree")
	}
	m := &Machine{NICs: []NIC{}, GPUs: []GPU{}, Nodes: []int{}}
	names := o.NICs
	if names == nil {
		ents, _ := os.ReadDir(filepath.Join(root, "class", "infiniband"))
		for _, e := range ents {
			names = append(names, e.Name())
		}
		slices.Sort(names)
	}
	for _, n := range names {
		if len(o.Allow) > 0 && !slices.Contains(o.Allow, n) {
			continue
		}
		m.NICs = append(m.NICs, NIC{Name: n, Device: place(root, filepath.Join(root, "class", "infiniband", n, "device"))})
	}
	byKind := map[string][]string{}
	for k, v := range o.GPUsByKind {
		byKind[k] = v
	}
	if len(o.GPUs) > 0 {
		byKind["cuda"] = o.GPUs
	}
	kinds := slices.Sorted(maps.Keys(byKind))
	for _, kind := range kinds {
		for i, bus := range byKind[kind] {
			g := GPU{Kind: kind, Ordinal: i, Device: Device{NUMA: -1}}
			if bus != "" {
				g.Device = place(root, filepath.Join(root, "bus", "pci", "devices", bus))
			}
			m.GPUs = append(m.GPUs, g)
		}
	}
	ents, _ := os.ReadDir(filepath.Join(root, "devices", "system", "node"))
	for _, e := range ents {
		if n, ok := strings.CutPrefix(e.Name(), "node"); ok && e.IsDir() {
			if v, err := strconv.Atoi(n); err == nil {
				m.Nodes = append(m.Nodes, v)
			}
		}
	}
	slices.Sort(m.Nodes)
	return m, nil
}

// place resolves a device link to its PCI function and reads its NUMA node.
func place(root, link string) Device {
	d := Device{NUMA: -1}
	real, err := filepath.EvalSymlinks(link)
	if err != nil {
		return d
	}
	if b, err := os.ReadFile(filepath.Join(real, "numa_node")); err == nil {
		if v, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && v >= 0 {
			d.NUMA = v
		}
	}
	rootReal, err := filepath.EvalSymlinks(root)
	if err != nil {
		return d
	}
	rel, err := filepath.Rel(rootReal, real)
	if err != nil || strings.HasPrefix(rel, "..") {
		return d
	}
	// devices/pciDDDD:BB/<root port>/<bridge>.../<function>
	parts := strings.Split(filepath.ToSlash(rel), "/")
	for i, p := range parts {
		if i > 0 && parts[i-1] == "devices" && strings.HasPrefix(p, "pci") {
			fns := parts[i+1:]
			for _, f := range fns {
				if !isBusID(f) {
					return d // not a PCI function after all (a virtual device below one)
				}
			}
			if len(fns) == 0 {
				return d
			}
			d.Complex = p
			d.BusID = fns[len(fns)-1]
			d.Bridges = append([]string(nil), fns[:len(fns)-1]...)
			return d
		}
	}
	return d
}

// isBusID reports whether s looks like "dddd:bb:dd.f".
func isBusID(s string) bool {
	if len(s) != 12 || s[4] != ':' || s[7] != ':' || s[10] != '.' {
		return false
	}
	for i, c := range s {
		if i == 4 || i == 7 || i == 10 {
			continue
		}
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// sameSwitch reports whether two functions sit behind one PCIe switch: they
// share the root complex, the root port and at least one bridge below it.
func sameSwitch(a, b Device) bool {
	if a.Complex == "" || a.Complex != b.Complex {
		return false
	}
	n := 0
	for n < len(a.Bridges) && n < len(b.Bridges) && a.Bridges[n] == b.Bridges[n] {
		n++
	}
	return n >= 2
}

// Tiers are the NICs for one memory location: Preferred first, Others when
// those fail or are busy. Either may be empty, never both unless there is
// no NIC.
type Tiers struct {
	Preferred []string `json:"preferred"`
	Others    []string `json:"others"`
}

// Near returns the tiers of a location, "cpu:N" or a GPU's KIND:N ("cuda:N",
// "hip:N"). Other locations (and "cpu" without a node) prefer every NIC.
func (m *Machine) Near(loc string) Tiers {
	kind, idx, ok := strings.Cut(loc, ":")
	n, err := strconv.Atoi(idx)
	if !ok || err != nil || n < 0 {
		return m.split(func(NIC) bool { return true })
	}
	switch kind {
	case "cpu":
		single := len(m.Nodes) <= 1
		return m.split(func(c NIC) bool { return c.NUMA == n || (c.NUMA < 0 && single) })
	default:
		i := slices.IndexFunc(m.GPUs, func(g GPU) bool { return g.Kind == kind && g.Ordinal == n })
		if i < 0 {
			return m.split(func(NIC) bool { return true })
		}
		g := m.GPUs[i].Device
		for _, near := range []func(NIC) bool{
			func(c NIC) bool { return sameSwitch(g, c.Device) },
			func(c NIC) bool { return g.NUMA >= 0 && c.NUMA == g.NUMA },
			func(c NIC) bool { return g.Complex != "" && c.Complex == g.Complex },
		} {
			if t := m.split(near); len(t.Preferred) > 0 {
				return t
			}
		}
		if g.NUMA >= 0 {
			// The GPU's node has no NIC: every NIC is as far.
			return m.split(func(NIC) bool { return false })
		}
	}
	return m.split(func(NIC) bool { return true })
}

func (m *Machine) split(near func(NIC) bool) Tiers {
	t := Tiers{Preferred: []string{}, Others: []string{}}
	for _, c := range m.NICs {
		if near(c) {
			t.Preferred = append(t.Preferred, c.Name)
		} else {
			t.Others = append(t.Others, c.Name)
		}
	}
	return t
}

// Locations lists the memory locations of the machine: "cpu:N" per NUMA
// node ("cpu:0" when sysfs lists none), then KIND:N per GPU.
func (m *Machine) Locations() []string {
	var out []string
	for _, n := range m.Nodes {
		out = append(out, "cpu:"+strconv.Itoa(n))
	}
	if len(m.Nodes) == 0 {
		out = append(out, "cpu:0")
	}
	for _, g := range m.GPUs {
		out = append(out, g.Kind+":"+strconv.Itoa(g.Ordinal))
	}
	return out
}

// Matrix is Mooncake's topology JSON: each location maps to [preferred
// NICs, other NICs].
type Matrix map[string][2][]string

// Matrix returns the tiers of every location.
func (m *Machine) Matrix() Matrix {
	out := Matrix{}
	for _, loc := range m.Locations() {
		t := m.Near(loc)
		out[loc] = [2][]string{t.Preferred, t.Others}
	}
	return out
}

// JSON encodes the matrix (keys sorted, empty tiers as []).
func (x Matrix) JSON() ([]byte, error) {
	b, err := json.Marshal(map[string][2][]string(x))
	if err != nil {
		return nil, errs.Wrap(errs.Internal, "topo", err, "encode the topology")
	}
	return b, nil
}
