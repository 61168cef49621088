package engine

import (
	"github.com/tecache/te/internal/connlimit"
	"github.com/tecache/te/internal/peerauth"
)

// AuthSecret returns the engine's cluster secret (nil: none), for a
// transport that authenticates its own connections with peerauth (the tcp
// data path, after its preface).
func (h host) AuthSecret() *peerauth.Secret { return h.e.secret }

// Encrypt reports whether the engine seals data payloads too
// (Config.Encrypt), for a transport whose connections open sessions.
func (h host) Encrypt() bool { return h.e.cfg.Encrypt }

// HeadersOnly reports whether the engine opts out of payload integrity
// (Config.HeadersOnly), for a transport whose connections open sessions.
func (h host) HeadersOnly() bool { return h.e.cfg.HeadersOnly }

// ConnPolicy returns the connection bounds a transport's listener and
// dialled pool apply (Config.Limits with defaults filled in).
func (h host) ConnPolicy() connlimit.Policy { return h.e.cfg.Limits.policy() }
