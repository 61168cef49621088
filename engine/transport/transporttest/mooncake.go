package transporttest

import (
	"encoding/json"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tecache/te/internal/wire"
)

// mcFront is a Mooncake engine's handshake listener in front of an
// in-process te peer that accepts Mooncake peers: it closes te's own opening
// unanswered (Mooncake's listener takes it for its old untyped handshake),
// so the initiator falls back to Mooncake's Metadata exchange, and answers
// each Metadata request with the peer's descriptor as of that request, in
// the JSON a Mooncake engine publishes (no te fields). The initiator then
// holds a Mooncake descriptor and reaches the peer's data listener in
// Mooncake's tcp framing.
type mcFront struct {
	ln       net.Listener
	peer     *inproc
	metadata atomic.Int64 // Metadata requests answered
	refused  atomic.Int64 // te openings closed unanswered
	wg       sync.WaitGroup
}

// mcDesc is a Mooncake engine's published descriptor (tcp).
type mcDesc struct {
	Name            string     `json:"name"`
	Protocol        string     `json:"protocol"`
	TCPDataPort     int        `json:"tcp_data_port"`
	TCPProtoVersion int        `json:"tcp_proto_version"`
	Timestamp       string     `json:"timestamp"`
	Devices         []struct{} `json:"devices"`
	Buffers         []mcBuffer `json:"buffers"`
}

type mcBuffer struct {
	Name   string `json:"name"`
	Addr   uint64 `json:"addr"`
	Length uint64 `json:"length"`
}

func newMcFront(t testing.TB, p *inproc) *mcFront {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &mcFront{ln: ln, peer: p}
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			// One connection at a time, as Mooncake's listener serves.
			f.serve(nc)
		}
	}()
	t.Cleanup(f.close)
	return f
}

// name is the segment name the initiator opens: the listener's address, as
// a Mooncake engine's name is in peer-to-peer mode.
func (f *mcFront) name() string { return f.ln.Addr().String() }

func (f *mcFront) close() {
	f.ln.Close()
	f.wg.Wait()
}

func (f *mcFront) serve(nc net.Conn) {
	defer nc.Close()
	nc.SetDeadline(time.Now().Add(5 * time.Second))
	kind, body, err := wire.ReadFrame(nc, wire.MooncakeMaxHandshake)
	if err != nil {
		return
	}
	if kind != wire.KindMooncakeMetadata || !json.Valid(body) {
		f.refused.Add(1)
		return
	}
	reply, err := f.describe()
	if err != nil {
		return
	}
	nc.Write(wire.AppendFrame(nil, kind, reply))
	if tc, ok := nc.(*net.TCPConn); ok {
		tc.CloseWrite()
	}
	io.Copy(io.Discard, nc) // Mooncake waits for the client to close
	f.metadata.Add(1)
}

// describe is the peer's current descriptor in Mooncake's JSON: its data
// port and its buffers (their addresses do not change when it re-registers,
// but what it registers is read at each request all the same).
func (f *mcFront) describe() ([]byte, error) {
	f.peer.mu.Lock()
	e := f.peer.e
	f.peer.mu.Unlock()
	if e == nil {
		return nil, io.ErrClosedPipe
	}
	d := e.Descriptor()
	v := mcDesc{Name: f.name(), Protocol: "tcp", TCPDataPort: d.TCPDataPort, TCPProtoVersion: 2,
		Timestamp: time.Now().UTC().Format("2006-01-02 15:04:05.000000"), Devices: []struct{}{}}
	for _, b := range d.Buffers {
		v.Buffers = append(v.Buffers, mcBuffer{Name: f.name(), Addr: b.Addr, Length: b.Length})
	}
	return json.Marshal(v)
}
