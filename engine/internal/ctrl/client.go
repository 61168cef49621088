package ctrl

import (
	"context"
	"errors"
	"net"
	"sync/atomic"
	"time"

	"github.com/tecache/te/engine/internal/pipe"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/peerauth"
	"github.com/tecache/te/internal/session"
	"github.com/tecache/te/internal/wire"
)

// Target is the peer a call is meant for: the address to dial and, when
// known, the segment and instance the connection must have proven there.
type Target struct {
	Addr string
	// Name: the segment meant (its name or RPC address must be the one
	// the server proved); empty: any.
	Name string
	// Instance: the engine start meant (from an authenticated
	// descriptor); empty: any.
	Instance string
}

// call is one control call on a pooled connection (internal/pipe).
type call struct {
	to       Target
	kind     uint8
	body     []byte
	done     chan struct{} // closed by Done
	err      error         // the connection's failure; else flags and reply
	flags    uint8
	reply    []byte
	canceled atomic.Bool
	// seq is the call's place on its connection (1: the first), set by
	// the writer before the call is settled; 0: never written.
	seq atomic.Uint64
}

func (c *call) Canceled() bool { return c.canceled.Load() }

// Holds is false: the body is the caller's copy, not registered memory.
func (c *call) Holds() bool { return false }

func (c *call) Done(err error) {
	c.err = err
	close(c.done)
}

// Call sends a request to the peer's control address and waits for its reply,
// the context's end, or the connection's loss, whichever comes first.
func (c *Plane) Call(ctx context.Context, addr string, kind uint8, body []byte) ([]byte, error) {
	return c.CallTo(ctx, Target{Addr: addr}, kind, body)
}

// CallTo is Call to the peer t names: with a cluster secret the call is
// written only on a connection whose server proved t.Name and t.Instance
// (those that are set); else it fails unsent, Unauthenticated when the
// server is another segment, StaleDescriptor when it is another start of
// the segment meant.
func (c *Plane) CallTo(ctx context.Context, t Target, kind uint8, body []byte) ([]byte, error) {
	if limit := wire.RequestLimit(kind); uint64(len(body))+wire.CallHeaderSize > limit {
		return nil, errs.New(errs.TooLarge, "rpc", "message of %d bytes exceeds the limit of %d for kind %#x", len(body), limit-wire.CallHeaderSize, kind)
	}
	res, seq, err := c.call(ctx, t, kind, body)
	var of openFailed
	if errors.As(err, &of) {
		return nil, of.error // the peer as it is now refused or failed the opening
	}
	if err != nil && retryable(kind, seq) && errs.CodeOf(err) == errs.PeerUnreachable && ctx.Err() == nil {
		// A pooled connection can be dead before its reader has noticed
		// (the peer restarted under the same address, or closed it as
		// idle): once more, on a new one. A call that was the first on a
		// fresh connection met the peer as it is now. A call that was
		// written may have been served (only its reply was lost): it goes
		// again only if serving it twice changes nothing.
		res, _, err = c.call(ctx, t, kind, body)
		if errors.As(err, &of) {
			err = of.error
		}
	}
	return res, err
}

// retryable says whether a call that failed with its connection may be sent
// again on a new one: never written (seq 0); a NotifyOnce, which the
// receiver dedups by its id, however it went (the body is the same, id
// included, so the one success means one delivery, even when the reply of
// the first attempt on a fresh connection was lost); or written, not as the
// first call of a fresh connection, and of a kind that serving twice leaves
// as once (Describe, Probe). A Notify or a transport's control message that
// was written is not: the peer may have acted on it.
func retryable(kind uint8, seq uint64) bool {
	if seq == 0 || kind == wire.KindNotifyOnce {
		return true
	}
	return seq != 1 && (kind == wire.KindDescribe || kind == wire.KindProbe)
}

// openFailed marks the failure of a connection's dial or opening exchange:
// the calls queued on it were never sent, and sending them again would meet
// the same peer.
type openFailed struct{ error }

func (o openFailed) Unwrap() error { return o.error }

