package ctrl

import (
	"bufio"
	"context"
	"errors"
	"net"
	"time"

	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/wire"
)

// Mooncake Transfer Engine's peer-to-peer handshake, the control plane's
// second dialect (internal/wire/spec.md, "Mooncake interop"): the frame
// header of te's control frames with kinds 0 to 3 and a JSON body, one
// exchange per connection, no call header, no authentication, and no error
// reply (a refused request closes the connection, which the Mooncake peer
// reports as a failure).

// mooncakeExchangeTimeout bounds one Mooncake handshake exchange on the
// serving side (Mooncake's own listener gives a peer 5 s per read).
const mooncakeExchangeTimeout = 10 * time.Second

// serveMooncake answers one Mooncake handshake frame with the handler of
// its kind, as Mooncake's listener does. A notify is charged to the same
// budget as te's (Reserver of wire.KindNotify), per address: Mooncake peers
// have no proven identity. The caller closes the connection.
func (c *Plane) serveMooncake(conn net.Conn, r *bufio.Reader) {
	kind, body, err := wire.ReadMooncakeFrame(r, wire.MooncakeMaxHandshake)
	if err != nil {
		return
	}
	c.hmu.RLock()
	h := c.handlers[kind]
	res, budgeted := c.reservers[wire.KindNotify]
	c.hmu.RUnlock()
	if h == nil {
		return // kind 0 (Connection) is Mooncake's RDMA endpoint exchange
	}
	ci := &CallInfo{Sender: "address " + hostOf(conn.RemoteAddr())}
	if kind == wire.KindMooncakeNotify && budgeted {
		n, err := res.Reserve(ci.Sender, uint64(len(body)))
		if err != nil {
			return // refused: Mooncake reports the notify failed
		}
		ci.Reserved = n
		defer func() {
			if ci.Reserved > ci.Kept {
				res.Release(ci.Sender, ci.Reserved-ci.Kept)
			}
		}()
	}
	ctx, cancel := context.WithTimeout(context.WithValue(c.ctx, callInfoKey{}, ci), mooncakeExchangeTimeout)
	out, err := h(ctx, body)
	cancel()
	if err != nil {
		return
	}
	conn.SetWriteDeadline(time.Now().Add(mooncakeExchangeTimeout))
	conn.Write(wire.AppendFrame(nil, kind, out))
}

// ExchangeMooncake sends one handshake frame to a Mooncake peer's RPC
// address on a connection of its own, and returns the reply's body (at most
// maxReply bytes, kind byte included). The connection is closed right after:
// a Mooncake listener serves one connection at a time and waits for the
// client to close it.
func (c *Plane) ExchangeMooncake(ctx context.Context, addr string, kind uint8, body []byte, maxReply uint64) ([]byte, error) {
	if uint64(len(body))+1 > wire.MooncakeMaxHandshake {
		return nil, errs.New(errs.TooLarge, "rpc", "Mooncake handshake message of %d bytes exceeds %d", len(body), wire.MooncakeMaxHandshake-1)
	}
	c.mu.Lock()
	closed := c.closed
	c.mu.Unlock()
	if closed {
		return nil, errs.New(errs.Closed, "rpc", "engine closed")
	}
	d := net.Dialer{Timeout: c.opt.DialTimeout}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, errs.Wrap(errs.PeerUnreachable, "rpc", err, "connect to %s", addr)
	}
	defer conn.Close()
	// Close aborts the exchange too.
	stop := context.AfterFunc(c.ctx, func() { conn.Close() })
	defer stop()
	if dl, ok := ctx.Deadline(); ok {
		conn.SetDeadline(dl)
	}
	fail := func(err error, what string) error {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return errs.Wrap(errs.Timeout, "rpc", err, "%s %s", what, addr)
		}
		if c.ctx.Err() != nil {
			return errs.New(errs.Closed, "rpc", "engine closed")
		}
		if code := errs.CodeOf(err); code == errs.TooLarge || code == errs.Protocol {
			return errs.Wrap(code, "rpc", err, "%s %s", what, addr)
		}
		return errs.Wrap(errs.PeerUnreachable, "rpc", err, "%s %s", what, addr)
	}
	if _, err := conn.Write(wire.AppendFrame(nil, kind, body)); err != nil {
		return nil, fail(err, "send to")
	}
	k, reply, err := wire.ReadMooncakeFrame(bufio.NewReader(conn), maxReply)
	if err != nil {
		return nil, fail(err, "no Mooncake handshake reply from")
	}
	if k != kind {
		return nil, errs.New(errs.Protocol, "rpc", "%s answered kind %d to kind %d", addr, k, kind)
	}
	return reply, nil
}
