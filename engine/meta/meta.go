package meta

import (
	"context"
	"encoding/json"
	"strings"
	"sync"

	"github.com/tecache/te/internal/errs"
)

// P2PHandshake is the default connection string: no metadata server; a segment
// is named host:port after its engine's RPC listener and descriptors are
// fetched from the peer itself.
const P2PHandshake = "P2PHANDSHAKE"

// Store is a key-value metadata service (etcd, the HTTP metadata protocol,
// redis). Get returns an error with code NotFound for a missing key.
type Store interface {
	Get(ctx context.Context, key string) ([]byte, error)
	Put(ctx context.Context, key string, value []byte) error
	Delete(ctx context.Context, key string) error
	Close() error
}

// Keys as Mooncake writes them, so either engine finds the other's segments.
func KeyRAM(segment string) string { return "mooncake/ram/" + segment }

// KeyRPC is the key of a segment's RPC endpoint record.
func KeyRPC(segment string) string { return "mooncake/rpc_meta/" + segment }

// RPCMeta is Mooncake's rpc_meta record.
type RPCMeta struct {
	IPOrHostName string `json:"ip_or_host_name"`
	RPCPort      int    `json:"rpc_port"`
}

// EncodeRPCMeta returns the JSON of an rpc_meta record.
func EncodeRPCMeta(host string, port int) []byte {
	b, _ := json.Marshal(RPCMeta{IPOrHostName: host, RPCPort: port})
	return b
}

// Opener opens a store from a connection string of its scheme.
type Opener func(conn string) (Store, error)

// Options are what a store may need besides its connection string. Stores
// read their own credentials from the environment too (see each store's
// package); these come from the engine's configuration.
type Options struct {
	// AuthSecret is the cluster secret in its text form (the secret, an
	// optional second line with the previous one): the HTTP metadata store
	// derives te-sidecar's bearer token from it.
	AuthSecret string
	// AuthSecretFile is a file holding the cluster secret.
	AuthSecretFile string
	// Token is the HTTP metadata store's bearer token, as given (it wins
	// over MC_METADATA_HTTP_TOKEN and the secret).
	Token string
}

// OpenerWith opens a store from a connection string and Options.
type OpenerWith func(conn string, o Options) (Store, error)

var (
	openersMu sync.Mutex
	openers   = map[string]OpenerWith{"mem": func(conn string, _ Options) (Store, error) { return openMemory(conn) }}
)

// RegisterScheme makes a store available under scheme (e.g. "etcd").
func RegisterScheme(scheme string, o Opener) {
	RegisterSchemeWith(scheme, func(conn string, _ Options) (Store, error) { return o(conn) })
}

// RegisterSchemeWith makes a store that takes Options available under
// scheme.
func RegisterSchemeWith(scheme string, o OpenerWith) {
	openersMu.Lock()
	defer openersMu.Unlock()
	openers[strings.ToLower(scheme)] = o
}

// IsP2P reports whether conn selects peer-to-peer metadata.
func IsP2P(conn string) bool {
	return conn == "" || strings.EqualFold(conn, P2PHandshake)
}

// Open opens the store named by conn: "mem://NAME" (an in-process store shared
// by every engine that names it, for tests and single-process setups), and the
// schemes other packages register (etcd://, etcds://, http://, https://,
// redis://, rediss://). For P2PHANDSHAKE it returns a nil store.
func Open(conn string) (Store, error) { return OpenWith(conn, Options{}) }

// OpenWith is Open with Options (an engine passes its cluster secret).
func OpenWith(conn string, o Options) (Store, error) {
	if IsP2P(conn) {
		return nil, nil
	}
	scheme, _, ok := strings.Cut(conn, "://")
	if !ok {
		return nil, errs.New(errs.InvalidArgument, "metadata", "connection string %q is not P2PHANDSHAKE or scheme://...", conn)
	}
	openersMu.Lock()
	op := openers[strings.ToLower(scheme)]
	openersMu.Unlock()
	if op == nil {
		return nil, errs.New(errs.NotSupported, "metadata", "no metadata store for scheme %q", scheme).
			WithHint("use P2PHANDSHAKE or mem://; etcd, http and redis stores are separate packages")
	}
	return op(conn, o)
}

// Memory is an in-process Store.
type Memory struct {
	mu sync.Mutex
	m  map[string][]byte
}

// NewMemory returns an empty in-process store.
func NewMemory() *Memory { return &Memory{m: map[string][]byte{}} }

var (
	sharedMu sync.Mutex
	shared   = map[string]*Memory{}
)

func openMemory(conn string) (Store, error) {
	name := strings.TrimPrefix(conn[strings.Index(conn, "://")+3:], "/")
	sharedMu.Lock()
	defer sharedMu.Unlock()
	m := shared[name]
	if m == nil {
		m = NewMemory()
		shared[name] = m
	}
	return nopClose{m}, nil
}

type nopClose struct{ *Memory }

func (nopClose) Close() error { return nil }

// Get returns a copy of the value at key.
func (s *Memory) Get(_ context.Context, key string) ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.m[key]
	if !ok {
		return nil, errs.New(errs.NotFound, "metadata", "no key %q", key)
	}
	return append([]byte(nil), v...), nil
}

// Put stores a copy of value at key.
func (s *Memory) Put(_ context.Context, key string, value []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.m[key] = append([]byte(nil), value...)
	return nil
}

// Delete removes key; a missing key is not an error.
func (s *Memory) Delete(_ context.Context, key string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.m, key)
	return nil
}

// Keys lists the stored keys.
func (s *Memory) Keys() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]string, 0, len(s.m))
	for k := range s.m {
		out = append(out, k)
	}
	return out
}

// Close does nothing.
func (s *Memory) Close() error { return nil }
