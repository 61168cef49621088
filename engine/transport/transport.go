package transport

import (
	"context"
	"sort"
	"sync"

	"github.com/tecache/te/engine/segment"
)

// Opcode is READ or WRITE, numbered as in Mooncake.
type Opcode uint8

const (
	// Read copies from the target segment into local memory.
	Read Opcode = 0
	// Write copies local memory into the target segment.
	Write Opcode = 1
)

func (o Opcode) String() string {
	switch o {
	case Read:
		return "read"
	case Write:
		return "write"
	}
	return "opcode(?)"
}

// Request is one validated transfer handed to a transport: the local range is
// registered and the target range lies inside Buffer of Peer's descriptor.
type Request struct {
	Op     Opcode
	Local  uint64 // local address
	Remote uint64 // target address (the remote virtual address for RAM segments)
	Length uint64
	Peer   *segment.Desc       // descriptor the request was validated against
	Buffer *segment.BufferDesc // the target buffer inside Peer
	// Done is called exactly once, from any goroutine, when the transfer
	// ended: nil means every byte arrived (for WRITE: is in the target's
	// memory). Transports must call it for every request they accepted, also
	// when they are closed.
	Done func(err error)
}

// Control is the engine's control plane as seen by a transport: handlers for
// its own message kinds and calls to a peer's RPC address.
type Control interface {
	// Handle installs the handler for kind (transports use kinds from
	// wire.KindTransportBase up).
	Handle(kind uint8, h func(ctx context.Context, body []byte) ([]byte, error))
	// Call sends body to the peer at rpcAddr and waits for the reply.
	Call(ctx context.Context, rpcAddr string, kind uint8, body []byte) ([]byte, error)
}

// Host is what an engine gives its transports.
type Host interface {
	SegmentName() string
	Instance() string
	Registry() *segment.Registry
	Control() Control
	Logf(format string, args ...any)
	Param(key string) (string, bool) // transport parameters, e.g. "tcp.conns"
}

// Caps declares where a transport can reach and what memory it moves, so
// selection and users can tell transports apart without trying them.
type Caps struct {
	SameProcess bool `json:"same_process"` // engines of one process
	SameHost    bool `json:"same_host"`    // other processes on this host
	CrossHost   bool `json:"cross_host"`   // other hosts
	HostMemory  bool `json:"host_memory"`  // CPU memory
	GPUMemory   bool `json:"gpu_memory"`   // device memory (when CUDA loads)
}

// Transport moves bytes between registered local memory and a peer's
// registered memory. Implementations are safe for concurrent use.
type Transport interface {
	Name() string
	// Caps declares the transport's reach and the memory it moves.
	Caps() Caps
	// Start is called once before any other method.
	Start(h Host) error
	// Describe adds the transport's endpoints and identity to the local
	// descriptor before it is published.
	Describe(d *segment.Desc)
	// Register prepares r for this transport and may add keys to r.Desc. On
	// error the engine rolls back the transports already registered.
	Register(r *segment.Region) error
	// Unregister releases the transport's state for r; no access to r is in
	// flight when it is called.
	Unregister(r *segment.Region) error
	// Reachable says whether this transport can reach the peer described by
	// d; the error says why not.
	Reachable(d *segment.Desc) error
	// Submit starts the requests; each one's Done is called when it ends.
	Submit(reqs []*Request)
	// Close fails everything in flight (calling Done) and releases the
	// transport's goroutines, sockets and handles before it returns.
	Close() error
}

// Factory builds a transport.
type Factory func() (Transport, error)

// Preference orders transports when several can reach a peer.
var Preference = []string{"local", "shm", "cudaipc", "rdma", "tcp"}

var (
	factoriesMu sync.Mutex
	factories   = map[string]Factory{}
)

// RegisterFactory makes a transport available by name; transport packages call
// it from init.
func RegisterFactory(name string, f Factory) {
	factoriesMu.Lock()
	defer factoriesMu.Unlock()
	factories[name] = f
}

// Lookup returns the factory for name.
func Lookup(name string) (Factory, bool) {
	factoriesMu.Lock()
	defer factoriesMu.Unlock()
	f, ok := factories[name]
	return f, ok
}

// Names lists the registered transports in preference order.
func Names() []string {
	factoriesMu.Lock()
	defer factoriesMu.Unlock()
	out := make([]string, 0, len(factories))
	for n := range factories {
		out = append(out, n)
	}
	sort.Slice(out, func(i, j int) bool { return Rank(out[i]) < Rank(out[j]) })
	return out
}

// Rank is a transport's position in Preference (lower is preferred).
func Rank(name string) int {
	for i, p := range Preference {
		if p == name {
			return i
		}
	}
	return len(Preference)
}
