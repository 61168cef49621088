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
	"github.com/tecache/te/internal/wire"
)

// call is one control call on a pooled connection (internal/pipe).
type call struct {
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
	if limit := wire.RequestLimit(kind); uint64(len(body))+wire.CallHeaderSize > limit {
		return nil, errs.New(errs.TooLarge, "rpc", "message of %d bytes exceeds the limit of %d for kind %#x", len(body), limit-wire.CallHeaderSize, kind)
	}
	res, seq, err := c.call(ctx, addr, kind, body)
	var of openFailed
	if errors.As(err, &of) {
		return nil, of.error // the peer as it is now refused or failed the opening
	}
	if err != nil && seq != 1 && errs.CodeOf(err) == errs.PeerUnreachable && ctx.Err() == nil {
		// A pooled connection can be dead before its reader has noticed
		// (the peer restarted under the same address, or closed it as
		// idle): once more, on a new one. A call that was the first on a
		// fresh connection met the peer as it is now.
		res, _, err = c.call(ctx, addr, kind, body)
		if errors.As(err, &of) {
			err = of.error
		}
	}
	return res, err
}

// openFailed marks the failure of a connection's dial or opening exchange:
// the calls queued on it were never sent, and sending them again would meet
// the same peer.
type openFailed struct{ error }

func (o openFailed) Unwrap() error { return o.error }

// call makes one attempt; seq says where the call went (call.seq).
func (c *Plane) call(ctx context.Context, addr string, kind uint8, body []byte) ([]byte, uint64, error) {
	pe, err := c.pool.Peer(addr)
	if err != nil {
		return nil, 1, err
	}
	cl := &call{kind: kind, body: body, done: make(chan struct{})}
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

// Open runs the authentication exchange under the handshake timeout.
func (d callDialect) Open(nc net.Conn, addr string) (pipe.Encoder[*call], pipe.Decoder[*call], error) {
	c := d.c
	if _, err := peerauth.Client(nc, c.opt.Secret, c.opt.Instance, time.Now().Add(c.opt.Limits.HandshakeTimeout)); err != nil {
		if errs.CodeOf(err) == errs.Unauthenticated {
			c.st.authFailedOut.Add(1)
		}
		return nil, nil, openFailed{err}
	}
	return &callWriter{c: c}, &replyReader{c: c}, nil
}

// callWriter writes call frames, many in one writev.
type callWriter struct {
	c           *Plane
	sent        uint64 // calls written on the connection
	hdrs        []byte
	bufs, chunk net.Buffers
}

func (w *callWriter) Admit(*call) error { return nil }

func (w *callWriter) Encode(nc net.Conn, out []pipe.Out[*call]) (int64, error) {
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

func (w *callWriter) Close() {}

// replyReader reads reply frames and hands each to its call.
type replyReader struct{ c *Plane }

func (d *replyReader) Decode(r *pipe.Reader[*call]) error {
	c := d.c
	lim := &c.opt.Limits
	r.Moved() // no deadline between replies: each call has its own
	kind, n, err := readFrameHeader(r.Buf(), r.Conn(), lim.HandshakeTimeout)
	if err != nil {
		c.noteSlowIf(err)
		return r.Lost(err)
	}
	if limit := wire.ReplyLimit(kind, lim.MaxFrame); n > limit || kind < wire.KindDescribe || kind == wire.KindAuth {
		c.st.refusedFrames.Add(1)
		return errs.New(errs.TooLarge, "rpc", "%s sent a reply of kind %#x and %d bytes (limit %d); connection closed", r.Addr(), kind, n, limit).
			WithHint("a descriptor above Limits.MaxFrame needs a larger limit on this side")
	}
	body, err := readBody(r.Buf(), r.Conn(), n, lim.ProgressTimeout)
	if err != nil {
		c.noteSlowIf(err)
		return r.Lost(err)
	}
	rep, err := wire.DecodeCall(body)
	if err != nil || rep.Flags == wire.FlagRequest {
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

func (d *replyReader) Close() {}
