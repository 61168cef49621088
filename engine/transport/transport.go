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

// Request is one validated transfer handed to a transport: the local range
// lies in Region (held for the request by the engine) and the target range
// lies inside Buffer of Peer's descriptor.
//
// The engine owns the memory a Request lives in (a batch's slots), and it
// reuses it: once the request is completed, by anyone, the slot may be
// cleared (Batch.Reset) and filled with another request. So a transport
// touches a Request only while it holds it, and holds it only through state
// of its own:
//
//   - In Submit it copies what it needs later (at least the Ticket) into its
//     own per-request state, and may set Priv to point at that state.
//   - Whoever ends the request (the goroutine moving it, Cancel, Close) first
//     claims that state (a compare-and-swap, a queue it removes it from);
//     only the winner reads the Request, and only until it calls Complete.
//   - Completion goes through the Ticket kept in the state, never through a
//     slot read after the fact: a slot read late belongs to the next request.
//
// The Ticket's generation makes a late or duplicate completion harmless to
// the engine (it is dropped and counted), but only a transport that keeps
// the ticket it was given can be told apart from the slot's next owner.
type Request struct {
	Op     Opcode
	Local  uint64 // local address
	Remote uint64 // target address (the remote virtual address for RAM segments)
	Length uint64
	Peer   *segment.Desc       // descriptor the request was validated against
	Buffer *segment.BufferDesc // the target buffer inside Peer
	// Key is the capability the owner checks: Buffer.Key, or the key of
	// a window the owner granted over part of the buffer.
	Key uint64
	// Region is the registered local region holding [Local, Local+Length),
	// acquired by the engine until the request completes: transports take
	// its location and keys from here instead of looking it up again.
	Region *segment.Region
	// Owner is told when the request ends, as Owner.Complete(Index, Gen,
	// err); Ticket returns the three together.
	Owner Completer
	Index int
	// Gen is this submission's generation: a completion carrying another
	// generation is not this request's and is dropped.
	Gen uint64
	// Priv is the transport's own per-request state (set in Submit, read
	// in Cancel); the engine never looks at it.
	Priv any
}

// Ticket returns what completes r: kept by the transport from Submit on, it
// completes this submission of r and no later one.
func (r *Request) Ticket() Ticket { return Ticket{Owner: r.Owner, Index: r.Index, Gen: r.Gen} }

// Complete ends r through its slot: for a transport that still holds r
// (Submit's own goroutine refusing it, or the claimed owner of its state).
// Anything that completes later completes through the Ticket it kept.
func (r *Request) Complete(err error) { r.Owner.Complete(r.Index, r.Gen, err) }

// Ticket names one submission of a request: who is told its outcome, the
// request's index there, and the submission's generation. It is a value:
// a transport copies it into its own state in Submit.
type Ticket struct {
	Owner Completer
	Index int
	Gen   uint64
}

// Complete reports the outcome of the submission t names.
func (t Ticket) Complete(err error) { t.Owner.Complete(t.Index, t.Gen, err) }

// Completer receives the outcome of requests.
type Completer interface {
	// Complete reports that request index of generation gen ended: err nil
	// means every byte arrived (for a WRITE: is in the target's memory).
	// It is called exactly once per request, from any goroutine, and only
	// once the transport will never touch the request's local memory again
	// nor send more of its bytes: a terminal task state is a fence. It must
	// not block. A completion whose generation is not the request's
	// current one (late, duplicated) is ignored.
	Complete(index int, gen uint64, err error)
}

// DoneFunc adapts a function of the outcome alone to Completer, for requests
// whose Index does not matter (tools, tests).
type DoneFunc func(err error)

// Complete calls f(err).
func (f DoneFunc) Complete(_ int, _ uint64, err error) { f(err) }

// CompleteFunc adapts a function of the index and outcome to Completer.
type CompleteFunc func(index int, err error)

// Complete calls f(index, err).
func (f CompleteFunc) Complete(index int, _ uint64, err error) { f(index, err) }

// Control is the engine's control plane as seen by a transport: handlers for
// its own message kinds and calls to a peer's RPC address.
type Control interface {
	// Handle installs the handler for kind (transports use kinds from
	// wire.KindTransportBase up).
	Handle(kind uint8, h func(ctx context.Context, body []byte) ([]byte, error))
	// Call sends body to the peer at rpcAddr and waits for the reply.
	Call(ctx context.Context, rpcAddr string, kind uint8, body []byte) ([]byte, error)
}

