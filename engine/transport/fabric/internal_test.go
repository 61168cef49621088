package fabric

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tecache/te/engine/segment"
	"github.com/tecache/te/engine/transport"
	"github.com/tecache/te/engine/transport/internal/rails"
	"github.com/tecache/te/internal/errs"
	fab "github.com/tecache/te/internal/sys/fabric"
)

// stubHost is the part of transport.Host the endpoint exchange reads.
type stubHost struct{ transport.Host }

func (stubHost) Instance() string { return "b-1" }

func (stubHost) Logf(string, ...any) {}

// With a secret, the endpoint exchange must name the segment and instance
// its session proved: another engine holding the secret cannot be counted
// as someone else.
func TestHandshakeProvenCaller(t *testing.T) {
	tr := &Transport{h: stubHost{}}
	body, _ := json.Marshal(hello{Instance: "a-1", Segment: "a", To: "someone-else", NIC: "x", Addr: []byte{1}})
	for name, by := range map[string]segment.Caller{
		"another instance": {Name: "a", Instance: "mallory-1", Known: true},
		"another segment":  {Name: "mallory", Instance: "a-1", Known: true},
	} {
		_, err := tr.handleHandshake(transport.WithCaller(context.Background(), by), body)
		if !errors.Is(err, errs.ErrUnauthenticated) {
			t.Fatalf("%s: %v, want Unauthenticated", name, err)
		}
	}
	// The proven caller passes the check (and is then told it named
	// another instance than this engine's).
	ctx := transport.WithCaller(context.Background(), segment.Caller{Name: "a", Instance: "a-1", Known: true})
	if _, err := tr.handleHandshake(ctx, body); errs.CodeOf(err) != errs.StaleDescriptor {
		t.Fatalf("the proven peer: %v, want StaleDescriptor (To names another instance)", err)
	}
	// Without a secret nothing is proven and the body is taken as it is.
	if _, err := tr.handleHandshake(context.Background(), body); errs.CodeOf(err) != errs.StaleDescriptor {
		t.Fatalf("no secret: %v", err)
	}
}

func TestStallTimeoutOption(t *testing.T) {
	parse := func(v string) (Options, error) {
		return parseOptions(func(k string) (string, bool) {
			if k == "fabric.stall_timeout" && v != "" {
				return v, true
			}
			return "", false
		}, func(string) string { return "" })
	}
	o, err := parse("")
	if err != nil || o.StallTimeout != -1 {
		t.Fatalf("default: %v %v, want -1 (by provider)", o.StallTimeout, err)
	}
	for v, want := range map[string]time.Duration{"0": 0, "250ms": 250 * time.Millisecond, "2s": 2 * time.Second} {
		if o, err := parse(v); err != nil || o.StallTimeout != want {
			t.Errorf("%s: %v %v", v, o.StallTimeout, err)
		}
	}
	for _, v := range []string{"-1s", "10us", "soon"} {
		if _, err := parse(v); errs.CodeOf(err) != errs.InvalidArgument {
			t.Errorf("%s: %v, want InvalidArgument", v, err)
		}
	}
	if !silentRefusal("shm") || silentRefusal("tcp") || silentRefusal("efa") {
		t.Error("only shm drops refused accesses silently")
	}
}

// The stall watchdog's question: which of these keys does the owner no
// longer hold.
func TestKeyCheck(t *testing.T) {
	r := &segment.Region{}
	tr := &Transport{h: stubHost{}, regs: map[*segment.Region][]*fab.MR{r: {{Key: 7}, {Key: 8}}}}
	body, _ := json.Marshal(hello{Instance: "a-1", To: "b-1", Check: []uint64{7, 9, 8, 10}})
	rep, err := tr.handleHandshake(context.Background(), body)
	if err != nil {
		t.Fatal(err)
	}
	var h hello
	if err := json.Unmarshal(rep, &h); err != nil {
		t.Fatal(err)
	}
	if len(h.Stale) != 2 || h.Stale[0] != 9 || h.Stale[1] != 10 {
		t.Fatalf("stale %v, want [9 10]", h.Stale)
	}
	// Asked of a restarted owner: StaleDescriptor, as an exchange is.
	body, _ = json.Marshal(hello{Instance: "a-1", To: "b-0", Check: []uint64{7}})
	if _, err := tr.handleHandshake(context.Background(), body); errs.CodeOf(err) != errs.StaleDescriptor {
		t.Fatalf("check for another instance: %v", err)
	}
	body, _ = json.Marshal(hello{Instance: "a-1", To: "b-1", Check: make([]uint64, maxCheck+1)})
	if _, err := tr.handleHandshake(context.Background(), body); errs.CodeOf(err) != errs.Protocol {
		t.Fatalf("an oversized check: %v", err)
	}
}

