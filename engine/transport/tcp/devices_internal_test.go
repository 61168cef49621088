package tcp

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/tecache/te/internal/errs"
)

func ipnet(t *testing.T, cidr string) *net.IPNet {
	t.Helper()
	ip, n, err := net.ParseCIDR(cidr)
	if err != nil {
		t.Fatal(err)
	}
	n.IP = ip
	return n
}

// TestPairRails: each peer endpoint is dialed from the local device with
// its address, else one on its subnet (spread), else unbound.
func TestPairRails(t *testing.T) {
	dev := func(cidr string) device { n := ipnet(t, cidr); return device{ip: n.IP, net: n} }
	local := []device{dev("10.0.0.1/24"), dev("10.0.1.1/24"), dev("10.0.1.9/24")}
	got := pairRails(local, []string{"10.0.1.2:1", "10.0.0.2:2", "192.168.0.9:3", "10.0.1.3:4", "[::1]:5"})
	want := []railSpec{{"10.0.1.1", "10.0.1.2:1"}, {"10.0.0.1", "10.0.0.2:2"}, {"", "192.168.0.9:3"}, {"10.0.1.9", "10.0.1.3:4"}, {"", "[::1]:5"}}
	if len(got) != len(want) {
		t.Fatalf("%v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("rail %d: %+v, want %+v", i, got[i], want[i])
		}
	}
	// Same host, two loopback "NICs" in one subnet: each endpoint from its
	// own address, not both from the first.
	lo := []device{dev("127.0.0.1/8"), {ip: net.ParseIP("127.0.0.2"), net: ipnet(t, "127.0.0.1/8")}}
	got = pairRails(lo, []string{"127.0.0.1:1", "127.0.0.2:2"})
	if got[0].local != "127.0.0.1" || got[1].local != "127.0.0.2" {
		t.Fatalf("loopback pairs %+v", got)
	}
}

// TestParseEndpoints: malformed entries and duplicates are dropped, the
// primary comes first, at most MaxDevices.
func TestParseEndpoints(t *testing.T) {
	got := parseEndpoints("10.0.0.1:5", "10.0.0.1:5, 10.0.1.1:5,nohostport,:7,10.0.1.1:5,[fd00::1]:6")
	if strings.Join(got, ",") != "10.0.0.1:5,10.0.1.1:5,[fd00::1]:6" {
		t.Fatalf("got %q", got)
	}
	var many []string
	for i := 0; i < 40; i++ {
		many = append(many, "10.0.2.1:"+string(rune('0'+i%10))+string(rune('0'+i/10)))
	}
	if got := parseEndpoints("10.0.0.1:5", strings.Join(many, ",")); len(got) != MaxDevices {
		t.Fatalf("%d endpoints, want %d", len(got), MaxDevices)
	}
}

// TestParseDevices: names and addresses resolve; what is not this host's
// is refused with InvalidArgument.
func TestParseDevices(t *testing.T) {
	ds, err := parseDevices("127.0.0.1, 127.0.0.2,127.0.0.1")
	if err != nil || len(ds) != 2 || ds[1].ip.String() != "127.0.0.2" || !ds[1].net.Contains(net.ParseIP("127.0.0.1")) {
		t.Fatalf("%+v, %v", ds, err)
	}
	if ds, err := parseDevices("lo"); err != nil || ds[0].ip.String() != "127.0.0.1" {
		t.Fatalf("lo: %+v, %v", ds, err)
	}
	for _, v := range []string{"192.0.2.77", "no-such-nic0", "0.0.0.0", ",", strings.Repeat("127.0.0.1,", MaxDevices+1)} {
		if _, err := parseDevices(v); !errors.Is(err, errs.ErrInvalidArgument) {
			t.Errorf("%q: %v, want invalid argument", v, err)
		}
	}
}

// TestRailDialBindsLocal: a rail's connection leaves from its device's
// address.
func TestRailDialBindsLocal(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	tr := New()
	tr.opt = DefaultOptions()
	for _, local := range []string{"127.0.0.3", "127.0.0.4"} {
		nc, err := tr.dial(context.Background(), ln.Addr().String()+via+local, "")
		if err != nil {
			t.Fatal(err)
		}
		ln.(*net.TCPListener).SetDeadline(time.Now().Add(5 * time.Second))
		s, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		if ip := s.RemoteAddr().(*net.TCPAddr).IP.String(); ip != local {
			t.Errorf("connection from %s, want %s", ip, local)
		}
		s.Close()
		nc.Close()
	}
}

// TestReachableEndpoints: a peer on another host that publishes an address
// this host has too (a container bridge's) does not get a rail to it:
// dialing it would reach this host. A peer on this host keeps all.
func TestReachableEndpoints(t *testing.T) {
	tr := New()
	tr.localIPs = []net.IP{net.ParseIP("10.0.0.5"), net.ParseIP("172.17.0.1")}
	got := tr.reachable([]string{"10.0.0.9:1", "172.17.0.1:2", "10.0.1.9:3"})
	if strings.Join(got, ",") != "10.0.0.9:1,10.0.1.9:3" {
		t.Fatalf("remote peer: %q", got)
	}
	got = tr.reachable([]string{"10.0.0.5:1", "172.17.0.1:2"})
	if strings.Join(got, ",") != "10.0.0.5:1,172.17.0.1:2" {
		t.Fatalf("peer on this host: %q", got)
	}
}

// TestDefaultDevices: every interface that is up with an address, loopback
// left out when there are others; an interface with only a link-local IPv6
// address has none to publish.
func TestDefaultDevices(t *testing.T) {
	saved := nicAddrs
	defer func() { nicAddrs = saved }()
	lo := nicInfo{name: "lo", loopback: true, nets: []*net.IPNet{ipnet(t, "127.0.0.1/8"), ipnet(t, "::1/128")}}
	eth0 := nicInfo{name: "eth0", nets: []*net.IPNet{ipnet(t, "fe80::1/64"), ipnet(t, "10.0.0.5/24")}}
	eth1 := nicInfo{name: "eth1", nets: []*net.IPNet{ipnet(t, "fd00::5/64")}}
	ll := nicInfo{name: "eth2", nets: []*net.IPNet{ipnet(t, "fe80::2/64")}}
	names := func() string {
		var out []string
		for _, d := range defaultDevices() {
			out = append(out, d.name+"="+d.ip.String())
		}
		return strings.Join(out, ",")
	}
	nicAddrs = func() ([]nicInfo, error) { return []nicInfo{lo}, nil }
	if got := names(); got != "lo=127.0.0.1" {
		t.Errorf("loopback only: %s", got)
	}
	nicAddrs = func() ([]nicInfo, error) { return []nicInfo{lo, eth0, eth1, ll}, nil }
	if got := names(); got != "eth0=10.0.0.5,eth1=fd00::5" {
		t.Errorf("with NICs: %s", got)
	}
}