// call makes one attempt; seq says where the call went (call.seq).
func (c *Plane) call(ctx context.Context, t Target, kind uint8, body []byte) ([]byte, uint64, error) {
	addr := t.Addr
	pe, err := c.pool.Peer(addr)
	if err != nil {
		return nil, 1, err
	}
	cl := &call{to: t, kind: kind, body: body, done: make(chan struct{})}
	pe.Send(0, cl)
	select {
	case <-cl.done:
		switch {
		case cl.err != nil:
			return nil, cl.seq.Load(), cl.err
		case cl.flags == wire.FlagReplyErr:
			return nil, cl.seq.Load(), wire.DecodeError(cl.reply)
		}
		return cl.reply, cl.seq.Load(), nil
	case <-ctx.Done():
		// Released: its reply, if it comes, is read and dropped.
		cl.canceled.Store(true)
		pe.Cancel()
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return nil, 1, errs.Wrap(errs.Timeout, "rpc", ctx.Err(), "no reply from %s", addr)
		}
		return nil, 1, errs.Wrap(errs.Canceled, "rpc", ctx.Err(), "call to %s", addr)
	}
}

// callDialect is the control framing on the calling side.
type callDialect struct{ c *Plane }

func (d callDialect) Dial(ctx context.Context, addr string) (net.Conn, error) {
	dl := net.Dialer{Timeout: d.c.opt.DialTimeout}
	nc, err := dl.DialContext(ctx, "tcp", addr)
	if err != nil {
		if ctx.Err() != nil {
			return nil, errs.New(errs.Closed, "rpc", "engine closed")
		}
		return nil, openFailed{errs.Wrap(errs.PeerUnreachable, "rpc", err, "connect to %s", addr)}
	}
	if tc, ok := nc.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
	return nc, nil
}

// Open runs the authentication exchange under the handshake timeout; with a
// secret on both sides it opens the session every later frame is sealed in.
func (d callDialect) Open(nc net.Conn, addr string) (pipe.Encoder[*call], pipe.Decoder[*call], error) {
	c := d.c
	o, err := peerauth.ClientSession(nc, c.opt.Secret, c.opt.Instance, time.Now().Add(c.opt.Limits.HandshakeTimeout),
		c.opt.sessionOptions())
	if err != nil {
		if errs.CodeOf(err) == errs.Unauthenticated {
			c.st.authFailedOut.Add(1)
		}
		return nil, nil, openFailed{err}
	}
	seal, open := o.Session.Split()
	w := &callWriter{c: c, seal: seal, addr: addr}
	if o.Session != nil {
		w.name, w.peerAddr, w.instance = o.PeerName, o.PeerAddr, o.PeerInstance
	}
	return w, &replyReader{c: c, op: open}, nil
}

// callWriter writes call frames, many in one writev.
type callWriter struct {
	c    *Plane
	seal *session.Sealer // nil: no session
	sent uint64          // calls written on the connection
	addr string          // dialled
	// What the server proved (a session only): its segment name, RPC
	// address and instance.
	name, peerAddr, instance string
	hdrs                     []byte
	sealed                   []byte // a session's write: every frame sealed, in order
	bufs, chunk              net.Buffers
}

// keepSealed is the largest sealed-write buffer a connection keeps between
// writes; a larger one (a burst of big notifications) is dropped.
const keepSealed = 1 << 20

// Admit refuses a call meant for another segment or instance than the
// one this connection's server proved: a rewritten rpc_meta record or
// descriptor, or a connection redirected on the path, reached a peer that
// holds the secret but is not the one meant. Nothing of the call is sent.
func (w *callWriter) Admit(cl *call) error {
	if w.seal == nil {
		return nil // no secret: peers are trusted (spec.md)
	}
	t := cl.to
	if t.Name != "" && t.Name != w.name && t.Name != w.peerAddr {
		w.c.st.wrongPeer.Add(1)
		return errs.New(errs.Unauthenticated, "rpc", "%s is segment %q (instance %s), not %q: refused to send it a call meant for %q",
			w.addr, w.name, w.instance, t.Name, t.Name).
			WithHint("the metadata store's rpc_meta or descriptor for this segment points at another engine (rewritten, or stale)")
	}
	if t.Instance != "" && t.Instance != w.instance {
		return errs.New(errs.StaleDescriptor, "rpc", "%s is instance %s of segment %q, not instance %s: the segment restarted",
			w.addr, w.instance, w.name, t.Instance)
	}
	return nil
}

