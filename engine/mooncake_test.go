package engine_test

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tecache/te/engine"
	"github.com/tecache/te/internal/sys/mem"
	"github.com/tecache/te/internal/wire"
)

// mcExchange speaks one exchange of Mooncake's handshake to addr, as a
// Mooncake engine does; ok is false when the peer closed without a reply.
func mcExchange(t *testing.T, addr string, frame []byte) (kind uint8, body []byte, ok bool) {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	nc.SetDeadline(time.Now().Add(10 * time.Second))
	nc.Write(frame)
	kind, body, err = wire.ReadMooncakeFrame(bufio.NewReader(nc), 16<<20)
	if err != nil {
		if ne, isNet := err.(net.Error); isNet && ne.Timeout() {
			t.Fatal("no reply and no close")
		}
		return 0, nil, false
	}
	return kind, body, true
}

// TestMooncakeHandshake: te's RPC listener answers Mooncake's Metadata,
// Notify and Probe with Mooncake's semantics (one exchange per connection,
// no keys in the descriptor, the notification queued like te's), refuses
// what Mooncake would not send, and still serves te's own calls.
func TestMooncakeHandshake(t *testing.T) {
	e := newEngine(t, func(c *engine.Config) { c.Transports = []string{"tcp"}; c.MaxNotifies = 2 })
	buf := alloc(t, 1<<20)
	if err := e.RegisterMemory(mem.Addr(buf), 1<<20, "cpu", true); err != nil {
		t.Fatal(err)
	}
	k, body, ok := mcExchange(t, e.RPCAddr(), wire.AppendFrame(nil, wire.KindMooncakeMetadata, []byte(`{"name":"mc:1"}`)))
	if !ok || k != wire.KindMooncakeMetadata {
		t.Fatalf("metadata: kind %d ok %v", k, ok)
	}
	if bytes.Contains(body, []byte("te_key")) || bytes.Contains(body, []byte(`"rdma"`)) {
		t.Fatalf("descriptor for a Mooncake peer carries keys or another protocol: %s", body)
	}
	var d struct {
		Name     string `json:"name"`
		Protocol string `json:"protocol"`
		Port     int    `json:"tcp_data_port"`
		Version  *int   `json:"tcp_proto_version"`
		Buffers  []struct {
			Name   string `json:"name"`
			Addr   uint64 `json:"addr"`
			Length uint64 `json:"length"`
		} `json:"buffers"`
	}
	if err := json.Unmarshal(body, &d); err != nil {
		t.Fatal(err)
	}
	if d.Name != e.Name() || d.Protocol != "tcp" || d.Port == 0 || d.Version == nil || *d.Version != 2 ||
		len(d.Buffers) != 1 || d.Buffers[0].Addr != mem.Addr(buf) || d.Buffers[0].Length != 1<<20 || d.Buffers[0].Name == "" {
		t.Fatalf("descriptor %s", body)
	}

	k, body, ok = mcExchange(t, e.RPCAddr(), wire.AppendFrame(nil, wire.KindMooncakeProbe, []byte(`{}`)))
	if !ok || k != wire.KindMooncakeProbe || string(body) != `{"status":"success"}` {
		t.Fatalf("probe: %d %s %v", k, body, ok)
	}
	k, body, ok = mcExchange(t, e.RPCAddr(), wire.AppendFrame(nil, wire.KindMooncakeNotify, []byte(`{"name":"mc:1","notify_msg":"kv ready"}`)))
	if !ok || k != wire.KindMooncakeNotify || string(body) != `{"name":"","notify_msg":"success"}` {
		t.Fatalf("notify: %d %s %v", k, body, ok)
	}
	if n := e.Notifies(); len(n) != 1 || n[0] != (engine.Notification{Name: "mc:1", Msg: "kv ready"}) {
		t.Fatalf("notifications %+v", n)
	}
	// The engine's notify bound holds for Mooncake peers: the third one
	// (MaxNotifies 2) is refused by closing, Mooncake's only way to fail.
	for i := range 3 {
		_, _, ok := mcExchange(t, e.RPCAddr(), wire.AppendFrame(nil, wire.KindMooncakeNotify, []byte(`{"name":"x","notify_msg":"y"}`)))
		if ok != (i < 2) {
			t.Fatalf("notify %d with a queue of 2: answered %v", i, ok)
		}
	}
	refused := map[string][]byte{
		"connection kind":  wire.AppendFrame(nil, wire.KindMooncakeConnection, []byte(`{}`)),
		"not json":         wire.AppendFrame(nil, wire.KindMooncakeMetadata, []byte(`{"name":`)),
		"over 1 MiB":       binary.LittleEndian.AppendUint64(nil, wire.MooncakeMaxHandshake+1),
		"long notify name": wire.AppendFrame(nil, wire.KindMooncakeNotify, []byte(`{"name":"`+strings.Repeat("n", 5000)+`"}`)),
	}
	refused["over 1 MiB"] = append(refused["over 1 MiB"], wire.KindMooncakeMetadata)
	for what, f := range refused {
		if _, _, ok := mcExchange(t, e.RPCAddr(), f); ok {
			t.Errorf("%s: answered", what)
		}
	}
	// te's own calls on the same listener.
	peer := newEngine(t, func(c *engine.Config) { c.Transports = []string{"tcp"} })
	s, err := peer.OpenSegment(e.Name())
	if err != nil {
		t.Fatal(err)
	}
	if pd, _ := s.Descriptor(); pd.IsMooncake() || pd.Buffers[0].Key == 0 {
		t.Fatalf("te peer got %+v", pd)
	}
}

