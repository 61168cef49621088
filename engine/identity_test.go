package engine_test

import (
	"bytes"
	"context"
	"io"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/tecache/te/engine"
	"github.com/tecache/te/engine/meta"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/sys/mem"
)

// identityCluster is three engines with one secret on one mem:// store:
// A the initiator, B the segment A means, C another engine. B and C each
// register one buffer of the same size, filled with their letter.
type identityCluster struct {
	conn       string
	a, b, c    *engine.Engine
	bBuf, cBuf []byte
}

func newIdentityCluster(t *testing.T, mod func(*engine.Config)) *identityCluster {
	t.Helper()
	k := &identityCluster{conn: "mem://identity-" + strconv.FormatInt(time.Now().UnixNano(), 10)}
	mk := func(name string) *engine.Engine {
		return newEngine(t, func(c *engine.Config) {
			c.Transports, c.Metadata, c.SegmentName, c.AuthSecret = []string{"tcp"}, k.conn, name, secretA
			if mod != nil {
				mod(c)
			}
		})
	}
	k.a, k.b, k.c = mk("A"), mk("B"), mk("C")
	for _, x := range []struct {
		e   *engine.Engine
		buf *[]byte
		c   byte
	}{{k.b, &k.bBuf, 'B'}, {k.c, &k.cBuf, 'C'}} {
		*x.buf = alloc(t, 1<<16)
		for i := range *x.buf {
			(*x.buf)[i] = x.c
		}
		if err := x.e.RegisterMemory(mem.Addr(*x.buf), 1<<16, "cpu", true); err != nil {
			t.Fatal(err)
		}
	}
	return k
}

// copyUnder copies segment from's records (descriptor and rpc_meta, as
// stored) under segment to's keys: what a store writer without the secret
// can do.
func copyUnder(t *testing.T, conn, from, to string, keys ...func(string) string) {
	t.Helper()
	st, err := meta.Open(conn)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ctx := context.Background()
	for _, key := range keys {
		b, err := st.Get(ctx, key(from))
		if err != nil {
			t.Fatal(err)
		}
		if err := st.Put(ctx, key(to), b); err != nil {
			t.Fatal(err)
		}
	}
}

// TestStoreSwapCannotRedirect: a store writer without the secret copies
// engine C's descriptor and rpc_meta under B's name. A's open of B fails
// naming B and why, A's notification to B fails, and C receives neither a
// byte nor a notification. (Before descriptors were authenticated and the
// session proved the server's segment, the WRITE meant for B completed in
// C's memory and the notification reached C.)
func TestStoreSwapCannotRedirect(t *testing.T) {
	k := newIdentityCluster(t, nil)
	copyUnder(t, k.conn, "C", "B", meta.KeyRAM, meta.KeyRPC)

	_, err := k.a.OpenSegment("B")
	wantCode(t, "open of B with C's descriptor", err, errs.Unauthenticated, `"B"`, "copied from another segment")
	err = k.a.SendNotify("B", "kv", "ready")
	wantCode(t, "notify to B with C's rpc_meta", err, errs.Unauthenticated, `"B"`)
	time.Sleep(50 * time.Millisecond)
	if n := k.c.Notifies(); len(n) != 0 {
		t.Fatalf("C received %v", n)
	}
	if bytes.Count(k.cBuf, []byte{'C'}) != len(k.cBuf) {
		t.Fatal("C's memory changed")
	}
	if st := k.a.Stats(); st.RefusedRecords == 0 {
		t.Fatal("refused records not counted")
	}
}

// TestStoreSwapAllowedMooncake: with AllowMooncakeWithSecret an unsigned
// rpc_meta is taken (Mooncake engines sign nothing), so a store writer can
// point B's at C's control port: the session C opens proves it is segment
// C, and A sends it nothing meant for B.
func TestStoreSwapAllowedMooncake(t *testing.T) {
	k := newIdentityCluster(t, func(c *engine.Config) { c.AllowMooncakeWithSecret = true })
	st, err := meta.Open(k.conn)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	_, port, _ := net.SplitHostPort(k.c.RPCAddr())
	p, _ := strconv.Atoi(port)
	if err := st.Put(context.Background(), meta.KeyRPC("B"), meta.EncodeRPCMeta("127.0.0.1", p)); err != nil {
		t.Fatal(err)
	}
	err = k.a.SendNotify("B", "kv", "ready")
	wantCode(t, "notify to B at C's port", err, errs.Unauthenticated, `segment "C"`, `not "B"`)
	if n := k.c.Notifies(); len(n) != 0 {
		t.Fatalf("C received %v", n)
	}
	_, err = k.a.Probe("B")
	wantCode(t, "probe of B at C's port", err, errs.Unauthenticated, `segment "C"`)
}

// forward relays every connection to ln on to dst: a connection redirected
// on the path.
func forward(t *testing.T, dst string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		conns []net.Conn
	)
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			d, err := net.Dial("tcp", dst)
			if err != nil {
				c.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, c, d)
			mu.Unlock()
			wg.Add(2)
			go func() { defer wg.Done(); io.Copy(d, c); d.Close() }()
			go func() { defer wg.Done(); io.Copy(c, d); c.Close() }()
		}
	}()
	return ln.Addr().String()
}

// TestPeerToPeerRedirectRefused: in peer-to-peer mode a segment is named by
// its address; a party on the path that sends A's connections for segment
// X to engine C (which holds the secret) gets nothing to C: the session
// proves C's name, which is not X.
func TestPeerToPeerRedirectRefused(t *testing.T) {
	c := newEngine(t, func(cfg *engine.Config) { cfg.Transports, cfg.AuthSecret = []string{"tcp"}, secretA })
	a := newEngine(t, func(cfg *engine.Config) { cfg.Transports, cfg.AuthSecret = []string{"tcp"}, secretA })
	x := forward(t, c.RPCAddr())
	err := a.SendNotify(x, "kv", "ready")
	wantCode(t, "notify redirected to C", err, errs.Unauthenticated, "not "+strconv.Quote(x))
	_, err = a.OpenSegment(x)
	wantCode(t, "open redirected to C", err, errs.Unauthenticated)
	if n := c.Notifies(); len(n) != 0 {
		t.Fatalf("C received %v", n)
	}
	// The segment itself, by its own name, is reached.
	if err := a.SendNotify(c.Name(), "kv", "ready"); err != nil {
		t.Fatal(err)
	}
}
