package engine

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"github.com/tecache/te/engine/segment"
	"github.com/tecache/te/engine/transport"
	"github.com/tecache/te/internal/errs"
)

// fakeT is a transport that declares what a test wants; only the methods
// selection calls do anything.
type fakeT struct {
	transport.Transport
	name        string
	caps        transport.Caps
	unreachable string
}

func (f *fakeT) Name() string         { return f.name }
func (f *fakeT) Caps() transport.Caps { return f.caps }
func (f *fakeT) Reachable(*segment.Desc) error {
	if f.unreachable != "" {
		return errs.New(errs.PeerUnreachable, "reach", "%s", f.unreachable)
	}
	return nil
}

// devT also moves GPU memory, for the buffers named in ok.
type devT struct {
	fakeT
	ok map[string]bool
}

func (d *devT) DeviceMemory(_ *segment.Desc, buf *segment.BufferDesc, _ *segment.Region) bool {
	return d.ok[buf.Name]
}

func pickEngine(t *testing.T, ts ...transport.Transport) (*Engine, *bytes.Buffer) {
	var log bytes.Buffer
	e := &Engine{byName: map[string]transport.Transport{}, segs: map[string]*segState{}}
	e.cfg.Logger = slog.New(slog.NewTextHandler(&log, &slog.HandlerOptions{Level: slog.LevelDebug}))
	for _, x := range ts {
		e.transports = append(e.transports, x)
		e.byName[x.Name()] = x
	}
	return e, &log
}

// TestPickFromCaps: selection follows the declared ranks, memory kinds and
// reach, never names: host memory skips a GPU-only transport, GPU memory
// goes to the best-ranked transport that registered the buffer, a peer
// without a transport or out of its reach is passed over with the reason,
// and the route with its reasons is in the stats and the debug log.
func TestPickFromCaps(t *testing.T) {
	ipc := &devT{fakeT{name: "ipc", caps: transport.Caps{SameHost: true, GPUMemory: true, Rank: 20}, unreachable: "another host"}, map[string]bool{"cuda:0": true}}
	nic := &devT{fakeT{name: "nic", caps: transport.Caps{CrossHost: true, HostMemory: true, GPUMemory: true, Rank: 30}}, map[string]bool{"cuda:0": true}}
	sock := &devT{fakeT{name: "sock", caps: transport.Caps{CrossHost: true, HostMemory: true, GPUMemory: true, Rank: 40}}, map[string]bool{"cuda:0": true, "cuda:1": true}}
	near := &fakeT{name: "near", caps: transport.Caps{SameHost: true, HostMemory: true, Rank: 10}}
	e, log := pickEngine(t, near, ipc, nic, sock)
	d := &segment.Desc{Name: "peer", Transports: []string{"ipc", "nic", "sock"}}
	st := &segState{name: "peer"}
	e.segs["peer"] = st
	host := &segment.Region{Location: segment.Location{Kind: "cpu", Index: -1}}
	gpu := &segment.Region{Location: segment.Location{Kind: "cuda", Index: 0}}
	hostBuf := &segment.BufferDesc{Name: "cpu:0"}

	for _, c := range []struct {
		name  string
		local *segment.Region
		buf   string
		hint  string
		want  string
		code  errs.Code
	}{
		{"host to host: near lacks the peer, ipc moves no host memory", host, "cpu:0", "", "nic", errs.OK},
		{"gpu to gpu: ipc cannot reach, nic registered it", gpu, "cuda:0", "", "nic", errs.OK},
		{"host to gpu", host, "cuda:0", "", "nic", errs.OK},
		{"gpu buffer only sock can move", gpu, "cuda:1", "", "sock", errs.OK},
		{"forced onto a transport that cannot move it", gpu, "cuda:1", "nic", "", errs.NotSupported},
		{"forced onto a transport that is not installed", host, "cpu:0", "carrier-pigeon", "", errs.TransportUnavailable},
		{"forced", host, "cpu:0", "sock", "sock", errs.OK},
	} {
		buf := hostBuf
		if c.buf != "cpu:0" {
			buf = &segment.BufferDesc{Name: c.buf}
		}
		got, err := e.pick(st, d, buf, c.local, &Request{Transport: c.hint})
		if c.code != errs.OK {
			if errs.CodeOf(err) != c.code {
				t.Errorf("%s: %v, want code %v", c.name, err, c.code)
			}
			continue
		}
		if err != nil || got.Name() != c.want {
			t.Errorf("%s: got %v, %v; want %s", c.name, got, err, c.want)
		}
	}
	// Nothing moves GPU memory to this buffer: the error says why, per
	// transport.
	_, err := e.pick(st, d, &segment.BufferDesc{Name: "cuda:7"}, gpu, &Request{})
	if errs.CodeOf(err) != errs.NotSupported || !strings.Contains(err.Error(), "ipc: it cannot move this GPU buffer") ||
		!strings.Contains(err.Error(), "near: the peer does not have it") {
		t.Errorf("no GPU route: %v", err)
	}
	// Nothing reaches the peer at all.
	_, err = e.pick(&segState{name: "x"}, &segment.Desc{Name: "x", Transports: []string{"ipc"}}, hostBuf, host, &Request{})
	if errs.CodeOf(err) != errs.TransportUnavailable || !strings.Contains(err.Error(), "ipc: it does not move host memory") {
		t.Errorf("no host route: %v", err)
	}

	rs := e.routes()
	byMem := map[string]Route{}
	for _, r := range rs {
		byMem[r.Memory] = r
	}
	if h := byMem["host"]; h.Transport != "sock" || h.Segment != "peer" {
		t.Errorf("host route %+v", h)
	}
	if g := byMem["gpu"]; g.Transport != "sock" || len(g.Why) == 0 {
		t.Errorf("gpu route %+v, want sock with the reasons the others were passed over", g)
	}
	if !strings.Contains(log.String(), `msg="te: transport chosen" segment=peer memory=gpu transport=nic`) {
		t.Errorf("no debug line for the route:\n%s", log.String())
	}
}

