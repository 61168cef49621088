package rdma

import (
	"github.com/tecache/te/engine/transport/internal/rails"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/tecache/te/engine/transport"
	"github.com/tecache/te/internal/errs"
)

// Defaults and bounds of the transport's parameters.
const (
	DefaultSlice   = 64 << 10
	MinSlice       = 4 << 10
	MaxSlice       = 1 << 30 // an SGE's length is 32 bits; keep well below
	DefaultQPs     = 2       // queue pairs per endpoint
	DefaultDepth   = 1024    // outstanding work requests per queue pair (at most the NIC's max_qp_wr)
	DefaultRetries = 3       // further attempts of a failed slice
	DefaultCQE     = 4096
	// ParallelRegMin is the size from which a region is pre-faulted and
	// registered on every NIC at once, as Mooncake does from 4 GiB.
	ParallelRegMin = 4 << 30
	// A rail with ErrorLimit errors within ErrorWindow cools down for
	// Cooldown, doubling with each cooldown in a row up to CooldownMax,
	// then is probed with one slice; a peer whose rails fail that often
	// with no transfer in between is unreachable over rdma as long.
	DefaultErrorLimit  = 3
	DefaultErrorWindow = 10 * time.Second
	DefaultCooldown    = 30 * time.Second
	DefaultCooldownMax = 300 * time.Second
	// DefaultStallTimeout is the shortest time an endpoint with work
	// outstanding may go without a completion, while other rails to the
	// same peer complete, before it is taken for dead (see
	// Options.StallTimeout).
	DefaultStallTimeout = 20 * time.Millisecond
)

// Options are the transport's settings, read from the engine's parameters.
type Options struct {
	// Devices is the allow-list of NIC names; empty means every device.
	Devices []string
	// Library is the libibverbs to load (default: ibv.Load's choice).
	Library string
	// Slice is the largest piece of a request one work request moves.
	Slice uint64
	// QPs is the number of queue pairs per endpoint.
	QPs int
	// Depth bounds outstanding work requests per queue pair.
	Depth int
	// Retries bounds further attempts of a failed slice, each on the next
	// NIC pair.
	Retries int
	// GIDIndex is the GID table entry to use; -1 picks one (RoCE v2 on
	// Ethernet, 0 on InfiniBand).
	GIDIndex int
	// ParallelRegMin is the size from which registrations are pre-faulted
	// and done on all NICs in parallel.
	ParallelRegMin uint64
	// ErrorLimit, ErrorWindow, Cooldown and CooldownMax are the failover
	// policy (see DefaultErrorLimit).
	ErrorLimit  int
	ErrorWindow time.Duration
	Cooldown    time.Duration
	CooldownMax time.Duration
	// StallTimeout is the floor of the stall watchdog: an endpoint with
	// work outstanding that goes without a completion for longer than
	// this, and than eight times what its outstanding bytes take at its
	// rail's measured rate, while another rail to the same peer completes,
	// is failed and its slices go to the other rails; a NIC's own retry
	// timer (about 0.5 s at the default ACK timeout) would take longer.
	// 0 turns the watchdog off.
	StallTimeout time.Duration
	// PeerIdle destroys an endpoint's queue pairs once it went this long
	// without a post and has nothing outstanding (the engine's
	// Limits.PeerIdleTimeout, 2m; 0: never): a peer that died, and is
	// never asked for again, does not hold queue pairs for good. The next
	// request to a live peer connects anew.
	PeerIdle time.Duration
	// MRCache (rdma.mr_cache=on) registers the mapping a host region lies
	// in once per NIC (in windows of max_mr_size) and gives every region
	// inside it that window's keys, instead of one memory region per
	// region and NIC. An rkey then reaches the whole window, not only its
	// buffer (see SECURITY.md), so it is off by default.
	MRCache bool
	// Poll is how a NIC's completion poller waits (rdma.poll):
	// PollAdaptive (default) polls while completions come within a few
	// microseconds and otherwise sleeps on the completion channel;
	// PollBusy never sleeps while work is outstanding, for hosts that
	// give the engine a core.
	Poll string
	// Harvest (rdma.harvest) is how long a waiter of a small batch polls
	// the NICs' completion queues itself before it sleeps (Batch.Wait,
	// transport.Harvester); 0 leaves every completion to the pollers.
	Harvest time.Duration
}

// Completion polling modes (Options.Poll).
const (
	PollAdaptive = "adaptive"
	PollBusy     = "busy"
)

func (o Options) health() rails.Health {
	return rails.Health{Limit: o.ErrorLimit, Window: o.ErrorWindow, Cooldown: rails.Cooldown{Cool: o.Cooldown, CoolMax: o.CooldownMax}}
}

// DefaultOptions returns the defaults.
func DefaultOptions() Options {
	return Options{Slice: DefaultSlice, QPs: DefaultQPs, Depth: DefaultDepth, Retries: DefaultRetries,
		GIDIndex: -1, ParallelRegMin: ParallelRegMin, ErrorLimit: DefaultErrorLimit, ErrorWindow: DefaultErrorWindow,
		Cooldown: DefaultCooldown, CooldownMax: DefaultCooldownMax, StallTimeout: DefaultStallTimeout,
		PeerIdle: 2 * time.Minute, Poll: PollAdaptive}
}

