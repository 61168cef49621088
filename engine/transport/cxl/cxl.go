package cxl

import (
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/tecache/te/engine/segment"
	"github.com/tecache/te/engine/transport"
	"github.com/tecache/te/engine/transport/shm"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/sys/mem"
	"github.com/tecache/te/internal/wire"
)

// Name is the transport's name.
const Name = "cxl"

func init() {
	transport.RegisterFactory(Name, func() (transport.Transport, error) { return New(Config{}), nil })
}

// Transport is the cxl transport: shm's session, validation, revocation and
// lease protocol over a mapping every peer shares, where a transfer is a
// memcpy. It is safe for concurrent use.
type Transport struct {
	*shm.Transport
	cfg      Config
	med      *medium
	released sync.Once
}

// New returns an unstarted transport for the device c names; zero fields
// come from the environment and the engine's params ("cxl.device",
// "cxl.size", "cxl.id") in Start.
func New(c Config) *Transport {
	med := &medium{}
	t := &Transport{cfg: c, med: med}
	t.Transport = shm.NewWith(shm.Spec{
		Name: Name,
		// Every engine that maps the device, in this process, on this
		// host or on another host the device is shared with. Below shm:
		// one memcpy, no system call.
		Caps:   transport.Caps{SameProcess: true, SameHost: true, CrossHost: true, HostMemory: true, Windows: true, Rank: 8},
		Kind:   wire.KindCXL,
		Medium: med,
		// The device keeps an exited owner's bytes: a write there
		// would "complete" into memory nobody owns any more.
		WatchOwner: true,
	})
	return t
}

// Name returns "cxl".
func (t *Transport) Name() string { return Name }

// Start maps the device (once per process: engines naming one device share
// the mapping) and starts the protocol. Without a device it fails, and the
// engine goes on without cxl.
func (t *Transport) Start(h transport.Host) error {
	c := t.cfg
	env := FromEnv()
	if v, ok := h.Param("cxl.device"); ok && c.Path == "" {
		c.Path = v
	}
	if v, ok := h.Param("cxl.size"); ok && c.Size == 0 {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil || n == 0 {
			return errs.New(errs.InvalidArgument, "cxl", "cxl.size=%q is not a byte count", v)
		}
		c.Size = n
	}
	if v, ok := h.Param("cxl.id"); ok && c.ID == "" {
		c.ID = v
	}
	if c.Path == "" {
		c.Path = env.Path
	}
	if c.Size == 0 {
		c.Size = env.Size
	}
	if c.ID == "" {
		c.ID = env.ID
	}
	m, err := open(c)
	if err != nil {
		return err
	}
	t.med.m = m
	if err := t.Transport.Start(h); err != nil {
		m.release()
		t.med.m = nil
		return err
	}
	return nil
}

// Memory returns where the device is mapped in this process and its size:
// applications allocate the buffers they register with cxl from it
// (transport.SharedMemory).
func (t *Transport) Memory() (addr, size uint64) {
	if m := t.med.m; m != nil {
		return m.base, m.size
	}
	return 0, 0
}

// Describe publishes the host identity (for the protocol) and the device:
// Mooncake's cxl_name and cxl_base_addr, te's identity and size.
func (t *Transport) Describe(d *segment.Desc) {
	t.Transport.Describe(d)
	if m := t.med.m; m != nil {
		d.CXLName, d.CXLBase, d.CXLID, d.CXLSize = m.path, m.base, m.id, m.size
	}
}

// Register accepts host memory inside the mapping only, and records the
// buffer's offset in the device (Mooncake's "offset"). Other ranges are
// refused with NotSupported: the engine keeps them registered with its
// other transports, which serve them (transport.BufferReacher).
func (t *Transport) Register(r *segment.Region) error {
	m := t.med.m
	switch {
	case m == nil:
		return errs.New(errs.NotSupported, "cxl", "no CXL device mapped")
	case r.Storage != nil || r.Location.Kind != "cpu":
		return errs.New(errs.NotSupported, "cxl", "[%#x,+%d) is %s memory: cxl moves only the shared mapping's", r.Addr, r.Length, r.Location)
	case !m.inside(r.Addr, r.Length):
		return errs.New(errs.NotSupported, "cxl", "[%#x,+%d) is outside the CXL mapping [%#x,+%d) of %s", r.Addr, r.Length, m.base, m.size, m.path).
			WithHint("allocate the buffer from Engine.CXLMemory (te_cxl_memory)")
	}
	r.Desc.Offset = r.Addr - m.base
	return t.Transport.Register(r)
}