// TestPickCachesHostRoute: the host-memory choice is computed once per
// descriptor; a new descriptor (the peer restarted), a transport's word that
// its reach changed, or the end of the lease of a choice that passed a
// better transport over chooses again.
func TestPickCachesHostRoute(t *testing.T) {
	a := &fakeT{name: "a", caps: transport.Caps{HostMemory: true, Rank: 1}}
	b := &fakeT{name: "b", caps: transport.Caps{HostMemory: true, Rank: 2}}
	e, _ := pickEngine(t, a, b)
	st := &segState{name: "p"}
	d1 := &segment.Desc{Name: "p", Transports: []string{"a", "b"}}
	hostReg := &segment.Region{Location: segment.Location{Kind: "cpu", Index: -1}}
	buf := &segment.BufferDesc{Name: "cpu:0"}
	if got, _ := e.pick(st, d1, buf, hostReg, &Request{}); got != a {
		t.Fatalf("picked %v", got)
	}
	a.unreachable = "gone"
	if got, _ := e.pick(st, d1, buf, hostReg, &Request{}); got != a {
		t.Fatalf("same descriptor: picked %v, want the cached a", got)
	}
	d2 := &segment.Desc{Name: "p", Transports: []string{"a", "b"}}
	if got, _ := e.pick(st, d2, buf, hostReg, &Request{}); got != b {
		t.Fatalf("new descriptor: picked %v, want b", got)
	}
	// a comes back: b, which passed a over, is kept only for a while.
	a.unreachable = ""
	if got, _ := e.pick(st, d2, buf, hostReg, &Request{}); got != b {
		t.Fatalf("within the lease: picked %v, want the cached b", got)
	}
	pc := *st.pick[0].Load()
	pc.until = 1 // the lease ran out
	st.pick[0].Store(&pc)
	if got, _ := e.pick(st, d2, buf, hostReg, &Request{}); got != a {
		t.Fatalf("after the lease: picked %v, want a again", got)
	}
	// A transport says its reach changed: the cached a goes at once,
	// though a choice of the best-ranked transport has no lease.
	if st.pick[0].Load().until != 0 {
		t.Fatal("the best-ranked choice has a lease")
	}
	a.unreachable = "cooling down"
	e.reachEpoch.Add(1) // what host.ReachChanged does
	if got, _ := e.pick(st, d2, buf, hostReg, &Request{}); got != b {
		t.Fatalf("after ReachChanged: picked %v, want b", got)
	}
}
