package engine

import (
	"log/slog"
	"strconv"
	"time"

	"github.com/tecache/te/internal/connlimit"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/wire"
)

// Config configures an engine. The zero value is usable: peer-to-peer
// metadata, an RPC listener on a free port, every available transport.
//
// New fills the fields left unset from the environment (TE_SEGMENT_NAME,
// TE_MAX_CONNS, TE_PARAM_tcp_conns, ...: the Env* constants, and README.md's
// "Environment" table); a field set here wins over its variable, and a
// variable whose value does not parse makes New fail, naming it.
type Config struct {
	// SegmentName is the name peers open this engine by. In peer-to-peer
	// mode it defaults to (and must be) Hostname:port of the RPC listener.
	SegmentName string
	// Metadata is the connection string: "P2PHANDSHAKE" (default),
	// "mem://NAME", or a registered scheme such as etcd://h1:p1,h2:p2.
	Metadata string
	// ListenAddr is the RPC listener's address. Empty (the default), or
	// an empty host (":port"), binds the host the engine advertises
	// (Hostname) and nothing else; listening on every interface takes an
	// explicit "0.0.0.0:port" or "[::]:port". Port 0 picks a free port,
	// read back from the bound listener, so there is no window between
	// choosing and binding it. The tcp data listener binds the same IP.
	ListenAddr string
	// Hostname is the host peers reach this engine at. Default: the
	// listener's host when ListenAddr names a specific address, else the
	// first non-loopback IPv4 address, else 127.0.0.1.
	Hostname string
	// Transports lists the transports to install, e.g. {"local","tcp"}.
	// Default: every available one. A requested transport that cannot start
	// is an error; an unrequested one is skipped with a log line.
	Transports []string
	// ForceTransport makes every request use this transport, e.g. "tcp".
	ForceTransport string
	// Params passes transport parameters, e.g. "tcp.conns": "4".
	Params map[string]string
	// TransferTimeout bounds each submitted request; a request still running
	// then ends TIMEOUT. Default 30s; negative disables.
	TransferTimeout time.Duration
	// RPCTimeout bounds control-plane calls (descriptor fetch, notify,
	// probe). Default 5s.
	RPCTimeout time.Duration
	// MaxFrame is an older name of Limits.MaxFrame (te_config_t's
	// max_frame), used when Limits.MaxFrame is zero.
	MaxFrame uint64
	// MaxNotifies bounds the queue of received notifications; a sender gets
	// ResourceExhausted when it is full. Default 65536. Limits.NotifyBytes
	// bounds their bytes.
	MaxNotifies int
	// Logger receives the engine's log lines. Default (New): te's style on
	// stderr, at TE_LOG_LEVEL in TE_LOG_FORMAT (info, text when unset).
	Logger *slog.Logger

	// AuthSecret is the cluster secret: peers prove to each other that they
	// hold it before any other message (SECURITY.md). A second line, if
	// any, is an older secret still accepted from peers during a rotation.
	// Each is at least 16 bytes; surrounding white space is trimmed.
	// Empty: read AuthSecretFile; both empty: the environment
	// (TE_AUTH_SECRET_FILE, then TE_AUTH_SECRET); none at all runs without
	// authentication and says so in the log.
	AuthSecret string
	// AuthSecretFile is a file holding the secret (a Kubernetes Secret
	// mount), in AuthSecret's format.
	AuthSecretFile string
	// Encrypt seals data payloads too: with a secret, every control and
	// tcp data connection between two engines runs in an authenticated
	// session that protects every frame header, control message and
	// payload (a GMAC tag per 64 KiB record, checked before a byte lands
	// in registered memory); payloads cross in the clear unless Encrypt is
	// set here or on the peer (either side asking is enough), then
	// AES-128-GCM encrypts them (about 4 GB/s per core). Needs the cluster
	// secret: New refuses Encrypt without one. Also turned on by
	// TE_ENCRYPT=1.
	Encrypt bool
	// HeadersOnly opts out of payload integrity on tcp data connections:
	// headers and control messages stay authenticated, payloads cross
	// unauthenticated, so a party on the path can alter KV bytes unseen.
	// It takes effect only where the peer opts out too (the stronger mode
	// asked for wins), and only with a secret. Also turned on by
	// TE_INTEGRITY=headers (TE_INTEGRITY=payload is the default).
	HeadersOnly bool
	// AcceptMooncakePeers lets Mooncake Transfer Engine peers, which cannot
	// authenticate and carry no capability key, read and write this
	// engine's remote-accessible memory over tcp. Off by default; also
	// turned on by TE_ACCEPT_MOONCAKE_PEERS=1. With a cluster secret it is
	// refused (New fails) unless AllowMooncakeWithSecret is set too. Mooncake
	// peers' handshake (descriptor, notify, probe) is answered without it,
	// but with a cluster secret only when both are set.
	AcceptMooncakePeers bool
	// AllowMooncakeWithSecret accepts Mooncake peers even though a cluster
	// secret is set: they bypass the secret, so this trusts the network.
	// It also lets this engine reach segments whose descriptor (from the
	// metadata store) is a Mooncake engine's. Even so, with a secret, a peer
	// that closes te's handshake is never retried Mooncake's way.
	AllowMooncakeWithSecret bool
	// UnregisterGrace is how long UnregisterMemory and Close let remote
	// accesses in flight finish before cutting the connections or queue
	// pairs that carry them. Default 2s.
	UnregisterGrace time.Duration
	// Limits bound what peers can make this engine hold.
	Limits Limits
	// MetricsAddr, when set, serves the engine's metrics (WriteMetrics) in
	// Prometheus's text format at http://MetricsAddr/metrics. An empty
	// host (":9464") binds 127.0.0.1; other interfaces take an explicit
	// host ("0.0.0.0:9464"). The metrics name peers' segments: expose them
	// to the scraper only.
	MetricsAddr string
}