// Requests stripe over NIC k to the peer's NIC k, the shorter list
// wrapping around, and only over NICs of the peer that share the provider.
func TestNICPairs(t *testing.T) {
	nics := func(n int) []*nic {
		var out []*nic
		for i := range n {
			out = append(out, &nic{idx: i, prov: "tcp;ofi_rxm"})
		}
		return out
	}
	peer := func(provs ...string) []nicDesc {
		var out []nicDesc
		for _, p := range provs {
			out = append(out, nicDesc{Provider: p})
		}
		return out
	}
	const tcp = "tcp;ofi_rxm"
	for _, c := range []struct {
		local int
		nd    []nicDesc
		want  []nicPair
	}{
		{1, peer(tcp), []nicPair{{0, 0}}},
		{2, peer(tcp, tcp), []nicPair{{0, 0}, {1, 1}}},
		{2, peer(tcp), []nicPair{{0, 0}, {1, 0}}},
		{1, peer(tcp, tcp, tcp), []nicPair{{0, 0}, {0, 1}, {0, 2}}},
		{2, peer("efa", tcp, tcp), []nicPair{{0, 1}, {1, 2}}},
	} {
		tr := &Transport{nics: nics(c.local)}
		got, err := tr.pairs(&segment.Desc{Name: "b"}, c.nd)
		if err != nil || !slices.Equal(got, c.want) {
			t.Errorf("%d NICs to %v: %v, %v; want %v", c.local, c.nd, got, err, c.want)
		}
	}
	tr := &Transport{nics: nics(2)}
	if _, err := tr.pairs(&segment.Desc{Name: "b"}, peer("efa")); errs.CodeOf(err) != errs.TransportUnavailable {
		t.Errorf("no shared provider: %v, want TransportUnavailable", err)
	}
}

// NIC pairs to a peer that keep failing with no bytes moved between them
// make the whole peer unreachable over fabric (PeerUnreachable, so the
// engine takes tcp for it), and only that peer; bytes moved reset the
// count; each endpoint counts once (all its operations fail together when
// its connection drops); and failures must go on for peerHealth.MinSpan,
// so one moment's burst does not send a live peer away.
func TestPeerCooldown(t *testing.T) {
	defer func(h rails.Health) { peerHealth = h }(peerHealth)
	peerHealth.MinSpan = 100 * time.Millisecond
	tr := New()
	tr.h = stubHost{}
	tr.nics = []*nic{{name: "n0"}, {name: "n1"}}
	ep := func(inst string, li int) *peerEP {
		tr.mu.Lock()
		defer tr.mu.Unlock()
		return &peerEP{t: tr, n: tr.nics[li], key: epKey{instance: inst, local: li, remote: li}, peerName: inst,
			health: tr.peerLocked(inst)}
	}
	reachable := func(what string) {
		t.Helper()
		if err := tr.cooling("a-1"); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	ep("b-1", 0)
	reachable("no failure")
	tr.railFailed(ep("a-1", 0))
	tr.railFailed(ep("a-1", 1))
	// Bytes moved to a: the failures before them no longer count.
	ep("a-1", 0).health.OK(rails.Now())
	a0 := ep("a-1", 0)
	tr.railFailed(a0)
	tr.railFailed(ep("a-1", 1))
	reachable("two failures since bytes moved")
	tr.railFailed(ep("a-1", 0))
	reachable("three failures within MinSpan")
	time.Sleep(peerHealth.MinSpan)
	tr.railFailed(a0)
	tr.railFailed(a0)
	reachable("the same endpoint failing again")
	tr.railFailed(ep("a-1", 1))
	err := tr.cooling("a-1")
	if !errors.Is(err, errs.ErrPeerUnreachable) || !strings.Contains(err.Error(), "fabric") {
		t.Fatalf("failures over MinSpan with nothing moved: %v, want PeerUnreachable naming fabric", err)
	}
	if err := tr.cooling("b-1"); err != nil {
		t.Fatalf("another peer: %v", err)
	}
	// Once the cooldown is over, the peer is reachable again.
	tr.coolingUntil.Store(rails.Now() - 1)
	reachable("after the cooldown")
}

// Providers whose endpoints are not reached by an IP address (shm, EFA,
// Slingshot) are looked up without the engine's address: an EFA host's
// engine runs on its IP, which no EFA domain answers to.
func TestAddresslessProviders(t *testing.T) {
	for p, want := range map[string]bool{"efa": true, "EFA": true, "cxi": true, "shm": true, "tcp": false, "sockets": false, "verbs": false} {
		if addressless(p) != want {
			t.Errorf("addressless(%q) = %v, want %v", p, !want, want)
		}
	}
}
