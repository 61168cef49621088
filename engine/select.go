package engine

import (
	"errors"
	"strings"
	"time"

	"github.com/tecache/te/engine/segment"
	"github.com/tecache/te/engine/transport"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/sys/gpu"
)

// Transport selection: one function, pick, chooses the transport of every
// request from what the installed transports declare (transport.Caps, the
// optional abilities of package transport) and from what the peer's
// descriptor offers. The engine names no transport: a new one takes part by
// declaring its rank, the memory it moves and its reach.

// memClass is the memory a request touches: host memory at both ends, GPU
// memory at one end or both, or a storage buffer (a registered file) at the
// target, from host or GPU memory.
type memClass uint8

const (
	hostMem memClass = iota
	deviceMem
	storageMem
	numMemClasses
)

func (c memClass) String() string {
	switch c {
	case deviceMem:
		return "gpu"
	case storageMem:
		return "file"
	}
	return "host"
}

// pickCache remembers the transport chosen for host memory under one
// descriptor, so that the common case costs one atomic load per request. It
// holds while the descriptor, the engine's reach epoch (bumped when a
// transport's Reachable answer changes: transport.ReachNotifier) and, for a
// choice that passed better-ranked transports over, a short lease last: a
// passed-over transport may come back on its own (a cooldown ends).
type pickCache struct {
	desc  *segment.Desc
	epoch uint64
	until int64 // nanotime after which the choice is made again; 0: never
	t     transport.Transport
	err   error
}

// rechoose is how long a choice that passed a better-ranked transport over
// is kept before that transport is asked again.
const rechoose = time.Second

func (e *Engine) cachedPick(st *segState, d *segment.Desc, win int) *pickCache {
	pc := st.pick[win].Load()
	if pc == nil || pc.desc != d || pc.epoch != e.reachEpoch.Load() || (pc.until != 0 && time.Now().UnixNano() > pc.until) {
		return nil
	}
	return pc
}

func (e *Engine) cachePick(st *segState, d *segment.Desc, win int, t transport.Transport, err error, passedOver bool) {
	pc := &pickCache{desc: d, epoch: e.reachEpoch.Load(), t: t, err: err}
	if passedOver {
		pc.until = time.Now().Add(rechoose).UnixNano()
	}
	st.pick[win].Store(pc)
}

// route is what served one memory class of a segment last, and why the
// transports ranked before it did not.
type route struct {
	transport string
	why       []string
}

// isDevice reports whether a published buffer name is a GPU location
// (KIND:N of any runtime).
func isDevice(name string) bool {
	kind, _, _ := strings.Cut(name, ":")
	return gpu.IsDevice(kind)
}

// errUnenforced is the cause of a refusal of a request under a window that
// only transports unable to enforce one could carry.
var errUnenforced = errors.New("no transport that enforces windows reaches the peer")