func (w *callWriter) Encode(nc net.Conn, out []pipe.Out[*call]) (int64, error) {
	if w.seal != nil {
		return w.encodeSealed(nc, out)
	}
	if n := len(out) * callFrameHeader; cap(w.hdrs) < n {
		w.hdrs = make([]byte, n)
	}
	hdrs := w.hdrs[:len(out)*callFrameHeader]
	w.bufs = w.bufs[:0]
	var end int64
	for i := range out {
		cl := out[i].Item
		h := hdrs[i*callFrameHeader : (i+1)*callFrameHeader]
		putCallHeader(h, cl.kind, out[i].ID, wire.FlagRequest, len(cl.body))
		w.bufs = append(w.bufs, h, cl.body)
		end += int64(len(h) + len(cl.body))
		out[i].End = end
		w.sent++
		cl.seq.Store(w.sent)
	}
	n, chunk, err := pipe.WriteProgress(nc, w.bufs, w.chunk, w.c.opt.Limits.ProgressTimeout)
	w.chunk = chunk
	clear(w.bufs)
	return n, err
}

// encodeSealed writes the calls as records: each frame's headers one
// record, its payload the next ones, sealed in the order they go out.
func (w *callWriter) encodeSealed(nc net.Conn, out []pipe.Out[*call]) (int64, error) {
	buf := w.sealed[:0]
	for i := range out {
		cl := out[i].Item
		var err error
		if buf, err = appendCall(buf, w.seal, cl.kind, out[i].ID, wire.FlagRequest, cl.body); err != nil {
			return 0, err
		}
		out[i].End = int64(len(buf))
		w.sent++
		cl.seq.Store(w.sent)
	}
	w.bufs = append(w.bufs[:0], buf)
	n, chunk, err := pipe.WriteProgress(nc, w.bufs, w.chunk, w.c.opt.Limits.ProgressTimeout)
	w.chunk = chunk
	clear(w.bufs)
	if cap(buf) <= keepSealed {
		w.sealed = buf[:0]
	} else {
		w.sealed = nil
	}
	return n, err
}

func (w *callWriter) Close() {}

// replyReader reads reply frames and hands each to its call.
type replyReader struct {
	c  *Plane
	op *session.Opener // nil: no session
}

func (d *replyReader) Decode(r *pipe.Reader[*call]) error {
	c := d.c
	lim := &c.opt.Limits
	r.Moved() // no deadline between replies: each call has its own
	h, err := readFrameHeader(r.Buf(), d.op, r.Conn(), lim.HandshakeTimeout)
	if err != nil {
		return d.fail(r, err)
	}
	kind, n := h.kind, h.n
	if limit := wire.ReplyLimit(kind, lim.MaxFrame); n > limit || kind < wire.KindDescribe || kind == wire.KindAuth {
		c.st.refusedFrames.Add(1)
		return errs.New(errs.TooLarge, "rpc", "%s sent a reply of kind %#x and %d bytes (limit %d); connection closed", r.Addr(), kind, n, limit).
			WithHint("a descriptor above Limits.MaxFrame needs a larger limit on this side")
	}
	rep, err := readPayload(r.Buf(), d.op, r.Conn(), h, lim.ProgressTimeout)
	if err != nil {
		if code := errs.CodeOf(err); code == errs.Protocol && d.op == nil {
			return errs.New(errs.Protocol, "rpc", "bad reply from %s", r.Addr())
		}
		return d.fail(r, err)
	}
	if rep.Flags == wire.FlagRequest {
		return errs.New(errs.Protocol, "rpc", "bad reply from %s", r.Addr())
	}
	s, err := r.Take(rep.ID)
	if err != nil {
		return err
	}
	if !s.Released() {
		s.Item.flags, s.Item.reply = rep.Flags, rep.Payload
	}
	r.Done(s, nil)
	return nil
}

// fail is the error a read failure ends the connection with: the session's
// refusal of a record (Unauthenticated, Protocol) as it is, else a lost
// connection.
func (d *replyReader) fail(r *pipe.Reader[*call], err error) error {
	switch errs.CodeOf(err) {
	case errs.Unauthenticated, errs.Protocol:
		return errs.Wrap(errs.CodeOf(err), "rpc", err, "reply from %s", r.Addr())
	}
	d.c.noteSlowIf(err)
	return r.Lost(err)
}

func (d *replyReader) Close() {}
