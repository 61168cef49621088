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
}