// TestMooncakeHandshakeWithSecret: with a cluster secret, Mooncake peers get
// nothing (they cannot authenticate) unless explicitly allowed and
// accepted: AllowMooncakeWithSecret alone answers nothing.
func TestMooncakeHandshakeWithSecret(t *testing.T) {
	shut := newEngine(t, func(c *engine.Config) { c.Transports = []string{"tcp"}; c.AuthSecret = "s3cret-cluster-secret-0123" })
	allowed := newEngine(t, func(c *engine.Config) {
		c.Transports = []string{"tcp"}
		c.AuthSecret, c.AllowMooncakeWithSecret = "s3cret-cluster-secret-0123", true
	})
	open := newEngine(t, func(c *engine.Config) {
		c.Transports = []string{"tcp"}
		c.AuthSecret, c.AllowMooncakeWithSecret, c.AcceptMooncakePeers = "s3cret-cluster-secret-0123", true, true
	})
	for _, k := range []uint8{wire.KindMooncakeMetadata, wire.KindMooncakeNotify, wire.KindMooncakeProbe} {
		f := wire.AppendFrame(nil, k, []byte(`{}`))
		if _, _, ok := mcExchange(t, shut.RPCAddr(), f); ok {
			t.Errorf("kind %d answered with a secret set", k)
		}
		if _, _, ok := mcExchange(t, allowed.RPCAddr(), f); ok {
			t.Errorf("kind %d answered with AllowMooncakeWithSecret but Mooncake peers not accepted", k)
		}
		if _, _, ok := mcExchange(t, open.RPCAddr(), f); !ok {
			t.Errorf("kind %d refused although allowed", k)
		}
	}
}

// fakeMooncake is a Mooncake engine's handshake listener as Mooncake 3b5a594
// has it: one connection at a time, one exchange each; a frame whose type
// byte is above 3 is its old untyped protocol, whose body is not JSON, so the
// connection is closed unanswered.
type fakeMooncake struct {
	ln   net.Listener
	desc []byte
	mu   sync.Mutex
	seen []uint8
	msgs []wire.MooncakeNotify
	wg   sync.WaitGroup
}

func newFakeMooncake(t *testing.T) *fakeMooncake {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeMooncake{ln: ln}
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			f.serve(nc)
		}
	}()
	t.Cleanup(func() { ln.Close(); f.wg.Wait() })
	return f
}

func (f *fakeMooncake) serve(nc net.Conn) {
	defer nc.Close()
	nc.SetDeadline(time.Now().Add(5 * time.Second))
	kind, body, err := wire.ReadFrame(nc, wire.MooncakeMaxHandshake)
	if err != nil {
		return
	}
	f.mu.Lock()
	f.seen = append(f.seen, kind)
	f.mu.Unlock()
	if !json.Valid(body) || kind > wire.KindMooncakeProbe {
		return
	}
	var reply []byte
	switch kind {
	case wire.KindMooncakeMetadata:
		reply = f.desc
	case wire.KindMooncakeNotify:
		n, _ := wire.DecodeMooncakeNotify(body)
		f.mu.Lock()
		f.msgs = append(f.msgs, n)
		f.mu.Unlock()
		reply = wire.MooncakeNotifyReply
	case wire.KindMooncakeProbe:
		reply = wire.MooncakeProbeReply
	default:
		return
	}
	nc.Write(wire.AppendFrame(nil, kind, reply))
	nc.(*net.TCPConn).CloseWrite()
	io.Copy(io.Discard, nc) // Mooncake waits for the client to close
}

func (f *fakeMooncake) kinds() []uint8 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]uint8(nil), f.seen...)
}

