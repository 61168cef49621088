package shm

import (
	"github.com/tecache/te/engine/segment"
	"github.com/tecache/te/engine/transport"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/wire"
)

// Medium is how an initiator's bytes reach an owner's memory. shm's own
// medium is process_vm_readv/writev between processes of one host; another
// transport whose peers write into an owner's memory without the owner
// seeing each access (cxl: a mapping both share) brings its own medium and
// reuses this package's sessions, validation, revocation and leases, which
// are what make such an access safe to stop (design section 4).
type Medium interface {
	// Reach says whether the peer d describes is one this medium moves
	// bytes to (that it publishes a control address and instance is
	// checked before).
	Reach(self segment.HostID, d *segment.Desc) error
	// Admit says, on the owner side, whether a peer attaching from
	// (bootID, pidNS, pid) may start a session; local says whether that
	// pid names a process of this host (the owner then watches it exit).
	Admit(self segment.HostID, bootID, pidNS string, pid int) (local bool, err error)
	// Probe proves, at the first attach to the owner d, that this process
	// reaches its memory: probe is the address of the owner's token page.
	Probe(d *segment.Desc, probe uint64, token [16]byte) error
	// NewMover returns a mover for one goroutine.
	NewMover() Mover
}

// Mover copies spans to or from one owner. It is used by one goroutine at a
// time.
type Mover interface {
	// Move copies every span (write: Local -> Remote, else Remote ->
	// Local), where Remote is an address in the owner d. skip says whether
	// a span is to be left out (its request failed already); check runs
	// before each step and, when it returns an error, fails every span
	// left; fail is called once per span that does not arrive.
	Move(d *segment.Desc, write bool, spans []Span, skip func(int) bool, check func() error, fail func(i int, err error))
	// Counts returns the steps made (system calls, copies) and those that
	// stopped short, since the mover was made.
	Counts() (steps, short uint64)
}

// Spec names a transport built on this package's protocol with its own
// medium: its name, its caps, the control-plane kind its messages travel
// as (one per transport: both may be installed in one engine).
type Spec struct {
	Name   string
	Caps   transport.Caps
	Kind   uint8
	Medium Medium
	// WatchOwner: the medium still reaches an owner's memory after the
	// owner exits (a mapping both share, where shm's system calls would
	// fail with ESRCH), so before each job the initiator checks that an
	// owner of this host still runs (a pidfd polled once per job). An
	// owner on another host is noticed at the next lease renewal.
	WatchOwner bool
}

// NewWith returns a transport that runs shm's protocol over another medium.
// The engine calls Start as for shm.
func NewWith(s Spec) *Transport {
	t := New()
	t.spec = s
	return t
}

func shmSpec() Spec {
	return Spec{
		Name:   Name,
		Caps:   transport.Caps{SameHost: true, HostMemory: true, Windows: true, Rank: 10},
		Kind:   wire.KindShm,
		Medium: vmMedium{},
	}
}

// vmMedium is shm's own: process_vm_readv/writev to another process of this
// host and pid namespace.
type vmMedium struct{}

func (vmMedium) Reach(self segment.HostID, d *segment.Desc) error {
	h := d.Host
	switch {
	case h == nil:
		return errs.New(errs.TransportUnavailable, "shm", "segment %q publishes no host identity", d.Name)
	case h.BootID != self.BootID:
		return errs.New(errs.TransportUnavailable, "shm", "segment %q runs on another host (boot id differs)", d.Name)
	case h.PidNS != self.PidNS:
		return errs.New(errs.TransportUnavailable, "shm", "segment %q runs in another pid namespace", d.Name).
			WithHint("containers need a shared pid namespace for shm")
	case h.Pid == self.Pid:
		return errs.New(errs.TransportUnavailable, "shm", "segment %q is in this process (the local transport's job)", d.Name)
	case h.Pid <= 0:
		return errs.New(errs.TransportUnavailable, "shm", "segment %q publishes no pid", d.Name)
	}
	return nil
}

func (vmMedium) Admit(self segment.HostID, bootID, pidNS string, pid int) (bool, error) {
	switch {
	case bootID != self.BootID || pidNS != self.PidNS:
		return false, errs.New(errs.NotSupported, "shm attach", "peer is not on this host or not in this pid namespace")
	case pid == self.Pid || pid == 0:
		return false, errs.New(errs.InvalidArgument, "shm attach", "bad peer pid %d", pid)
	}
	return true, nil
}

func (vmMedium) Probe(d *segment.Desc, addr uint64, token [16]byte) error {
	return probe(d.Host.Pid, addr, token)
}

func (vmMedium) NewMover() Mover { return newVM() }

// Move moves the spans with process_vm_readv/writev to the owner's pid.
func (v *vm) Move(d *segment.Desc, write bool, spans []Span, skip func(int) bool, check func() error, fail func(i int, err error)) {
	v.move(d.Host.Pid, write, spans, skip, check, fail)
}

// Counts returns the system calls made and those the kernel stopped short.
func (v *vm) Counts() (uint64, uint64) { return v.calls, v.short }