// Default limits (internal/wire/spec.md, "Resource bounds", has what each
// bounds and how a peer over it is refused).
const (
	DefaultMaxConns         = 1024
	DefaultMaxConnsPerHost  = 256
	DefaultIdleTimeout      = 5 * time.Minute
	DefaultHandshakeTimeout = 10 * time.Second
	DefaultProgressTimeout  = 10 * time.Second
	DefaultMaxFrame         = wire.DefaultMaxFrame
	// MinMaxFrame and MaxMaxFrame bound Limits.MaxFrame: a frame must hold
	// a small descriptor, and a peer must not make the engine buffer more
	// than a gigabyte for one.
	MinMaxFrame                 uint64 = 4 << 10
	MaxMaxFrame                 uint64 = 1 << 30
	DefaultMaxCallsPerConn             = 64
	DefaultMaxCalls                    = 1024
	DefaultNotifyBytes                 = 64 << 20
	DefaultNotifyBytesPerSender        = wire.MaxNotifyMsg + wire.MaxNotifyName
	DefaultPeerIdleTimeout             = 2 * time.Minute
)

// Limits bound the resources a peer, idle or hostile, can make an engine hold.
// A zero field takes its default; a peer over a bound is refused
// (errs.ResourceExhausted) or cut off, counted in the engine's stats, and the
// other peers carry on.
type Limits struct {
	// MaxConns bounds accepted connections per listener (RPC and tcp data
	// each). Default 1024.
	MaxConns int
	// MaxConnsPerHost bounds accepted connections per remote IP address per
	// listener. Default 256.
	MaxConnsPerHost int
	// IdleTimeout closes an accepted connection that has nothing in flight
	// for this long. Default 5m; negative: never.
	IdleTimeout time.Duration
	// HandshakeTimeout bounds authentication and the data preface of a new
	// connection, and the arrival of a frame or request header once its
	// first byte came. Default 10s.
	HandshakeTimeout time.Duration
	// ProgressTimeout cuts a connection whose payload (a control frame
	// body, a WRITE payload, a READ payload being sent) makes no progress
	// for this long, ending the accesses it held, and a dialled control
	// connection whose peer says nothing for this long while calls are in
	// flight (calls that may go again are sent on a fresh one). Default
	// 10s.
	ProgressTimeout time.Duration
	// MaxFrame bounds the descriptor a Describe reply may carry. Frames
	// of other kinds are bounded by 64 KiB (notifications and shm control
	// messages by their own limits). Default 16 MiB, the largest
	// descriptor; at least 4 KiB.
	MaxFrame uint64
	// MaxCallsPerConn bounds control calls in flight on one connection;
	// past it the engine stops reading that connection. Default 64.
	MaxCallsPerConn int
	// MaxCalls bounds control calls in flight in the engine. Default 1024.
	MaxCalls int
	// NotifyBytes bounds the bytes (names and messages) of received,
	// undrained notifications, those being received included. Default 64
	// MiB.
	NotifyBytes uint64
	// NotifyBytesPerSender bounds them per sender: the peer's proven
	// instance with a cluster secret, its IP address without one (a name
	// in the notification is the sender's to choose, so it is not the
	// key). Default 16 MiB + 4 KiB: one notification of the largest size.
	NotifyBytesPerSender uint64
	// PeerIdleTimeout drops a peer's pooled connections (control and tcp)
	// and destroys its rdma endpoints' queue pairs when it had no request
	// for this long; shorter than IdleTimeout, so a client closes an idle
	// connection before its peer does. Default 2m; negative: never.
	PeerIdleTimeout time.Duration
}

