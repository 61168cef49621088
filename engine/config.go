package engine

import (
	"log/slog"
	"time"
)

// Config configures an engine. The zero value is usable: peer-to-peer
// metadata, an RPC listener on a free port, every available transport.
type Config struct {
	// SegmentName is the name peers open this engine by. In peer-to-peer
	// mode it defaults to (and must be) Hostname:port of the RPC listener.
	SegmentName string
	// Metadata is the connection string: "P2PHANDSHAKE" (default),
	// "mem://NAME", or a registered scheme such as etcd://h1:p1,h2:p2.
	Metadata string
	// ListenAddr is the RPC listener's address; port 0 (the default,
	// "0.0.0.0:0") picks a free port. The port is read back from the bound
	// listener, so there is no window between choosing and binding it.
	ListenAddr string
	// Hostname is the host peers reach this engine at. Default: the
	// listener's host when it is a specific address, else the first
	// non-loopback IPv4 address, else 127.0.0.1.
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
	// MaxFrame bounds a control-plane frame body. Default 64 MiB.
	MaxFrame uint64
	// MaxNotifies bounds the queue of received notifications; a sender gets
	// an error when it is full. Default 65536.
	MaxNotifies int
	// Logger receives the engine's log lines. Default: slog.Default().
	Logger *slog.Logger

	// AuthSecret is the cluster secret: peers prove to each other that they
	// hold it before any other message (SECURITY.md). A second line, if
	// any, is an older secret still accepted from peers during a rotation.
	// Empty: read AuthSecretFile; both empty: the environment
	// (TE_AUTH_SECRET_FILE, then TE_AUTH_SECRET); none at all runs without
	// authentication and says so in the log.
	AuthSecret string
	// AuthSecretFile is a file holding the secret (a Kubernetes Secret
	// mount), in AuthSecret's format.
	AuthSecretFile string
	// AcceptMooncakePeers lets Mooncake Transfer Engine peers, which cannot
	// authenticate and carry no capability key, read and write this
	// engine's remote-accessible memory over tcp. Off by default; also
	// turned on by TE_ACCEPT_MOONCAKE_PEERS=1. With a cluster secret it is
	// refused (New fails) unless AllowMooncakeWithSecret is set too. Mooncake
	// peers' handshake (descriptor, notify, probe) is answered without it,
	// but not with a cluster secret unless AllowMooncakeWithSecret.
	AcceptMooncakePeers bool
	// AllowMooncakeWithSecret accepts Mooncake peers even though a cluster
	// secret is set: they bypass the secret, so this trusts the network.
	AllowMooncakeWithSecret bool
	// UnregisterGrace is how long UnregisterMemory and Close let remote
	// accesses in flight finish before cutting the connections or queue
	// pairs that carry them. Default 2s.
	UnregisterGrace time.Duration
	// Limits bound what peers can make this engine hold.
	Limits Limits
}

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
	// for this long. Default 5m.
	IdleTimeout time.Duration
	// HandshakeTimeout bounds authentication and the data preface of a new
	// connection, and the arrival of a frame or request header once its
	// first byte came. Default 10s.
	HandshakeTimeout time.Duration
	// ProgressTimeout cuts a connection whose payload (a control frame
	// body, a WRITE payload, a READ payload being sent) makes no progress
	// for this long, ending the accesses it held. Default 10s.
	ProgressTimeout time.Duration
	// MaxFrame bounds a control frame that may carry a descriptor. Frames
	// of other kinds are bounded by 64 KiB (notifications by their own
	// limit). Default 16 MiB, the largest descriptor.
	MaxFrame uint64
	// MaxCallsPerConn bounds control calls in flight on one connection;
	// past it the engine stops reading that connection. Default 64.
	MaxCallsPerConn int
	// MaxCalls bounds control calls in flight in the engine. Default 1024.
	MaxCalls int
	// NotifyBytes bounds the bytes of received, undrained notifications.
	// Default 64 MiB.
	NotifyBytes uint64
	// NotifyBytesPerSender bounds them per sender name. Default 16 MiB.
	NotifyBytesPerSender uint64
	// PeerIdleTimeout drops a tcp peer's pooled connections when it had no
	// request for this long; shorter than IdleTimeout, so a client closes
	// an idle connection before its peer does. Default 2m.
	PeerIdleTimeout time.Duration
}

func (c *Config) fill() {
	if c.ListenAddr == "" {
		c.ListenAddr = "0.0.0.0:0"
	}
	if c.TransferTimeout == 0 {
		c.TransferTimeout = 30 * time.Second
	}
	if c.RPCTimeout <= 0 {
		c.RPCTimeout = 5 * time.Second
	}
	if c.MaxFrame == 0 {
		c.MaxFrame = 64 << 20
	}
	if c.MaxNotifies <= 0 {
		c.MaxNotifies = 65536
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.UnregisterGrace <= 0 {
		c.UnregisterGrace = 2 * time.Second
	}
	c.Limits.fill()
}

func (l *Limits) fill() {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&l.IdleTimeout, 5*time.Minute)
	def(&l.HandshakeTimeout, 10*time.Second)
	def(&l.ProgressTimeout, 10*time.Second)
	def(&l.PeerIdleTimeout, 2*time.Minute)
}

// param gives transports the limits that bound their connections, as
// "limits.*" parameters (Host.Param), so a transport needs no engine types.
func (l *Limits) param(key string) (string, bool) {
	switch key {
	case "limits.idle_timeout":
		return l.IdleTimeout.String(), true
	case "limits.handshake_timeout":
		return l.HandshakeTimeout.String(), true
	case "limits.progress_timeout":
		return l.ProgressTimeout.String(), true
	case "limits.peer_idle_timeout":
		return l.PeerIdleTimeout.String(), true
	}
	return "", false
}