// callerKey is the context key of the caller of a control call.
type callerKey struct{}

// WithCaller returns ctx carrying the engine a control call comes from (the
// engine sets it before a transport's handler runs).
func WithCaller(ctx context.Context, c segment.Caller) context.Context {
	return context.WithValue(ctx, callerKey{}, c)
}

// CallerOf returns the engine a control call comes from, as its session
// proved it: Known only when the engine has the cluster secret. A handler
// that acts on an instance or segment named in the body checks it against
// this one when it is Known, and uses it for windows (segment.Caller).
func CallerOf(ctx context.Context) segment.Caller {
	c, _ := ctx.Value(callerKey{}).(segment.Caller)
	return c
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
	// Windows: the owner checks every access's key itself, so a window
	// key (segment.Window) is honoured and revoking it is a fence. A
	// transport without it is sent the buffer's own key instead.
	Windows bool `json:"windows"`
	// Rank orders the transports that can all serve a request: the lowest
	// wins, equal ranks go by name. The standard transports rank by how
	// directly they move bytes: local 0 (memcpy in one process), file 5
	// (this process's files: the kernel's I/O), shm 10 (one kernel copy),
	// cudaipc 20 (the GPU's copy engines), rdma 30 (the NIC, no CPU), tcp
	// 40 (sockets).
	Rank int `json:"rank"`
	// FileMemory: the transport moves bytes to and from storage buffers
	// (registered file ranges, segment.Region.Storage) without touching
	// their addresses. Requests whose target is a storage buffer go only
	// to such transports, and storage regions are registered only with
	// them.
	FileMemory bool `json:"file_memory"`
	// StorageOnly: the transport moves bytes only between memory and
	// storage buffers (the file transport); memory-to-memory requests go
	// elsewhere.
	StorageOnly bool `json:"storage_only"`
}

// FileSpec is a file range to register as a storage region.
type FileSpec struct {
	Path string // opened by the engine; "" when FD is given
	FD   int    // an open descriptor of the caller (duplicated), or -1
	// Offset and Length are the range of the file; Length 0 means up to
	// the file's current end.
	Offset, Length uint64
	// Create makes the file if missing and extends it to hold the range.
	Create bool
	// ReadOnly refuses writes; NoDirect keeps every I/O buffered.
	ReadOnly, NoDirect bool
}

// FileOpener is implemented by the transport that opens storage regions for
// the engine (an optional ability): OpenFile returns the storage and the
// range's length.
type FileOpener interface {
	OpenFile(spec FileSpec) (segment.Storage, uint64, error)
}

// Optional abilities. A transport declares each by implementing its
// interface; the engine asks for them by type, never by name.

// DeviceMover is implemented by transports that can move GPU memory.
// DeviceMemory reports whether the transport can serve a request from the
// local region local (device memory or not: local.Location) to buf of the
// segment d (a device buffer or not). A transport that stages through host memory answers
// true for every peer it reaches; one that needs a registration of the
// buffer (an RDMA NIC's memory region) answers for that buffer.
type DeviceMover interface {
	DeviceMemory(d *segment.Desc, buf *segment.BufferDesc, local *segment.Region) bool
}

// BufferReacher is implemented by transports that reach only some of a
// peer's buffers: cxl, those inside the device both engines mapped.
// Selection asks ReachesBuffer for the target buffer of each request, and
// the engine keeps a local region registered with its other transports
// when such a transport refuses it with NotSupported (a range outside its
// mapping).
type BufferReacher interface {
	ReachesBuffer(d *segment.Desc, buf *segment.BufferDesc) bool
}

// SharedMemory is implemented by transports that serve memory from a
// mapping they made (cxl's device): Memory returns where it lies in this
// process and its size, for applications to allocate buffers from.
type SharedMemory interface {
	Memory() (addr, size uint64)
}

// ReachNotifier is implemented by the engine's Host: a transport whose
// Reachable answer for a peer changes on its own (a peer's NICs failing and
// cooling down) calls ReachChanged, so that choices the engine cached on the
// old answer are made again at the next request.
type ReachNotifier interface {
	ReachChanged()
}

// StatsReporter is implemented by transports that keep counters of their
// own (attachments, rails, refusals); the engine reports them by transport.
type StatsReporter interface {
	Stats() map[string]uint64
}

