package rdma

import (
	"errors"
	"fmt"
	"github.com/tecache/te/engine/transport/internal/rails"
	"reflect"
	"testing"
	"time"

	"github.com/tecache/te/engine/segment"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/sys/ibv"
)

func TestPlanSlices(t *testing.T) {
	if sliceCount(0, 64<<10) != 0 {
		t.Fatal("zero length gave slices")
	}
	for _, c := range []struct{ length, size uint64 }{
		{1, 64 << 10}, {64 << 10, 64 << 10}, {64<<10 + 1, 64 << 10}, {10 << 20, 64 << 10}, {1000, 7},
	} {
		k := sliceCount(c.length, c.size)
		if want := int((c.length + c.size - 1) / c.size); k != want {
			t.Fatalf("%+v: %d slices, want %d", c, k, want)
		}
		var next uint64
		for i := 0; i < k; i++ {
			off, n := sliceAt(c.length, c.size, i)
			if off != next || n == 0 || n > c.size || (i < k-1 && n != c.size) {
				t.Fatalf("%+v: slice %d = %d+%d", c, i, off, n)
			}
			next += n
		}
		if next != c.length {
			t.Fatalf("%+v: slices cover %d bytes", c, next)
		}
	}
}

// testPeer is a peerInfo of n local and m peer NICs (all InfiniBand), for
// the planning logic alone.
func testPeer(t *testing.T, n, m int) (*Transport, *peerInfo) {
	t.Helper()
	tr := New()
	for i := 0; i < n; i++ {
		tr.local = append(tr.local, nicInfo{name: fmt.Sprintf("l%d", i), link: "ib"})
	}
	d := &segment.Desc{Name: "peer", Instance: "p1"}
	for j := 0; j < m; j++ {
		d.Devices = append(d.Devices, segment.Device{Name: fmt.Sprintf("r%d", j), GID: formatGID(ibv.GID{0xfe, 0x80, 15: byte(j)})})
	}
	pi := tr.peerOf(d)
	if pi.err != nil || len(pi.rails) != n*m {
		t.Fatalf("%v: %d rails", pi.err, len(pi.rails))
	}
	return tr, pi
}

func railNames(pi *peerInfo, xs []int32) []string {
	var out []string
	for _, x := range xs {
		out = append(out, pi.rails[x].lname+">"+pi.rails[x].rname)
	}
	return out
}

// Tier 0 pairs the near NICs of both sides (the shorter list cycled); tier
// 1 is every other rail, those with a near end first.
func TestBuildPlan(t *testing.T) {
	_, pi := testPeer(t, 4, 4)
	p := pi.buildPlan(&localTiers{pref: []int{2}, other: []int{0, 1, 3}}, []int{1})
	if got := railNames(pi, p.tier0); !reflect.DeepEqual(got, []string{"l2>r1"}) {
		t.Fatalf("tier 0 %v", got)
	}
	if len(p.tier1) != 15 {
		t.Fatalf("tier 1 has %d rails", len(p.tier1))
	}
	for _, x := range p.tier1[:6] { // l2 or r1 at one end
		if r := pi.rails[x]; r.lname != "l2" && r.rname != "r1" {
			t.Fatalf("tier 1 starts with %v", railNames(pi, p.tier1[:6]))
		}
	}
	p = pi.buildPlan(&localTiers{pref: []int{0, 1}}, []int{2, 3, 0})
	if got := railNames(pi, p.tier0); !reflect.DeepEqual(got, []string{"l0>r2", "l1>r3", "l0>r0"}) {
		t.Fatalf("tier 0 %v", got)
	}
	// No near NIC here (a socket without one), no hint there: all of them.
	p = pi.buildPlan(&localTiers{other: []int{0, 1, 2, 3}}, nil)
	if got := railNames(pi, p.tier0); !reflect.DeepEqual(got, []string{"l0>r0", "l1>r1", "l2>r2", "l3>r3"}) {
		t.Fatalf("tier 0 %v", got)
	}
	// Link layers pair only with their own kind.
	tr := New()
	tr.local = []nicInfo{{"e0", "eth"}, {"i0", "ib"}}
	d := &segment.Desc{Name: "x", Instance: "x1", Devices: []segment.Device{{Name: "i9", GID: formatGID(ibv.GID{0xfe, 0x80})}}}
	if pi := tr.peerOf(d); len(pi.rails) != 1 || pi.rails[0].lname != "i0" {
		t.Fatalf("rails %v", railNames(pi, []int32{0}))
	}
	d = &segment.Desc{Name: "y", Instance: "y1", Devices: []segment.Device{{Name: "e9", GID: formatGID(ibv.GID{0xfe, 0x80})}},
		Endpoints: map[string]string{"rdma": "e9=eth"}}
	tr.local = []nicInfo{{"i0", "ib"}}
	if pi := tr.peerOf(d); pi.err == nil {
		t.Fatal("an InfiniBand NIC paired with an Ethernet one")
	}
}

