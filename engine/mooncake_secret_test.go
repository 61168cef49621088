package engine_test

import (
	"bytes"
	"context"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/tecache/te/engine"
	"github.com/tecache/te/engine/meta"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/sys/mem"
	"github.com/tecache/te/internal/wire"
)

const mcSecret = "s3cret-cluster-secret-0123"

// mcDescriptor is a Mooncake engine's descriptor for one buffer, served
// by a tcp data listener on dataPort.
func mcDescriptor(name string, dataPort int, buf []byte) []byte {
	return []byte(`{"name":"` + name + `","protocol":"tcp","tcp_data_port":` + strconv.Itoa(dataPort) +
		`,"tcp_proto_version":2,"timestamp":"2026-01-01 00:00:00.000000","buffers":[{"name":"cpu:0","addr":` +
		strconv.FormatUint(mem.Addr(buf), 10) + `,"length":` + strconv.Itoa(len(buf)) + `}]}`)
}

// TestNoMooncakeFallbackWithSecret: with a cluster secret an engine never
// takes a te call closed unanswered for a Mooncake peer, even with
// AllowMooncakeWithSecret and AcceptMooncakePeers: whoever can cut a
// connection (an attacker on the path, or a listener put where a te engine
// was) could otherwise make it speak Mooncake's unauthenticated handshake.
// The peer here closes te's opening and would answer Mooncake's Metadata,
// Notify and Probe: it gets te's opening only.
func TestNoMooncakeFallbackWithSecret(t *testing.T) {
	f := newFakeMooncake(t)
	name := f.ln.Addr().String()
	f.desc = mcDescriptor(name, 1, make([]byte, 4096))
	e := newEngine(t, func(c *engine.Config) {
		c.Transports = []string{"tcp"}
		c.AuthSecret, c.AllowMooncakeWithSecret, c.AcceptMooncakePeers = mcSecret, true, true
	})
	if _, err := e.OpenSegment(name); err == nil {
		t.Fatal("opened a segment whose te handshake was closed unanswered")
	}
	if err := e.SendNotify(name, "te", "kv ready"); err == nil {
		t.Fatal("notified a peer whose te handshake was closed unanswered")
	}
	if _, err := e.Probe(name); err == nil {
		t.Fatal("probed a peer whose te handshake was closed unanswered")
	}
	k := f.kinds()
	if len(k) < 3 {
		t.Fatalf("exchanges %v: the engine did not try te's way", k)
	}
	for _, kind := range k {
		if kind != wire.KindAuth {
			t.Fatalf("exchanges %v: the engine with a secret spoke Mooncake's handshake", k)
		}
	}
}

// TestMooncakeDescriptorInStoreWithSecret: a party that can write the
// metadata store but holds no secret rewrites a segment's descriptor into a
// Mooncake engine's, pointing at itself (here a te engine that serves
// Mooncake initiators stands in for it). An engine with a secret refuses
// the segment instead of reading and writing it unauthenticated; with
// AllowMooncakeWithSecret (the operator trusts the network for Mooncake
// peers) and without a secret it is reached as before.
func TestMooncakeDescriptorInStoreWithSecret(t *testing.T) {
	atk := newEngine(t, func(c *engine.Config) { c.Transports = []string{"tcp"}; c.AcceptMooncakePeers = true })
	abuf := alloc(t, 64<<10)
	if err := atk.RegisterMemory(mem.Addr(abuf), uint64(len(abuf)), "cpu", true); err != nil {
		t.Fatal(err)
	}
	conn := "mem://mooncake-downgrade-" + strconv.FormatInt(time.Now().UnixNano(), 10)
	st, err := meta.Open(conn)
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(atk.RPCAddr())
	rpcPort, _ := strconv.Atoi(port)
	ctx := context.Background()
	if err := st.Put(ctx, meta.KeyRAM("victim"), mcDescriptor("victim", atk.Descriptor().TCPDataPort, abuf)); err != nil {
		t.Fatal(err)
	}
	if err := st.Put(ctx, meta.KeyRPC("victim"), meta.EncodeRPCMeta("127.0.0.1", rpcPort)); err != nil {
		t.Fatal(err)
	}

	n := 0
	initiator := func(mod func(c *engine.Config)) *engine.Engine {
		n++
		return newEngine(t, func(c *engine.Config) {
			c.Transports, c.Metadata, c.SegmentName = []string{"tcp"}, conn, "initiator-"+strconv.Itoa(n)
			mod(c)
		})
	}
	secret := initiator(func(c *engine.Config) { c.AuthSecret = mcSecret })
	_, err = secret.OpenSegment("victim")
	if errs.CodeOf(err) != errs.Unauthenticated || !bytes.Contains([]byte(err.Error()), []byte("Mooncake")) {
		t.Fatalf("engine with a secret opening a Mooncake descriptor: %v", err)
	}

	for what, mod := range map[string]func(c *engine.Config){
		"allowed":   func(c *engine.Config) { c.AuthSecret, c.AllowMooncakeWithSecret = mcSecret, true },
		"no secret": func(c *engine.Config) {},
	} {
		e := initiator(mod)
		seg, err := e.OpenSegment("victim")
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		local := alloc(t, 4096)
		copy(local, what)
		if err := e.RegisterMemory(mem.Addr(local), 4096, "cpu", false); err != nil {
			t.Fatal(err)
		}
		b, _ := e.AllocateBatch(1)
		if err := b.Submit(engine.Request{Op: engine.Write, Local: mem.Addr(local), Segment: seg, Remote: mem.Addr(abuf), Length: 4096}); err != nil {
			t.Fatal(err)
		}
		if s, err := b.Wait(10 * time.Second); err != nil || s.State != engine.Completed || !bytes.Equal(abuf[:4096], local) {
			t.Fatalf("%s: write to the Mooncake peer: %+v %v", what, s, err)
		}
		b.Free()
	}
}

