package rdma

import (
	"errors"
	"reflect"
	"testing"

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

func TestPairNICs(t *testing.T) {
	ib := func(n string) nicInfo { return nicInfo{n, "ib"} }
	eth := func(n string) nicInfo { return nicInfo{n, "eth"} }
	for _, c := range []struct {
		local, remote []nicInfo
		want          [][2]int
	}{
		// Two NICs each side: straight pairs.
		{[]nicInfo{ib("a0"), ib("a1")}, []nicInfo{ib("b0"), ib("b1")}, [][2]int{{0, 0}, {1, 1}}},
		// Four local on two remote: spread, not all on b0.
		{[]nicInfo{ib("a0"), ib("a1"), ib("a2"), ib("a3")}, []nicInfo{ib("b0"), ib("b1")}, [][2]int{{0, 0}, {1, 1}, {2, 0}, {3, 1}}},
		// Link layers pair only with their own kind.
		{[]nicInfo{eth("a0"), ib("a1")}, []nicInfo{ib("b0"), eth("b1")}, [][2]int{{0, 1}, {1, 0}}},
		{[]nicInfo{eth("a0")}, []nicInfo{ib("b0")}, nil},
	} {
		if got := pairNICs(c.local, c.remote); !reflect.DeepEqual(got, c.want) {
			t.Errorf("pairNICs(%v, %v) = %v, want %v", c.local, c.remote, got, c.want)
		}
	}
}

// Slices spread over every pair, and a retry always lands on another pair
// (when there is one).
func TestPickPair(t *testing.T) {
	const pairs = 3
	seen := map[int]int{}
	for i := 0; i < 300; i++ {
		p := pickPair(pairs, 1, i, 0)
		seen[p]++
		if r := pickPair(pairs, 1, i, 1); r == p {
			t.Fatalf("slice %d retried on pair %d again", i, p)
		}
	}
	if len(seen) != pairs || seen[0] != 100 || seen[1] != 100 || seen[2] != 100 {
		t.Fatalf("spread %v, want 100 each", seen)
	}
	if pickPair(0, 0, 0, 0) != -1 {
		t.Fatal("no pairs gave a pair")
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