// split gives each rail bytes in proportion to its throughput less its
// backlog, in whole slices summing to the request.
func TestSplitWeighted(t *testing.T) {
	_, pi := testPeer(t, 4, 4)
	act := []int32{pi.at[0][0], pi.at[1][1], pi.at[2][2], pi.at[3][3]}
	share := func(n int32) map[int32]int32 {
		var out [maxSplit]share
		k := pi.split(act, n, 64<<10, uint64(n)*64<<10, &out)
		m := map[int32]int32{}
		sum := int32(0)
		for _, s := range out[:k] {
			m[s.rail] = s.n
			sum += s.n
		}
		if sum != n {
			t.Fatalf("shares %v sum to %d, want %d", out[:k], sum, n)
		}
		return m
	}
	// Unmeasured: alike.
	if m := share(100); m[act[0]] != 25 || m[act[3]] != 25 {
		t.Fatalf("even split %v", m)
	}
	// One rail at a tenth of the others' rate gets about a tenth of their share.
	for i, x := range act {
		v := 10e9
		if i == 2 {
			v = 1e9
		}
		pi.rails[x].SetLoad(rails.Load{Rate: v})
	}
	m := share(310)
	if m[act[2]] < 8 || m[act[2]] > 12 || m[act[0]] < 95 {
		t.Fatalf("slow rail share %v", m)
	}
	// A busy rail gets less: it already holds what the others are given.
	pi.rails[act[2]].SetLoad(rails.Load{Rate: 10e9})
	pi.rails[act[0]].SetLoad(rails.Load{Rate: 10e9, Backlog: 64 << 20})
	m = share(64)
	if m[act[0]] != 0 || m[act[1]] < 20 {
		t.Fatalf("busy rail share %v", m)
	}
	pi.rails[act[0]].SetLoad(rails.Load{Rate: 10e9})
	// A probing rail gets one slice.
	pi.rails[act[1]].SetLoad(rails.Load{Rate: 10e9, Probing: true})
	if m := share(40); m[act[1]] != 1 {
		t.Fatalf("probe share %v", m)
	}
	// One slice: the rail free first.
	pi.rails[act[1]].SetLoad(rails.Load{Rate: 10e9})
	for _, i := range []int{3, 0, 2} {
		pi.rails[act[i]].SetLoad(rails.Load{Rate: 10e9, Backlog: 1 << 20})
	}
	if x := pi.pick(act, 4096, 7); x != act[1] {
		t.Fatalf("picked %v", railNames(pi, []int32{x}))
	}
}