// Live is what a transport holds for its peers now: gauges, not counters,
// that fall back when a peer goes (closes, dies, restarts under its name),
// so that growth with peers that come and go is a leak (LiveReporter).
type Live struct {
	// Peers is the peers the transport holds connections or endpoints for
	// (tcp: the peer addresses in its pool; rdma, fabric: the peer engine
	// instances its endpoints reach).
	Peers int `json:"peers"`
	// ConnsDialed and ConnsAccepted are the connections open now that this
	// side opened to peers, and that peers opened to it.
	ConnsDialed   int `json:"conns_dialed"`
	ConnsAccepted int `json:"conns_accepted"`
	// Endpoints is the endpoints open now (rdma: a NIC pair to a peer
	// instance, initiating or accepting; fabric: a NIC pair to a peer),
	// QueuePairs the verbs queue pairs they hold.
	Endpoints  int `json:"endpoints"`
	QueuePairs int `json:"queue_pairs"`
}

// LiveReporter is implemented by transports that hold per-peer resources
// (connections, endpoints, queue pairs); the engine reports them by
// transport (Stats.Live, te_metrics).
type LiveReporter interface {
	Live() Live
}

// TopologyReporter is implemented by transports that place NICs near memory
// (rdma): Topology is Mooncake's topology matrix, for every memory location
// ("cpu:N", "cuda:N") the NICs near it and the others.
type TopologyReporter interface {
	Topology() map[string][2][]string
}

// Warmer is implemented by transports that connect to a peer ahead of its
// first request: Warmup makes what a request to peer would set up on first
// use (connections, their handshakes and session keys, queue pairs) and
// returns once it is up, or with why not. It is bounded by ctx and by the
// transport's own connect and handshake timeouts; what is already up costs
// nothing, so calling it again is cheap.
type Warmer interface {
	Warmup(ctx context.Context, peer *segment.Desc) error
}

// Harvester is implemented by transports whose completions a waiter may
// collect on its own goroutine (rdma: polling the NICs' completion queues),
// which spares the hand-off from the transport's poller to the waiter when
// completions come fast. Harvest collects what completes until done is
// closed or its own budget ends, without blocking on anything else; the
// engine calls it from Batch.Wait for small batches, before it blocks.
type Harvester interface {
	Harvest(done <-chan struct{})
}

// WindowRevoker is implemented by transports whose peers reach memory without
// the owner checking each access (shm): RevokeWindow makes every peer stop
// using the window r belongs to, and returns once none can.
type WindowRevoker interface {
	RevokeWindow(r *segment.Region) error
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
	// Unregister releases the transport's state for r. The engine calls it
	// once r refuses new accesses and Quiesce returned; a transport whose
	// peers reach r without the owner counting each access (shm's
	// process_vm_writev, an RDMA NIC) fences them here: when it returns
	// nil, no peer can touch r through it any more.
	Unregister(r *segment.Region) error
	// Reachable says whether this transport can reach the peer described by
	// d; the error says why not.
	Reachable(d *segment.Desc) error
	// Submit starts the requests and returns without waiting for them (a
	// small copy may run inline); each one is completed through its Owner.
	Submit(reqs []Request)
	// Cancel asks the transport to end reqs (submitted earlier, maybe
	// already completed) early: those still running are completed, with
	// errs.Canceled or their real outcome, as soon as nothing of them can
	// touch local memory or send bytes any more (cut the connection or
	// queue pair carrying them if need be). Cancel may return before
	// then; it does not block on the network. The requests stay unchanged
	// for the call (the engine resets no slot meanwhile), but Cancel keeps
	// none of them: it reaches what it ends through their Priv.
	Cancel(reqs []*Request)
	// Quiesce ends the accesses to r that this transport serves for peers
	// (r is being unregistered: new ones are already refused). It returns
	// once none is in flight, cutting the connections or queue pairs that
	// carry them, or with an error if it cannot guarantee that.
	Quiesce(r *segment.Region) error
	// Close fails everything in flight (completing it) and releases the
	// transport's goroutines, sockets and handles before it returns; no
	// request is touched after.
	Close() error
}

// Factory builds a transport.
type Factory func() (Transport, error)

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

// Names lists the registered transports, by name.
func Names() []string {
	factoriesMu.Lock()
	defer factoriesMu.Unlock()
	out := make([]string, 0, len(factories))
	for n := range factories {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}