// ReachesBuffer says whether buf of d lies in the device this engine mapped.
func (t *Transport) ReachesBuffer(d *segment.Desc, buf *segment.BufferDesc) bool {
	m := t.med.m
	if m == nil || !t.med.same(d) {
		return false
	}
	off := buf.Addr - d.CXLBase
	return buf.Addr >= d.CXLBase && off+buf.Length >= off && off+buf.Length <= m.size
}

// Close stops the protocol (no copy runs after it) and unmaps the device
// when no other engine of the process uses it.
func (t *Transport) Close() error {
	err := t.Transport.Close()
	// The mapping stays known (selection may still ask about a buffer,
	// with no copy to follow: none runs after shm's Close); only the
	// reference goes, once.
	if m := t.med.m; m != nil {
		t.released.Do(m.release)
	}
	return err
}

// medium is the shm.Medium of cxl: peers reached through the mapping.
type medium struct {
	m *mapping
}

// same reports whether d mapped the device we mapped.
func (md *medium) same(d *segment.Desc) bool {
	m := md.m
	if m == nil || d.CXLName == "" {
		return false
	}
	if d.CXLID != "" {
		return d.CXLID == m.id
	}
	return d.CXLName == m.path // a Mooncake descriptor names the path only
}

func (md *medium) Reach(_ segment.HostID, d *segment.Desc) error {
	m := md.m
	switch {
	case m == nil:
		return errs.New(errs.TransportUnavailable, "cxl", "no CXL device mapped here")
	case d.CXLName == "":
		return errs.New(errs.TransportUnavailable, "cxl", "segment %q maps no CXL device", d.Name)
	case !md.same(d):
		return errs.New(errs.TransportUnavailable, "cxl", "segment %q maps another CXL device (%s, %s; here %s, %s)", d.Name, d.CXLName, d.CXLID, m.path, m.id)
	case d.CXLSize != 0 && d.CXLSize != m.size:
		return errs.New(errs.TransportUnavailable, "cxl", "segment %q maps %d bytes of the device, this engine %d", d.Name, d.CXLSize, m.size)
	}
	return nil
}

func (md *medium) Admit(self segment.HostID, bootID, pidNS string, pid int) (bool, error) {
	if pid <= 0 {
		return false, errs.New(errs.InvalidArgument, "cxl attach", "bad peer pid %d", pid)
	}
	// A peer on another host shares the device, not the pids.
	return bootID == self.BootID && pidNS == self.PidNS && pid != self.Pid, nil
}

// Probe has nothing to read: the descriptor's device identity is the proof,
// and the owner validates every key before a copy starts.
func (md *medium) Probe(*segment.Desc, uint64, [16]byte) error { return nil }

func (md *medium) NewMover() shm.Mover { return &mover{md: md} }

// chunk is the most one memcpy moves before the mover checks the lease and
// Close again.
const chunk = 4 << 20

// fence orders every store of a copy before what follows it (the
// completion, and a notify sent after it): an atomic read-modify-write is
// a full barrier (LOCK-prefixed on amd64, a sequentially consistent
// exclusive pair on arm64), which also drains the non-temporal stores
// Go's memmove uses for large copies, after its own SFENCE.
var fence atomic.Uint64

type mover struct {
	md    *medium
	steps uint64
}

func (v *mover) Counts() (uint64, uint64) { return v.steps, 0 }

// Move copies each span between local memory and this process's view of
// the owner's buffer: the owner's address less its base is the offset in the
// device, and that offset from our base is the same memory.
func (v *mover) Move(d *segment.Desc, write bool, spans []shm.Span, skip func(int) bool, check func() error, fail func(int, error)) {
	m := v.md.m
	defer fence.Add(1)
	for i, s := range spans {
		if skip(i) {
			continue
		}
		off := s.Remote - d.CXLBase
		if m == nil || s.Remote < d.CXLBase || off+s.N < off || off+s.N > m.size {
			fail(i, errs.New(errs.AddressNotRegistered, "cxl", "[%#x,+%d) of segment %q is outside its CXL mapping", s.Remote, s.N, d.Name))
			continue
		}
		at := m.base + off
		for done := uint64(0); done < s.N; {
			if err := check(); err != nil {
				for ; i < len(spans); i++ {
					if !skip(i) {
						fail(i, err)
					}
				}
				return
			}
			n := min(chunk, s.N-done)
			if write {
				mem.Copy(at+done, s.Local+done, n)
			} else {
				mem.Copy(s.Local+done, at+done, n)
			}
			done += n
			v.steps++
		}
	}
}
