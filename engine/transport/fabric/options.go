package fabric

import (
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/tecache/te/engine/transport"
	"github.com/tecache/te/internal/errs"
)

// DefaultProviders is the order providers are tried in when neither
// fabric.provider nor FI_PROVIDER names them: the NICs libfabric is the way
// to (AWS EFA, HPE Slingshot). Its software providers (tcp, sockets, shm)
// are used only when named: over sockets te's own tcp transport is as fast
// or faster (bench/README.md), and a host with Debian's libfabric installed
// should not move its KV through it unasked.
var DefaultProviders = []string{"efa", "cxi"}

// Options are the transport's parameters.
type Options struct {
	// Providers in order of preference (fabric.provider, else FI_PROVIDER,
	// else DefaultProviders): the first that offers a domain is used.
	Providers []string
	// Addr is the address whose domain is opened, or a comma-separated
	// list of them, one domain each (fabric.addr, else the engine's
	// advertised host): 127.0.0.1 opens the tcp provider's lo.
	Addr string
	// NICs bounds the domains opened (fabric.nics; 0: every one offered).
	NICs int
	// Slice is the largest single RMA operation (fabric.slice).
	Slice uint64
	// Depth bounds the operations posted per NIC (fabric.depth; also
	// bounded by the provider's transmit queue).
	Depth int
	// Library is the libfabric to load (fabric.library, else
	// TE_FABRIC_LIBRARY, else libfabric.so.1).
	Library string
	// CancelGrace is how long a canceled request's posted operations may
	// take to complete before their endpoint is closed to flush them.
	CancelGrace time.Duration
	// HandshakeTimeout bounds the endpoint exchange with a peer.
	HandshakeTimeout time.Duration
	// StallTimeout (fabric.stall_timeout) is how long an endpoint may
	// have operations posted and see none of them complete before te asks
	// the owner whether it still holds their keys; if not, the endpoint is
	// closed (the flush) and they fail with StaleDescriptor, so that the
	// engine fetches the peer's descriptor again. -1 (the default) leaves
	// it to the provider: DefaultStall for those that drop an access
	// under a refused key without completing it (shm), off for the
	// others, which complete it with an error, and at least RailStall
	// with more than one NIC; 0 turns it off. With another NIC pair to
	// the peer, a pair that stalls with its keys still held is cooled
	// down and its flushed operations go over another.
	StallTimeout time.Duration
	// HMEM (fabric.hmem) says where te asks libfabric for FI_HMEM, so that
	// GPU memory is registered with the NIC and moved by it: "auto" (the
	// default) from every provider that offers it but shm, "on" from shm
	// too, "off" from none. shm is left out by default because libfabric's
	// shm turns cross-memory attach off on an endpoint with FI_HMEM (every
	// host byte then goes through its bounce buffers), and te's cudaipc
	// serves GPU memory on one host. A provider without FI_HMEM is used
	// without it either way; its GPU memory is staged.
	HMEM string
}

// DefaultStall is the stall timeout of providers that never complete an
// access the owner refused (libfabric's shm provider, as of 1.17): a
// moment on one host, where a slice moves in milliseconds. A slow peer
// costs only the owner's answer that its keys still hold.
const DefaultStall = 250 * time.Millisecond

// RailStall is the stall timeout of an engine with more than one NIC,
// unless fabric.stall_timeout says otherwise: how long a NIC pair may
// complete nothing before its operations go over another.
const RailStall = time.Second

// silentRefusal reports whether a provider drops an access under a refused
// key without completing it.
func silentRefusal(prov string) bool { return prov == "shm" }

func parseOptions(param func(string) (string, bool), getenv func(string) string) (Options, error) {
	o := Options{Slice: 4 << 20, Depth: 256, CancelGrace: 50 * time.Millisecond, HandshakeTimeout: 10 * time.Second, StallTimeout: -1, HMEM: "auto"}
	bad := func(key, v string, err error) error {
		return errs.Wrap(errs.InvalidArgument, "fabric", err, "parameter %s=%q", key, v)
	}
	if v, ok := param("fabric.provider"); ok && v != "" {
		o.Providers = splitList(v)
	} else if v := getenv("FI_PROVIDER"); v != "" && !strings.HasPrefix(v, "^") {
		o.Providers = splitList(v)
	} else {
		o.Providers = DefaultProviders
	}
	if v, ok := param("fabric.addr"); ok && v != "" {
		o.Addr = v
	} else if v, ok := param("engine.hostname"); ok {
		o.Addr = v
	}
	if v, ok := param("fabric.nics"); ok && v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return o, bad("fabric.nics", v, err)
		}
		o.NICs = n
	}
	if v, ok := param("fabric.slice"); ok && v != "" {
		n, err := transport.ParseSize(v)
		if err != nil || n < 4096 {
			return o, bad("fabric.slice", v, err)
		}
		o.Slice = n
	}
	if v, ok := param("fabric.depth"); ok && v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxDepth {
			return o, bad("fabric.depth", v, err)
		}
		o.Depth = n
	}
	if v, ok := param("fabric.library"); ok && v != "" {
		o.Library = v
	}
	if v, ok := param("fabric.stall_timeout"); ok && v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 || d > 0 && d < time.Millisecond {
			if err == nil {
				err = errs.New(errs.InvalidArgument, "fabric", "0 (off) or at least 1ms")
			}
			return o, bad("fabric.stall_timeout", v, err)
		}
		o.StallTimeout = d
	}
	if v, ok := param("fabric.hmem"); ok && v != "" {
		switch v = strings.ToLower(v); v {
		case "auto", "on", "off":
			o.HMEM = v
		default:
			return o, bad("fabric.hmem", v, errs.New(errs.InvalidArgument, "fabric", "auto, on or off"))
		}
	}
	if v, ok := param("limits.handshake_timeout"); ok && v != "" {
		if d, err := time.ParseDuration(v); err == nil && d > 0 {
			o.HandshakeTimeout = d
		}
	}
	return o, nil
}

func optionsFrom(param func(string) (string, bool)) (Options, error) {
	return parseOptions(param, os.Getenv)
}

// hmemFor reports whether FI_HMEM is asked of provider p.
func (o Options) hmemFor(p string) bool {
	switch o.HMEM {
	case "off":
		return false
	case "on":
		return true
	}
	return !strings.EqualFold(p, "shm")
}

// splitList splits a comma- or space-separated list.
func splitList(s string) []string {
	return strings.FieldsFunc(s, func(r rune) bool { return r == ',' || r == ' ' })
}
