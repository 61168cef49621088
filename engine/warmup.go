package engine

import (
	"context"
	"strings"

	"github.com/tecache/te/engine/transport"
	"github.com/tecache/te/internal/errs"
)

// Warmup connects to the named segment ahead of its first transfer: the
// transport that would carry host memory to it (the one Submit picks, so
// Config.ForceTransport counts) makes what it would otherwise make on the
// first request, when it can do so ahead (transport.Warmer): tcp dials its
// striped connections and completes each one's handshake and session keys,
// rdma connects its queue pairs on every rail. A transport with nothing to
// set up (local, shm) makes Warmup a no-op that succeeds.
//
// It opens the segment for the call: call it after OpenSegment to keep the
// descriptor cached for the transfers that follow. It blocks until every
// connection is up or one failed, bounded by ctx and by the transports'
// connect and handshake timeouts. Safe for concurrent use; connections
// already up cost nothing. Warmed connections left unused are reclaimed
// like any other idle ones (tcp: Limits.PeerIdleTimeout, 2 minutes), so
// warm up shortly before the transfers.
func (e *Engine) Warmup(ctx context.Context, name string) error {
	const op = "warmup"
	if err := e.live(op); err != nil {
		return err
	}
	if ctx == nil {
		return errs.New(errs.InvalidArgument, op, "nil context")
	}
	if name == "" {
		return errs.New(errs.InvalidArgument, op, "empty segment name")
	}
	s, err := e.OpenSegment(name)
	if err != nil {
		return err
	}
	defer e.CloseSegment(s)
	if s.st.local {
		return nil // this engine's own segment: memcpy, nothing to connect
	}
	d, err := e.current(s.st)
	if err != nil {
		return err
	}
	hint := e.cfg.ForceTransport
	var why []string
	perBuffer := false
	for _, t := range e.transports {
		if hint != "" && t.Name() != hint {
			continue
		}
		if _, ok := t.(transport.BufferReacher); ok {
			perBuffer = true
		}
		if reason := qualifies(t, d, nil, nil, hostMem); reason != "" {
			why = append(why, t.Name()+": "+reason)
			continue
		}
		if hint == "" && !perBuffer {
			// The choice pick would make for host memory, made now: the
			// first request finds it cached, as every later one does.
			e.cachePick(s.st, d, 0, t, nil, len(why) > 0)
		}
		w, ok := t.(transport.Warmer)
		if !ok {
			return nil
		}
		if err := w.Warmup(ctx, d); err != nil {
			e.invalidate(s.st, err)
			return errs.Wrap(errs.CodeOf(err), op, err, "segment %q over %s", name, t.Name())
		}
		return nil
	}
	return errs.New(errs.TransportUnavailable, op, "no transport reaches segment %q: %s", name, strings.Join(why, "; "))
}