func (c *Config) fill() {
	if c.TransferTimeout == 0 {
		c.TransferTimeout = 30 * time.Second
	}
	if c.RPCTimeout <= 0 {
		c.RPCTimeout = 5 * time.Second
	}
	if c.MaxNotifies <= 0 {
		c.MaxNotifies = 65536
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	l := &c.Limits
	if l.MaxFrame == 0 {
		l.MaxFrame = c.MaxFrame
	}
	setDefault(&l.MaxFrame, DefaultMaxFrame)
	c.MaxFrame = l.MaxFrame
	setDefault(&l.MaxConns, DefaultMaxConns)
	setDefault(&l.MaxConnsPerHost, DefaultMaxConnsPerHost)
	setDefault(&l.IdleTimeout, DefaultIdleTimeout)
	setDefault(&l.HandshakeTimeout, DefaultHandshakeTimeout)
	setDefault(&l.ProgressTimeout, DefaultProgressTimeout)
	setDefault(&l.MaxCallsPerConn, DefaultMaxCallsPerConn)
	setDefault(&l.MaxCalls, DefaultMaxCalls)
	setDefault(&l.NotifyBytes, DefaultNotifyBytes)
	setDefault(&l.NotifyBytesPerSender, DefaultNotifyBytesPerSender)
	setDefault(&l.PeerIdleTimeout, DefaultPeerIdleTimeout)
	l.NotifyBytesPerSender = min(l.NotifyBytesPerSender, l.NotifyBytes)
	if c.UnregisterGrace <= 0 {
		c.UnregisterGrace = 2 * time.Second
	}
}

func setDefault[T int | uint64 | time.Duration](v *T, d T) {
	if *v == 0 {
		*v = d
	}
}

// validate refuses limits that cannot be meant: a negative count, or no
// bound on the handshake or on a payload's progress.
func (c *Config) validate() error {
	l := &c.Limits
	bad := func(field string, v any) error {
		return errs.New(errs.InvalidArgument, "new", "Limits.%s = %v is out of range", field, v)
	}
	switch {
	case l.MaxConns < 0:
		return bad("MaxConns", l.MaxConns)
	case l.MaxConnsPerHost < 0:
		return bad("MaxConnsPerHost", l.MaxConnsPerHost)
	case l.MaxCallsPerConn < 0:
		return bad("MaxCallsPerConn", l.MaxCallsPerConn)
	case l.MaxCalls < 0:
		return bad("MaxCalls", l.MaxCalls)
	case l.HandshakeTimeout < 0:
		return bad("HandshakeTimeout", l.HandshakeTimeout)
	case l.ProgressTimeout < 0:
		return bad("ProgressTimeout", l.ProgressTimeout)
	case l.MaxFrame < MinMaxFrame || l.MaxFrame > MaxMaxFrame:
		return errs.New(errs.InvalidArgument, "new", "Limits.MaxFrame (%s) = %d is out of range: want 4KiB to 1GiB", EnvMaxFrame, l.MaxFrame)
	}
	return nil
}

// policy is the part of the limits a listener or a dialled pool applies.
func (l *Limits) policy() connlimit.Policy {
	p := connlimit.Policy{
		MaxConns: l.MaxConns, MaxConnsPerHost: l.MaxConnsPerHost,
		IdleTimeout: l.IdleTimeout, HandshakeTimeout: l.HandshakeTimeout,
		ProgressTimeout: l.ProgressTimeout, PeerIdleTimeout: l.PeerIdleTimeout,
	}
	p.IdleTimeout = max(p.IdleTimeout, 0)
	p.PeerIdleTimeout = max(p.PeerIdleTimeout, 0)
	return p
}

// param gives transports the limits that bound their connections, as
// "limits.*" parameters (Host.Param), so a transport needs no engine types.
func (l *Limits) param(key string) (string, bool) {
	switch key {
	case "limits.idle_timeout":
		return max(l.IdleTimeout, 0).String(), true // 0: never
	case "limits.handshake_timeout":
		return l.HandshakeTimeout.String(), true
	case "limits.progress_timeout":
		return l.ProgressTimeout.String(), true
	case "limits.peer_idle_timeout":
		return max(l.PeerIdleTimeout, 0).String(), true // 0: never
	case "limits.max_conns":
		if l.MaxConns > 0 {
			return strconv.Itoa(l.MaxConns), true
		}
	case "limits.max_conns_per_host":
		if l.MaxConnsPerHost > 0 {
			return strconv.Itoa(l.MaxConnsPerHost), true
		}
	}
	return "", false
}