// TestOpenMooncakePeer: in peer-to-peer mode te asks a peer te's way first;
// a Mooncake engine closes on that, and te fetches its descriptor with
// Mooncake's Metadata exchange, remembers the peer is Mooncake, moves bytes
// to it in Mooncake's data framing (here served by a te target that accepts
// Mooncake peers, behind the fake Mooncake handshake), and notifies and
// probes it Mooncake's way. With a cluster secret te does not fall back.
func TestOpenMooncakePeer(t *testing.T) {
	tgt := newEngine(t, func(c *engine.Config) { c.Transports = []string{"tcp"}; c.AcceptMooncakePeers = true })
	tbuf := alloc(t, 1<<20)
	if err := tgt.RegisterMemory(mem.Addr(tbuf), 1<<20, "cpu", true); err != nil {
		t.Fatal(err)
	}
	f := newFakeMooncake(t)
	name := f.ln.Addr().String()
	f.desc = []byte(`{"name":"` + name + `","protocol":"tcp","tcp_data_port":` + strconv.Itoa(tgt.Descriptor().TCPDataPort) +
		`,"tcp_proto_version":2,"timestamp":"2026-01-01 00:00:00.000000","buffers":[{"name":"` + name + `","addr":` +
		strconv.FormatUint(mem.Addr(tbuf), 10) + `,"length":1048576}]}`)

	e := newEngine(t, func(c *engine.Config) { c.Transports = []string{"tcp"} })
	s, err := e.OpenSegment(name)
	if err != nil {
		t.Fatal(err)
	}
	d, _ := s.Descriptor()
	if !d.IsMooncake() || d.RPC != name || d.TCPProtoVersion != 2 {
		t.Fatalf("descriptor %+v", d)
	}
	if k := f.kinds(); len(k) != 2 || k[0] != wire.KindAuth || k[1] != wire.KindMooncakeMetadata {
		t.Fatalf("exchanges %v, want te's opening (authentication) then Mooncake's Metadata", k)
	}
	local := alloc(t, 256<<10)
	if err := e.RegisterMemory(mem.Addr(local), 256<<10, "cpu", false); err != nil {
		t.Fatal(err)
	}
	for i := range local {
		local[i] = byte(i*7 + 1)
	}
	b, _ := e.AllocateBatch(2)
	defer b.Free()
	must := func(reqs ...engine.Request) {
		t.Helper()
		if err := b.Submit(reqs...); err != nil {
			t.Fatal(err)
		}
		if st, err := b.Wait(10 * time.Second); err != nil || st.State != engine.Completed {
			t.Fatalf("%+v %v", st, err)
		}
	}
	must(engine.Request{Op: engine.Write, Local: mem.Addr(local), Segment: s, Remote: mem.Addr(tbuf) + 4096, Length: 256 << 10})
	if !bytes.Equal(tbuf[4096:4096+256<<10], local) {
		t.Fatal("write did not land")
	}
	b2, _ := e.AllocateBatch(1)
	defer b2.Free()
	clear(local)
	if err := b2.Submit(engine.Request{Op: engine.Read, Local: mem.Addr(local), Segment: s, Remote: mem.Addr(tbuf) + 4096, Length: 256 << 10}); err != nil {
		t.Fatal(err)
	}
	if st, err := b2.Wait(10 * time.Second); err != nil || st.State != engine.Completed || !bytes.Equal(tbuf[4096:4096+256<<10], local) {
		t.Fatalf("read back: %+v %v", st, err)
	}
	if ts, _ := b2.TaskStatus(0); ts.Transport != "tcp" {
		t.Fatalf("transport %q", ts.Transport)
	}
	if err := e.SendNotify(name, "te", "done"); err != nil {
		t.Fatal(err)
	}
	if p, err := e.Probe(name); err != nil || p.Name != name {
		t.Fatalf("probe %+v %v", p, err)
	}
	// Known now: a second open asks Mooncake's way at once.
	if err := e.CloseSegment(s); err != nil {
		t.Fatal(err)
	}
	if _, err := e.OpenSegment(name); err != nil {
		t.Fatal(err)
	}
	want := []uint8{wire.KindAuth, wire.KindMooncakeMetadata, wire.KindMooncakeNotify, wire.KindMooncakeProbe, wire.KindMooncakeMetadata}
	if k := f.kinds(); !bytes.Equal(k, want) {
		t.Fatalf("exchanges %v, want %v", k, want)
	}
	f.mu.Lock()
	msgs := f.msgs
	f.mu.Unlock()
	if len(msgs) != 1 || msgs[0] != (wire.MooncakeNotify{Name: "te", Msg: "done"}) {
		t.Fatalf("notifications %+v", msgs)
	}

	// A te engine with a cluster secret does not talk to Mooncake peers.
	secret := newEngine(t, func(c *engine.Config) { c.Transports = []string{"tcp"}; c.AuthSecret = "s3cret-cluster-secret-0123" })
	if _, err := secret.OpenSegment(name); err == nil {
		t.Fatal("opened a Mooncake peer with a cluster secret set")
	}
	if k := f.kinds(); len(k) != len(want)+1 || k[len(k)-1] != wire.KindAuth {
		t.Fatalf("exchanges %v: the engine with a secret sent Mooncake's", k)
	}
}