// TestEncryptNeverMooncake: an engine with TE_ENCRYPT never talks to a
// Mooncake (plaintext) peer, even with AllowMooncakeWithSecret: a store
// rewrite that turns a segment into a Mooncake one is refused by name
// (before, the encrypting engine wrote KV in the clear to a listener
// without the secret and the task COMPLETED), and accepting Mooncake peers
// with encryption fails engine creation.
func TestEncryptNeverMooncake(t *testing.T) {
	atk := newEngine(t, func(c *engine.Config) { c.Transports = []string{"tcp"}; c.AcceptMooncakePeers = true })
	abuf := alloc(t, 64<<10)
	if err := atk.RegisterMemory(mem.Addr(abuf), uint64(len(abuf)), "cpu", true); err != nil {
		t.Fatal(err)
	}
	conn := "mem://encrypt-mooncake-" + strconv.FormatInt(time.Now().UnixNano(), 10)
	st, err := meta.Open(conn)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	_, port, _ := net.SplitHostPort(atk.RPCAddr())
	rpcPort, _ := strconv.Atoi(port)
	ctx := context.Background()
	if err := st.Put(ctx, meta.KeyRAM("victim"), mcDescriptor("victim", atk.Descriptor().TCPDataPort, abuf)); err != nil {
		t.Fatal(err)
	}
	if err := st.Put(ctx, meta.KeyRPC("victim"), meta.EncodeRPCMeta("127.0.0.1", rpcPort)); err != nil {
		t.Fatal(err)
	}
	e := newEngine(t, func(c *engine.Config) {
		c.Transports, c.Metadata, c.SegmentName = []string{"tcp"}, conn, "encrypting"
		c.AuthSecret, c.AllowMooncakeWithSecret, c.Encrypt = mcSecret, true, true
	})
	_, err = e.OpenSegment("victim")
	if errs.CodeOf(err) != errs.Unauthenticated || !bytes.Contains([]byte(err.Error()), []byte(`"victim"`)) || !bytes.Contains([]byte(err.Error()), []byte("encrypts")) {
		t.Fatalf("encrypting engine opening a Mooncake descriptor: %v", err)
	}
	if err := e.SendNotify("victim", "kv", "ready"); err == nil {
		t.Fatal("encrypting engine notified a Mooncake peer")
	}
	_, err = engine.New(engine.Config{ListenAddr: "127.0.0.1:0", Transports: []string{"tcp"}, AuthSecret: mcSecret,
		AllowMooncakeWithSecret: true, AcceptMooncakePeers: true, Encrypt: true})
	if errs.CodeOf(err) != errs.InvalidArgument {
		t.Fatalf("encryption with Mooncake peers accepted: %v", err)
	}
}