// ParseOptions reads rdma.* parameters; the device allow-list falls back to
// the environment (TE_RDMA_DEVICES, then Mooncake's MC_TE_FILTERS).
func ParseOptions(param func(string) (string, bool), getenv func(string) string) (Options, error) {
	o := DefaultOptions()
	bad := func(key, v, why string) error {
		return errs.New(errs.InvalidArgument, "rdma", "parameter %s=%q: %s", key, v, why)
	}
	list := ""
	if v, ok := param("rdma.devices"); ok {
		list = v
	} else if v := getenv("TE_RDMA_DEVICES"); v != "" {
		list = v
	} else {
		list = getenv("MC_TE_FILTERS")
	}
	o.Devices = splitList(list)
	if v, ok := param("rdma.library"); ok {
		o.Library = strings.TrimSpace(v)
	}
	if v, ok := param("rdma.slice"); ok {
		n, err := transport.ParseSize(v)
		if err != nil || n < MinSlice || n > MaxSlice {
			return o, bad("rdma.slice", v, "want a size from 4KiB to 1GiB")
		}
		o.Slice = n
	}
	ints := []struct {
		key      string
		dst      *int
		min, max int
	}{
		{"rdma.qps", &o.QPs, 1, 64},
		{"rdma.depth", &o.Depth, 1, 16384},
		{"rdma.retries", &o.Retries, 0, 64},
		{"rdma.gid_index", &o.GIDIndex, -1, 1 << 16},
		{"rdma.error_limit", &o.ErrorLimit, 1, 1000},
	}
	for _, p := range ints {
		if v, ok := param(p.key); ok {
			n, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil || n < p.min || n > p.max {
				return o, bad(p.key, v, "want an integer in ["+strconv.Itoa(p.min)+", "+strconv.Itoa(p.max)+"]")
			}
			*p.dst = n
		}
	}
	durs := []struct {
		key string
		dst *time.Duration
	}{{"rdma.error_window", &o.ErrorWindow}, {"rdma.cooldown", &o.Cooldown}, {"rdma.cooldown_max", &o.CooldownMax}}
	for _, p := range durs {
		if v, ok := param(p.key); ok {
			d, err := time.ParseDuration(strings.TrimSpace(v))
			if err != nil || d <= 0 || d > 24*time.Hour {
				return o, bad(p.key, v, "want a duration from 1ns to 24h (e.g. 30s)")
			}
			*p.dst = d
		}
	}
	if v, ok := param("rdma.stall_timeout"); ok {
		d, err := time.ParseDuration(strings.TrimSpace(v))
		if err != nil || d < 0 || d > time.Hour {
			return o, bad("rdma.stall_timeout", v, "want 0 (off) or a duration up to 1h (e.g. 20ms)")
		}
		o.StallTimeout = d
	}
	if v, ok := param("limits.peer_idle_timeout"); ok {
		d, err := time.ParseDuration(strings.TrimSpace(v))
		if err != nil || d < 0 {
			return o, bad("limits.peer_idle_timeout", v, "want 0 (never) or a positive duration")
		}
		o.PeerIdle = d
	}
	if o.CooldownMax < o.Cooldown {
		o.CooldownMax = o.Cooldown
	}
	if v, ok := param("rdma.mr_cache"); ok {
		switch strings.ToLower(strings.TrimSpace(v)) {
		case "on", "1", "true", "yes":
			o.MRCache = true
		case "off", "0", "false", "no", "":
			o.MRCache = false
		default:
			return o, bad("rdma.mr_cache", v, "want on or off")
		}
	}
	if v, ok := param("rdma.poll"); ok {
		switch m := strings.ToLower(strings.TrimSpace(v)); m {
		case PollAdaptive, PollBusy:
			o.Poll = m
		case "":
			o.Poll = PollAdaptive
		default:
			return o, bad("rdma.poll", v, "want adaptive or busy")
		}
	}
	if v, ok := param("rdma.harvest"); ok {
		d, err := time.ParseDuration(strings.TrimSpace(v))
		if err != nil || d < 0 || d > time.Second {
			return o, bad("rdma.harvest", v, "want 0 (off) or a duration up to 1s (e.g. 20us)")
		}
		o.Harvest = d
	}
	if v, ok := param("rdma.parallel_reg_min"); ok {
		n, err := transport.ParseSize(v)
		if err != nil || n == 0 {
			return o, bad("rdma.parallel_reg_min", v, "want a positive size")
		}
		o.ParallelRegMin = n
	}
	return o, nil
}

func optionsOf(h transport.Host) (Options, error) { return ParseOptions(h.Param, os.Getenv) }

// splitList splits a comma- or space-separated list, dropping empty names.
func splitList(s string) []string {
	f := strings.FieldsFunc(s, func(r rune) bool { return r == ',' || r == ' ' || r == ';' })
	if len(f) == 0 {
		return nil
	}
	return f
}

// FilterDevices applies the allow-list to the devices found, keeping their
// order. An allowed name that is not present is an error naming what is, so
// a typo does not silently fall back to no NIC.
func FilterDevices(found, allow []string) ([]string, error) {
	if len(allow) == 0 {
		return found, nil
	}
	present := map[string]bool{}
	for _, f := range found {
		present[f] = true
	}
	for _, a := range allow {
		if !present[a] {
			return nil, errs.New(errs.NotSupported, "rdma", "device %q is in the allow-list but not present (found: %s)", a, strings.Join(found, ", ")).
				WithHint("fix rdma.devices / TE_RDMA_DEVICES / MC_TE_FILTERS")
		}
	}
	allowed := map[string]bool{}
	for _, a := range allow {
		allowed[a] = true
	}
	var out []string
	for _, f := range found {
		if allowed[f] {
			out = append(out, f)
		}
	}
	return out, nil
}
