package lab_test

import (
	"strings"
	"testing"
	"time"

	"github.com/tecache/te/engine/transport/fabric"
	"github.com/tecache/te/tests/lab"
)

// fabricStall is the peers' fabric.stall_timeout: how long a NIC pair may
// complete nothing before its operations go over the other.
const fabricStall = 500 * time.Millisecond

// fabricPeers starts a peer in each of the first two hosts of l on the
// fabric transport with libfabric's tcp provider, one domain per address
// of the host on its first nics rails (fabric.addr lists them), in slices
// of 1 MiB so that a task of several MiB is split over the NIC pairs.
func fabricPeers(t *testing.T, l *lab.Lab, nics, size int) (*peer, *peer) {
	t.Helper()
	if _, err := fabric.Probe("", "tcp"); err != nil {
		t.Skipf("libfabric's tcp provider: %v", err)
	}
	start := func(h *lab.Host) *peer {
		addrs := h.Addr(0)
		for r := 1; r < nics; r++ {
			addrs += "," + h.Addr(r)
		}
		return startPeer(t, h, size, envTransport+"=fabric", "TE_PARAM_fabric_provider=tcp",
			"TE_PARAM_fabric_addr="+addrs, "TE_PARAM_fabric_slice=1048576",
			"TE_PARAM_fabric_stall_timeout="+fabricStall.String(), "TE_TRANSFER_TIMEOUT=60s")
	}
	return start(l.Hosts[0]), start(l.Hosts[1])
}

// nicBytes returns the bytes each of a fabric peer's NICs moved, by name.
func nicBytes(st map[string]uint64) map[string]uint64 {
	m := map[string]uint64{}
	for k, v := range st {
		if name, ok := strings.CutPrefix(k, "nic."); ok && strings.HasSuffix(name, ".bytes") {
			m[strings.TrimSuffix(name, ".bytes")] = v
		}
	}
	return m
}

// TestFabricRailsLinkDown: two hosts, two links of 400 Mbit/s each (tbf),
// peers on the fabric transport over libfabric's tcp provider with a
// domain per link. A batch of 8 MiB tasks is striped over both NIC pairs
// (each NIC moves bytes), then the target's cable on link 1 is pulled
// while a batch streams: the pair goes silent, the stall watchdog cools it
// down and its slices, flushed by closing their endpoint, go over link 0.
// Every task completes with its bytes in place.
func TestFabricRailsLinkDown(t *testing.T) {
	const rate = 400
	const n, bs = 64 * mib, 8 * mib // about 0.7 s over both links, 1.3 s over one
	l := lab.New(t, lab.Options{Hosts: 2, Rails: 2, RateMbit: rate})
	a, b := fabricPeers(t, l, 2, n)

	r := transfer(t, a, b, 1, n, bs)
	st := a.stats()
	nb := nicBytes(st)
	t.Logf("striped %d MiB in %d ms (%.0f Mbit/s over two links of %d); per NIC %v", n/mib, r.ElapsedMS, mbit(n, r), rate, nb)
	if len(nb) != 2 {
		t.Fatalf("the fabric peer opened %d NICs (%v), want one per link", len(nb), nb)
	}
	for name, v := range nb {
		if v < n/8 {
			t.Errorf("NIC %s moved %d bytes of %d: not striped (%v)", name, v, n, nb)
		}
	}

	a.do("pattern 2")
	b.do("fill 0")
	a.startWrite(b, n, bs)
	time.Sleep(200 * time.Millisecond)
	l.LinkDown(1, 1)
	t0 := time.Now()
	r = a.result(2 * time.Minute)
	took := time.Since(t0)
	t.Logf("link down: batch ended %s %v, %v after the cut (%d ms after submit)", r.State, summary(r), took, r.ElapsedMS)
	if done := check(t, r, b, bs); done != len(r.Tasks) || r.State != "COMPLETED" {
		t.Fatalf("%d of %d tasks completed (%v, %s), want all", done, len(r.Tasks), summary(r), r.Err)
	}
	if got, want := b.crc(0, n), a.crc(0, n); got != want {
		t.Fatalf("target holds crc %08x, initiator wrote %08x", got, want)
	}
	st = a.stats()
	t.Logf("fabric: %v", st)
	if st["failovers"] == 0 || st["stalls"] == 0 {
		t.Errorf("no slice left the cut link (failovers %d, stalls %d)", st["failovers"], st["stalls"])
	}
	// The silent pair's slices move once the watchdog has seen nothing
	// complete for the stall bound plus their bytes at its floor rate (at
	// most the half of the batch the pair held: n/2 at 64 MiB/s), looking
	// every quarter bound, and the owner answered its key check; then at
	// worst all of the batch goes over the one link left. Twice the
	// detection time covers a loaded two-core machine.
	oneLink := time.Duration(float64(n) * 8 / (rate * 1e6) * float64(time.Second))
	detect := fabricStall + time.Second/2 + fabricStall/4
	if limit := 2*detect + oneLink; took > limit {
		t.Errorf("batch ended %v after the cut, want within %v (2 x %v to detect + %v over one link)", took, limit, detect, oneLink)
	}
}
