// Package local is the transport between engines of one process: the owner's
// registry checks the access, then a memcpy moves the bytes.
package local

import (
	"sync"

	"github.com/tecache/te/engine/errs"
	"github.com/tecache/te/engine/segment"
	"github.com/tecache/te/engine/transport"
	"github.com/tecache/te/internal/sys/mem"
)

// Name is the transport's name.
const Name = "local"

func init() {
	transport.RegisterFactory(Name, func() (transport.Transport, error) { return &Transport{}, nil })
}

// engines maps an engine instance to its registry, for every engine of this
// process that installed the local transport.
var (
	mu      sync.RWMutex
	engines = map[string]*segment.Registry{}
)

// Transport is the local (same-process) transport.
type Transport struct {
	instance string
}

// Name returns "local".
func (t *Transport) Name() string { return Name }

// Caps declares the transport's reach and the memory it moves.
func (t *Transport) Caps() transport.Caps {
	return transport.Caps{SameProcess: true, HostMemory: true}
}

// Start records the engine's registry so other engines of this process can
// reach it.
func (t *Transport) Start(h transport.Host) error {
	t.instance = h.Instance()
	mu.Lock()
	engines[t.instance] = h.Registry()
	mu.Unlock()
	return nil
}

// Describe adds nothing: the instance id already identifies the engine.
func (t *Transport) Describe(*segment.Desc) {}

// Register needs no per-transport state.
func (t *Transport) Register(*segment.Region) error { return nil }

// Unregister needs no per-transport state.
func (t *Transport) Unregister(*segment.Region) error { return nil }

// Reachable reports whether the peer is an engine of this process.
func (t *Transport) Reachable(d *segment.Desc) error {
	mu.RLock()
	_, ok := engines[d.Instance]
	mu.RUnlock()
	if !ok {
		return errs.New(errs.TransportUnavailable, "local", "segment %q is not in this process", d.Name)
	}
	return nil
}

// Submit copies synchronously: a memcpy is faster than handing it off.
func (t *Transport) Submit(reqs []*transport.Request) {
	for _, r := range reqs {
		r.Done(t.do(r))
	}
}

func (t *Transport) do(r *transport.Request) error {
	mu.RLock()
	reg := engines[r.Peer.Instance]
	mu.RUnlock()
	if reg == nil {
		return errs.New(errs.PeerUnreachable, "local", "segment %q has closed", r.Peer.Name)
	}
	// The owner's registry decides, with the key of the registration the
	// descriptor was built from: a stale descriptor is refused.
	region, err := reg.Acquire(r.Remote, r.Length, r.Buffer.Key, true)
	if err != nil {
		return err
	}
	defer region.Release()
	if r.Op == transport.Write {
		mem.Copy(r.Remote, r.Local, r.Length)
	} else {
		mem.Copy(r.Local, r.Remote, r.Length)
	}
	return nil
}

// Close makes this engine unreachable to others.
func (t *Transport) Close() error {
	mu.Lock()
	delete(engines, t.instance)
	mu.Unlock()
	return nil
}