// pick chooses the transport for request r from local to buf of the segment
// described by d: the lowest-ranked installed transport that the peer also
// has, that moves the memory at both ends and that reaches the peer. The
// request's Transport or Config.ForceTransport narrows the choice to one
// transport, which must then qualify. A request under a window goes only to
// a transport that enforces windows (Caps.Windows): over another the
// owner's check, and the fence of revoking the window, would not hold.
func (e *Engine) pick(st *segState, d *segment.Desc, buf *segment.BufferDesc, local *segment.Region, r *Request) (transport.Transport, error) {
	localDev := gpu.IsDevice(local.Location.Kind)
	class := hostMem
	switch {
	case local.Storage != nil:
		return nil, errs.New(errs.NotSupported, "submit",
			"local [%#x,+%d) is a registered file: the local side of a request must be memory", r.Local, r.Length)
	case buf.Name == LocationFile:
		class = storageMem
	case localDev || isDevice(buf.Name):
		class = deviceMem
	}
	hint := r.Transport
	if hint == "" {
		hint = e.cfg.ForceTransport
	}
	win := 0
	if r.Window != 0 {
		win = 1
	}
	if class == hostMem && hint == "" {
		if pc := e.cachedPick(st, d, win); pc != nil {
			return pc.t, pc.err
		}
	}
	var why []string
	perBuffer := false  // the choice depends on the buffer: not cached per descriptor
	unenforced := false // a transport that would serve was passed over for the window
	for _, t := range e.transports {
		if hint != "" && t.Name() != hint {
			continue
		}
		if _, ok := t.(transport.BufferReacher); ok {
			perBuffer = true
		}
		if reason := qualifies(t, d, buf, local, class); reason != "" {
			why = append(why, t.Name()+": "+reason)
			continue
		}
		if win == 1 && !t.Caps().Windows {
			why = append(why, t.Name()+": it cannot enforce a window (the owner does not check each access over it)")
			unenforced = true
			continue
		}
		if class == hostMem && hint == "" && !perBuffer {
			e.cachePick(st, d, win, t, nil, len(why) > 0)
		}
		e.noteRoute(st, class, t.Name(), why)
		return t, nil
	}
	var err *errs.Error
	switch {
	case hint != "" && e.byName[hint] == nil:
		return nil, errs.New(errs.TransportUnavailable, "submit", "transport %q is not installed", hint)
	case unenforced:
		// Never the buffer's own key in the window's place: the owner
		// granted part of it, and its revoke would not fence this.
		err = errs.Wrap(errs.NotSupported, "submit", errUnenforced,
			"request under window %#x to segment %q: %s", r.Window, d.Name, strings.Join(why, "; ")).
			WithHint("windows are enforced by local, shm, cxl and tcp (Stats().Caps[...].Windows); install one both sides share")
	case hint != "" && class == storageMem:
		err = errs.New(errs.NotSupported, "submit", "transport %s cannot move bytes to the file buffer %#x of %q: %s",
			hint, r.Remote, d.Name, strings.Join(why, "; "))
	case class == storageMem:
		err = errs.New(errs.TransportUnavailable, "submit", "no installed transport moves %s memory to the file buffer %#x of segment %q: %s",
			map[bool]string{true: "GPU", false: "host"}[localDev], r.Remote, d.Name, strings.Join(why, "; ")).
			WithHint("this process's files need the file transport; a peer's files need tcp on both sides")
	case hint != "" && class == deviceMem:
		err = errs.New(errs.NotSupported, "submit", "transport %s cannot move GPU memory (local %#x, remote %s at %#x): %s",
			hint, r.Local, buf.Name, r.Remote, strings.Join(why, "; "))
	case class == deviceMem:
		err = errs.New(errs.NotSupported, "submit",
			"no installed transport moves GPU memory between this engine and segment %q (local %#x, remote %s): %s",
			d.Name, r.Local, buf.Name, strings.Join(why, "; ")).
			WithHint("GPU memory moves through GPU IPC between engines of one host, through NICs that registered " +
				"the buffer, or staged through pinned host memory when its runtime loads on both sides; Stats().Caps says what " +
				"each installed transport moves")
	default:
		err = errs.New(errs.TransportUnavailable, "submit", "no transport reaches segment %q: %s", d.Name, strings.Join(why, "; "))
	}
	if class == hostMem && hint == "" && !perBuffer {
		e.cachePick(st, d, win, nil, err, true)
	}
	return nil, err
}

// qualifies says why t cannot serve a request of class to buf of d, or ""
// when it can.
func qualifies(t transport.Transport, d *segment.Desc, buf *segment.BufferDesc, local *segment.Region, class memClass) string {
	if !d.HasTransport(t.Name()) {
		return "the peer does not have it"
	}
	caps := t.Caps()
	switch class {
	case hostMem:
		if !caps.HostMemory || caps.StorageOnly {
			return "it does not move host memory"
		}
		if br, ok := t.(transport.BufferReacher); ok && !br.ReachesBuffer(d, buf) {
			return "the target buffer is not in memory it shares with the peer"
		}
	case storageMem:
		if !caps.FileMemory {
			return "it does not move files"
		}
		if gpu.IsDevice(local.Location.Kind) {
			dm, ok := t.(transport.DeviceMover)
			if !caps.GPUMemory || !ok || !dm.DeviceMemory(d, buf, local) {
				return "it cannot move GPU memory to a file"
			}
		}
	case deviceMem:
		dm, ok := t.(transport.DeviceMover)
		if !caps.GPUMemory || !ok || caps.StorageOnly {
			return "it does not move GPU memory"
		}
		if !dm.DeviceMemory(d, buf, local) {
			return "it cannot move this GPU buffer (not registered with it, or the peer lacks its GPU runtime)"
		}
	}
	if err := t.Reachable(d); err != nil {
		return err.Error()
	}
	return ""
}

// noteRoute records what served class for st and logs it at debug level
// when it changed, with the reasons the better-ranked transports were
// passed over.
func (e *Engine) noteRoute(st *segState, class memClass, name string, why []string) {
	if old := st.route[class].Load(); old != nil && old.transport == name {
		return
	}
	st.route[class].Store(&route{transport: name, why: why})
	e.cfg.Logger.Debug("te: transport chosen", "segment", st.name, "memory", class.String(), "transport", name,
		"passed_over", why)
}

// Route is the transport that served one memory class of an open segment
// last, and why the transports ranked before it did not.
type Route struct {
	Segment   string   `json:"segment"`
	Memory    string   `json:"memory"` // "host" or "gpu"
	Transport string   `json:"transport"`
	Why       []string `json:"why,omitempty"`
}

// routes lists the routes of the open segments.
func (e *Engine) routes() []Route {
	e.segMu.Lock()
	defer e.segMu.Unlock()
	var out []Route
	for _, st := range e.segs {
		for c := range numMemClasses {
			if r := st.route[c].Load(); r != nil {
				out = append(out, Route{Segment: st.name, Memory: c.String(), Transport: r.transport, Why: r.why})
			}
		}
	}
	return out
}