// Cooling rails drop out of the active set; when all of tier 0 cools, tier
// 1 takes over; a retry avoids the failed rail's NICs, then its tier.
func TestActiveAndRetry(t *testing.T) {
	tr, pi := testPeer(t, 3, 3)
	tr.health = DefaultOptions().health()
	tr.health.Limit = 1
	p := pi.buildPlan(&localTiers{pref: []int{0, 1}, other: []int{2}}, []int{0, 1})
	now := nanotime()
	var buf [maxSplit]int32
	if got := railNames(pi, pi.active(nil, p, now, buf[:0])); !reflect.DeepEqual(got, []string{"l0>r0", "l1>r1"}) {
		t.Fatalf("active %v", got)
	}
	x := pi.retryRail(p, p.tier0[0], 4096, now, 0)
	if r := pi.rails[x]; r.lname != "l1" || r.rname != "r1" {
		t.Fatalf("retry of l0>r0 went to %v", railNames(pi, []int32{x}))
	}
	if _, cool := pi.rails[p.tier0[1]].Fail(tr.health, now); !cool {
		t.Fatal("no cooldown at the limit")
	}
	if got := railNames(pi, pi.active(nil, p, now, buf[:0])); !reflect.DeepEqual(got, []string{"l0>r0"}) {
		t.Fatalf("active %v", got)
	}
	// Retry of l0>r0 with l1>r1 cooling: tier 1, disjoint from l0 and r0.
	x = pi.retryRail(p, p.tier0[0], 4096, now, 0)
	if r := pi.rails[x]; r.lname == "l0" || r.rname == "r0" || (r.lname == "l1" && r.rname == "r1") {
		t.Fatalf("retry went to %v", railNames(pi, []int32{x}))
	}
	pi.rails[p.tier0[0]].Fail(tr.health, now)
	got := pi.active(nil, p, now, buf[:0])
	if len(got) != 2 || pi.rails[got[0]].Cooling(now) || pi.rails[got[1]].Cooling(now) {
		t.Fatalf("tier 1 stand-ins %v", railNames(pi, got))
	}
	// After the cooldown, a probe; a failed probe cools twice as long.
	later := now + int64(tr.health.Cool) + 1
	if !pi.rails[p.tier0[0]].Usable(later) || !pi.rails[p.tier0[0]].Probing() {
		t.Fatal("no probe after the cooldown")
	}
	if d, cool := pi.rails[p.tier0[0]].Fail(tr.health, later); !cool || d != 2*tr.health.Cool {
		t.Fatalf("failed probe: cool %v for %v", cool, d)
	}
	// A probe that moves bytes makes the rail healthy.
	r := pi.rails[p.tier0[1]]
	r.Usable(later)
	r.Routed(4096, later)
	r.Completed(4096, later+1000)
	if r.Probing() || r.Cooling(later) {
		t.Fatal("probe succeeded, rail still suspect")
	}
}

// Throughput is measured over the time a rail is busy.
func TestRailRate(t *testing.T) {
	r := newRail(epKey{}, 0, "l0", "r0")
	t0 := int64(1e9)
	r.Routed(8<<20, t0)
	r.Completed(4<<20, t0+int64(time.Millisecond))
	r.Completed(4<<20, t0+int64(4*time.Millisecond))
	if v := r.Rate(); v < 1.9e9 || v > 2.2e9 {
		t.Fatalf("rate %.3g, want about 2.1e9 (8 MiB in 4 ms)", v)
	}
	// Idle time does not count.
	r.Routed(8<<20, t0+int64(time.Second))
	r.Completed(8<<20, t0+int64(time.Second+4*time.Millisecond))
	if v := r.Rate(); v < 1.9e9 || v > 2.2e9 {
		t.Fatalf("rate after idle %.3g", v)
	}
}

func TestPlanRegistration(t *testing.T) {
	cpu := segment.Location{Kind: "cpu", Index: -1}
	gpu := segment.Location{Kind: "cuda", Index: 0}
	for _, c := range []struct {
		n    uint64
		loc  segment.Location
		nics int
		want regPlan
	}{
		{1 << 30, cpu, 4, regPlan{}},
		{4 << 30, cpu, 4, regPlan{preTouch: true, parallel: true}},
		{8 << 30, cpu, 1, regPlan{preTouch: true}},
		{8 << 30, gpu, 2, regPlan{parallel: true}}, // device memory is not touched from the CPU
	} {
		if got := planRegistration(c.n, c.loc, c.nics, ParallelRegMin); got != c.want {
			t.Errorf("planRegistration(%d, %v, %d) = %+v, want %+v", c.n, c.loc, c.nics, got, c.want)
		}
	}
}

func TestGIDFormat(t *testing.T) {
	g := ibv.GID{0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0x02, 0x02, 0xc9, 0xff, 0xfe, 0x00, 0x00, 0x01}
	s := formatGID(g)
	if s != "fe:80:00:00:00:00:00:00:02:02:c9:ff:fe:00:00:01" {
		t.Fatalf("formatGID = %q", s)
	}
	for _, in := range []string{s, "fe80:0000:0000:0000:0202:c9ff:fe00:0001", "fe800000000000000202c9fffe000001"} {
		if back, err := parseGID(in); err != nil || back != g {
			t.Fatalf("parseGID(%q) = %x, %v", in, back, err)
		}
	}
	for _, bad := range []string{"", "fe80::1", "zz800000000000000202c9fffe000001", s + ":00"} {
		if _, err := parseGID(bad); !errors.Is(err, errs.ErrProtocol) {
			t.Errorf("parseGID(%q) = %v, want a protocol error", bad, err)
		}
	}
	roce, _ := parseGID("0000:0000:0000:0000:0000:ffff:0a00:0001")
	if !isRoCEGID(roce) || isRoCEGID(g) {
		t.Fatal("isRoCEGID")
	}
}
