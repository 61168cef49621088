package rdma

import (
	"encoding/hex"
	"strings"

	"github.com/tecache/te/engine/segment"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/sys/ibv"
)

// sliceCount is how many slices of at most size bytes a request of length
// bytes is cut into.
func sliceCount(length, size uint64) int {
	if size == 0 {
		return 0
	}
	return int((length + size - 1) / size)
}

// sliceAt returns slice k of such a request: its offset and length.
func sliceAt(length, size uint64, k int) (off, n uint64) {
	off = uint64(k) * size
	return off, min(size, length-off)
}

// nicInfo is what pairing needs to know of a NIC, local or remote.
type nicInfo struct {
	name string
	link string // "ib" or "eth"
}

func linkName(l uint8) string {
	switch l {
	case ibv.LinkLayerEthernet:
		return "eth"
	default:
		// Unspecified is what older kernels report for InfiniBand.
		return "ib"
	}
}

// regPlan says how a region is registered on the NICs.
type regPlan struct {
	preTouch bool // fault the pages in first, in parallel
	parallel bool // register on every NIC at once
}

// planRegistration follows Mooncake: a region of at least min bytes (4 GiB
// by default) of host memory is pre-faulted, since pinning already-present
// pages is much faster than faulting them inside ibv_reg_mr, and its MRs are
// registered on all NICs in parallel.
func planRegistration(length uint64, loc segment.Location, nics int, min uint64) regPlan {
	big := length >= min
	return regPlan{preTouch: big && loc.Kind == "cpu", parallel: big && nics > 1}
}

// formatGID writes a GID as Mooncake publishes it: sixteen bytes in hex,
// separated by colons ("fe:80:00:...").
func formatGID(g ibv.GID) string {
	var b strings.Builder
	for i := range g {
		if i > 0 {
			b.WriteByte(':')
		}
		b.WriteString(hex.EncodeToString(g[i : i+1]))
	}
	return b.String()
}

// parseGID reads a GID with colons anywhere between hex digits (Mooncake's
// byte-wise form, the kernel's sysfs form in groups of four) or none.
func parseGID(s string) (ibv.GID, error) {
	var g ibv.GID
	h := strings.ReplaceAll(s, ":", "")
	if len(h) != 32 {
		return g, errs.New(errs.Protocol, "rdma", "GID %q is not 16 bytes of hex", s)
	}
	if _, err := hex.Decode(g[:], []byte(h)); err != nil {
		return g, errs.New(errs.Protocol, "rdma", "GID %q is not hex", s)
	}
	return g, nil
}

// endpointString is the descriptor's Endpoints["rdma"]: each device of
// Desc.Devices, in order, with its link layer ("mlx5_0=ib,mlx5_1=eth"), so
// a peer pairs NICs that can talk to each other.
func endpointString(nics []nicInfo) string {
	parts := make([]string, len(nics))
	for i, n := range nics {
		parts[i] = n.name + "=" + n.link
	}
	return strings.Join(parts, ",")
}

// peerNICs checks a peer descriptor's rdma fields and returns its NICs in
// Devices order. Devices come from Mooncake-compatible descriptors too; a
// descriptor without te's endpoint string is taken to be all InfiniBand
// unless its GIDs look like RoCE (IPv4-mapped), as Mooncake publishes both
// the same way.
func peerNICs(d *segment.Desc) ([]nicInfo, error) {
	if len(d.Devices) == 0 {
		return nil, errs.New(errs.TransportUnavailable, "rdma", "segment %q publishes no RDMA device", d.Name)
	}
	out := make([]nicInfo, len(d.Devices))
	links := map[string]string{}
	if ep := d.Endpoints["rdma"]; ep != "" {
		for _, p := range strings.Split(ep, ",") {
			name, link, ok := strings.Cut(p, "=")
			if !ok || (link != "ib" && link != "eth") {
				return nil, errs.New(errs.Metadata, "rdma", "segment %q: bad rdma endpoint entry %q", d.Name, p)
			}
			links[name] = link
		}
	}
	for i, dev := range d.Devices {
		if dev.Name == "" {
			return nil, errs.New(errs.Metadata, "rdma", "segment %q: device %d has no name", d.Name, i)
		}
		g, err := parseGID(dev.GID)
		if err != nil {
			return nil, errs.Wrap(errs.Metadata, "rdma", err, "segment %q device %s", d.Name, dev.Name)
		}
		link := links[dev.Name]
		if link == "" {
			link = "ib"
			if isRoCEGID(g) {
				link = "eth"
			}
		}
		out[i] = nicInfo{name: dev.Name, link: link}
	}
	return out, nil
}

// isRoCEGID reports whether g is an IPv4-mapped address (::ffff:a.b.c.d),
// the GID RoCE v2 uses for an IPv4 interface.
func isRoCEGID(g ibv.GID) bool {
	for _, b := range g[:10] {
		if b != 0 {
			return false
		}
	}
	return g[10] == 0xff && g[11] == 0xff
}
