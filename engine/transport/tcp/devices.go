package tcp

import (
	"net"
	"strings"

	"github.com/tecache/te/internal/errs"
)

// MaxDevices bounds the data endpoints one engine publishes and the rails
// an initiator makes to one peer.
const MaxDevices = 16

// device is one local NIC the transport listens on and dials from: its
// address and the subnet it is on (the address alone when not known).
type device struct {
	name string // interface name; "" when not known
	ip   net.IP
	net  *net.IPNet
}

// nicAddrs lists the host's interfaces that are up with their addresses;
// tests replace it.
var nicAddrs = func() ([]nicInfo, error) {
	ifs, err := net.Interfaces()
	if err != nil {
		return nil, err
	}
	var out []nicInfo
	for _, nif := range ifs {
		if nif.Flags&net.FlagUp == 0 {
			continue
		}
		as, err := nif.Addrs()
		if err != nil {
			continue
		}
		n := nicInfo{name: nif.Name, loopback: nif.Flags&net.FlagLoopback != 0}
		for _, a := range as {
			if ipn, ok := a.(*net.IPNet); ok {
				n.nets = append(n.nets, ipn)
			}
		}
		out = append(out, n)
	}
	return out, nil
}

type nicInfo struct {
	name     string
	loopback bool
	nets     []*net.IPNet
}

// primaryNet is the address a NIC is reached at: its first IPv4 address,
// else its first global unicast IPv6 one (a link-local address needs a zone
// in every peer's dial). nil when it has neither.
func (n nicInfo) primaryNet() *net.IPNet {
	for _, a := range n.nets {
		if a.IP.To4() != nil {
			return a
		}
	}
	for _, a := range n.nets {
		if a.IP.IsGlobalUnicast() {
			return a
		}
	}
	return nil
}

// parseDevices resolves tcp.devices: a list of interface names or
// addresses, separated by commas or spaces. An address must be one of this
// host's (or in a loopback subnet, where every address is local).
func parseDevices(v string) ([]device, error) {
	bad := func(why string, a ...any) error {
		return errs.New(errs.InvalidArgument, "tcp", "parameter tcp.devices=%q: "+why, append([]any{v}, a...)...).
			WithHint("name interfaces (eth0) or this host's addresses (10.0.0.5), separated by commas")
	}
	fields := strings.FieldsFunc(v, func(r rune) bool { return r == ',' || r == ' ' || r == ';' })
	if len(fields) == 0 {
		return nil, bad("no device")
	}
	if len(fields) > MaxDevices {
		return nil, bad("%d devices, at most %d", len(fields), MaxDevices)
	}
	nics, err := nicAddrs()
	if err != nil {
		return nil, errs.Wrap(errs.Internal, "tcp", err, "list network interfaces")
	}
	var out []device
	seen := map[string]bool{}
	for _, f := range fields {
		var d device
		if ip := net.ParseIP(f); ip != nil {
			if ip.IsUnspecified() || ip.IsMulticast() {
				return nil, bad("%s is not a unicast address", f)
			}
			var ok bool
			if d, ok = deviceOf(nics, ip); !ok {
				return nil, bad("%s is not an address of this host", f)
			}
		} else {
			var n *nicInfo
			for i := range nics {
				if nics[i].name == f {
					n = &nics[i]
				}
			}
			if n == nil {
				return nil, bad("no interface %q is up", f)
			}
			pn := n.primaryNet()
			if pn == nil {
				return nil, bad("interface %q has no IPv4 or global IPv6 address", f)
			}
			d = device{name: n.name, ip: pn.IP, net: pn}
		}
		if seen[d.ip.String()] {
			continue
		}
		seen[d.ip.String()] = true
		out = append(out, d)
	}
	return out, nil
}

// deviceOf finds the interface that has ip, or a loopback one whose subnet
// holds it (127.0.0.2 on lo).
func deviceOf(nics []nicInfo, ip net.IP) (device, bool) {
	for _, n := range nics {
		for _, a := range n.nets {
			if a.IP.Equal(ip) {
				return device{name: n.name, ip: ip, net: a}, true
			}
		}
	}
	for _, n := range nics {
		for _, a := range n.nets {
			if n.loopback && a.Contains(ip) {
				return device{name: n.name, ip: ip, net: a}, true
			}
		}
	}
	return device{}, false
}

// defaultDevices is every interface that is up with an address, loopback
// left out when there are others; at most MaxDevices.
func defaultDevices() []device {
	nics, err := nicAddrs()
	if err != nil {
		return nil
	}
	var out, lo []device
	for _, n := range nics {
		pn := n.primaryNet()
		if pn == nil {
			continue
		}
		d := device{name: n.name, ip: pn.IP, net: pn}
		if n.loopback {
			lo = append(lo, d)
		} else if len(out) < MaxDevices {
			out = append(out, d)
		}
	}
	if len(out) == 0 {
		return lo
	}
	return out
}

// hostIPs lists every address of this host's interfaces that are up.
func hostIPs() []net.IP {
	nics, _ := nicAddrs()
	var out []net.IP
	for _, n := range nics {
		for _, a := range n.nets {
			out = append(out, a.IP)
		}
	}
	return out
}

// railSpec is one rail to a peer: the local address it dials from ("" for
// the kernel's choice) and the peer's endpoint.
type railSpec struct {
	local  string
	remote string
}

// pairRails makes one rail per peer endpoint and chooses the local device
// each dials from: the one with the endpoint's own address (the same host),
// else the least used one on the endpoint's subnet. An endpoint on no local
// subnet is dialed from wherever the routing table says: binding a source
// address there might pick a NIC that has no route to it.
func pairRails(local []device, remote []string) []railSpec {
	used := make([]int, len(local))
	out := make([]railSpec, 0, len(remote))
	for _, ep := range remote {
		host, _, _ := net.SplitHostPort(ep)
		ip := net.ParseIP(host)
		best := -1
		for i, d := range local {
			if ip != nil && d.ip.Equal(ip) {
				best = i
				break
			}
		}
		if best < 0 && ip != nil {
			for i, d := range local {
				if d.net != nil && d.net.Contains(ip) && (best < 0 || used[i] < used[best]) {
					best = i
				}
			}
		}
		s := railSpec{remote: ep}
		if best >= 0 {
			used[best]++
			s.local = local[best].ip.String()
		}
		out = append(out, s)
	}
	return out
}

// parseEndpoints reads a peer's published endpoints (Endpoints["tcp.rails"],
// comma separated, the primary first): well-formed ones only, at most
// MaxDevices, no duplicates.
func parseEndpoints(primary, list string) []string {
	out := []string{primary}
	for _, ep := range strings.Split(list, ",") {
		ep = strings.TrimSpace(ep)
		if ep == "" || ep == primary || len(out) >= MaxDevices {
			continue
		}
		h, p, err := net.SplitHostPort(ep)
		if err != nil || h == "" || p == "" {
			continue
		}
		dup := false
		for _, o := range out {
			dup = dup || o == ep
		}
		if !dup {
			out = append(out, ep)
		}
	}
	return out
}
