package fabric

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/tecache/te/engine/segment"
	"github.com/tecache/te/engine/transport"
	"github.com/tecache/te/engine/transport/internal/rails"
	"github.com/tecache/te/internal/errs"
	fab "github.com/tecache/te/internal/sys/fabric"
	"github.com/tecache/te/internal/sys/gpu"
	"github.com/tecache/te/internal/wire"
)

// Name is the transport's name.
const Name = "fabric"

// ExtraKeys is the BufferDesc.Extra field holding a buffer's keys, one per
// NIC of the owner in the order of its endpoint list, in hex.
const ExtraKeys = "fabric.keys"

const (
	maxDepth  = 1 << 14
	maxPeers  = 4096 // endpoints to peers, and peers accepted, per NIC
	rmaAccess = fab.FlagRead | fab.FlagWrite | fab.FlagRemoteRead | fab.FlagRemoteWrite
	rmaCaps   = fab.FlagRMA | rmaAccess
)

func init() {
	transport.RegisterFactory(Name, func() (transport.Transport, error) { return New(), nil })
}

// Transport is the fabric transport.
type Transport struct {
	h    transport.Host
	opt  Options
	lib  *fab.Lib
	nics []*nic
	self segment.HostID
	hmem bool // every NIC has FI_HMEM

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup // handshakes in progress

	closing atomic.Bool
	mu      sync.Mutex
	eps     map[epKey]*peerEP
	regs    map[*segment.Region][]*fab.MR
	accepts map[string]struct{}    // peer endpoint addresses accepted, per NIC and address
	rails   map[epKey]*rails.Rail  // per NIC pair to a peer: its load and health
	peers   map[string]*rails.Peer // per peer instance: its health as a whole
	// coolingUntil is when the last peer cooldown started so far ends
	// (0: none).
	coolingUntil atomic.Int64

	st struct {
		posts, eagain, teardowns, stalls, stallChecks, retries, failovers, errors, gpuRefused atomic.Uint64
		drains, drainTimeouts, gpuHMEM                                                        atomic.Uint64
		bytes                                                                                 atomic.Uint64
	}
}

// New returns an unstarted transport.
func New() *Transport {
	return &Transport{eps: map[epKey]*peerEP{}, regs: map[*segment.Region][]*fab.MR{}, accepts: map[string]struct{}{}, rails: map[epKey]*rails.Rail{},
		peers: map[string]*rails.Peer{}}
}

// Name returns "fabric".
func (t *Transport) Name() string { return Name }

// Caps: host memory to peers on this host and others, and GPU memory
// where every NIC was opened with FI_HMEM (EFA with a GPU runtime): the NIC
// then moves the regions it registered (DeviceMemory says which); requests
// on others go to a transport that stages them (tcp). Windows are not
// offered: the owner does not see one-sided accesses, and per-peer keys
// are not issued yet; peers are sent the buffer's own key.
func (t *Transport) Caps() transport.Caps {
	return transport.Caps{SameHost: true, CrossHost: true, HostMemory: true, GPUMemory: t.hmem, Rank: 35}
}

// DeviceMemory says whether fabric can serve a request from local to buf
// of d (transport.DeviceMover): both must be registered on the NICs (a GPU
// region is only where the provider took it with FI_HMEM) and the peer
// reachable.
func (t *Transport) DeviceMemory(d *segment.Desc, buf *segment.BufferDesc, local *segment.Region) bool {
	if !t.hmem || buf == nil || local == nil || buf.Extra[ExtraKeys] == "" {
		return false
	}
	t.mu.Lock()
	n := len(t.regs[local])
	t.mu.Unlock()
	return n == len(t.nics) && t.Reachable(d) == nil
}

// Probe reports whether libfabric loads and offers a domain of provider
// ("" for the default order) for addr ("" for any): the offers' names, or
// a NotSupported error that says why not.
func Probe(addr, provider string) ([]string, error) {
	o, err := optionsFrom(func(k string) (string, bool) {
		switch k {
		case "fabric.addr":
			return addr, addr != ""
		case "fabric.provider":
			return provider, provider != ""
		}
		return "", false
	})
	if err != nil {
		return nil, err
	}
	lib, err := loadLib(o)
	if err != nil {
		return nil, err
	}
	offers, free, _, err := choose(lib, o)
	if err != nil {
		return nil, err
	}
	defer free()
	var out []string
	for _, of := range offers {
		out = append(out, of.Name())
	}
	return out, nil
}

func loadLib(o Options) (*fab.Lib, error) {
	if o.Library != "" {
		return fab.Open(o.Library)
	}
	return fab.Load()
}

// choose returns the offers of the first provider in o.Providers that has
// any for o.Addr, refusing by name those whose modes te cannot meet. Where
// o asks FI_HMEM of a provider, its offers with FI_HMEM are taken first and
// those without it only if there are none (EFA offers FI_HMEM only where a
// GPU runtime initialized). The offers are valid until free is called.
func choose(lib *fab.Lib, o Options) (_ []*fab.Offer, _ func(), _ string, err error) {
	// fabric.addr may list one address per NIC: each names its domain.
	addrs := splitList(o.Addr)
	if len(addrs) == 0 {
		addrs = []string{""}
	}
	type query struct {
		addr string
		caps uint64
	}
	lists := map[query]*fab.Offers{}
	free := func() {
		for _, l := range lists {
			l.Free()
		}
	}
	defer func() {
		if err != nil {
			free()
		}
	}()
	get := func(addr string, caps uint64) (*fab.Offers, error) {
		q := query{addr, caps}
		if l, ok := lists[q]; ok {
			return l, nil
		}
		l, err := lib.GetInfo(fab.Query{Node: addr, Caps: caps, MRMode: fab.MRHandled, OpFlags: fab.FlagDeliveryComp})
		if err != nil {
			return nil, err
		}
		lists[q] = l
		return l, nil
	}
	// offers returns provider p's usable offers for caps, and why others
	// were not usable.
	offers := func(p string, caps uint64) (got []*fab.Offer, why []string, err error) {
		seen := map[string]bool{}
		pick := func(l *fab.Offers) {
			for _, of := range l.List {
				// A domain is listed once per fabric and protocol variant
				// the provider has: the first is the one it prefers.
				if !of.HasProvider(p) || seen[of.Name()] {
					continue
				}
				seen[of.Name()] = true
				if reason := unusable(of); reason != "" {
					why = append(why, of.Name()+": "+reason)
					continue
				}
				got = append(got, of)
			}
		}
		for _, a := range addrs {
			l, err := get(a, caps)
			if err != nil {
				return nil, nil, err
			}
			pick(l)
		}
		if len(got) == 0 && addressless(p) {
			// Not addressed by IP: shm's one domain serves the host, and
			// EFA's and Slingshot's domains (one per NIC) answer no
			// query for the engine's IP address; every one is used
			// (fabric.nics bounds them).
			l, err := get("", caps)
			if err != nil {
				return nil, nil, err
			}
			pick(l)
		}
		return got, why, nil
	}
	var why []string
	for _, p := range o.Providers {
		var got []*fab.Offer
		if o.hmemFor(p) {
			if got, _, err = offers(p, rmaCaps|fab.FlagHMEM); err != nil {
				return nil, nil, "", err
			}
		}
		if len(got) == 0 {
			var w []string
			if got, w, err = offers(p, rmaCaps); err != nil {
				return nil, nil, "", err
			}
			why = append(why, w...)
		}
		if len(got) > 0 {
			if o.NICs > 0 && len(got) > o.NICs {
				got = got[:o.NICs]
			}
			return got, free, p, nil
		}
		why = append(why, p+": no RDM endpoint with RMA for "+orAny(o.Addr))
	}
	major, minor := lib.Version()
	return nil, nil, "", errs.New(errs.NotSupported, "fabric", "no usable libfabric provider (%s %d.%d): %s", lib.Path, major, minor, strings.Join(why, "; ")).
		WithHint("set fabric.provider (efa, cxi, tcp, shm, sockets) or FI_PROVIDER, and fabric.addr to an address of the NIC")
}

// addressless reports whether provider p's endpoints are not reached by an
// IP address of the host: shm (this host only), efa (EFA device GIDs), cxi
// (Slingshot NIC addresses). Their domains are found without one.
func addressless(p string) bool {
	switch strings.ToLower(p) {
	case "shm", "efa", "cxi":
		return true
	}
	return false
}

func orAny(a string) string {
	if a == "" {
		return "any address"
	}
	return a
}

// unusable says why te cannot use an offer ("" when it can).
func unusable(of *fab.Offer) string {
	switch {
	case of.MRMode&^fab.MRHandled != 0:
		return "needs memory-registration modes te does not handle (" + strconv.FormatUint(of.MRMode&^fab.MRHandled, 16) + ")"
	case of.Mode&^(fab.ModeContext|fab.ModeContext2) != 0:
		return "needs operation modes te does not provide (" + strconv.FormatUint(of.Mode&^(fab.ModeContext|fab.ModeContext2), 16) + ")"
	case of.Caps&rmaCaps != rmaCaps:
		return "lacks one-sided RMA"
	case of.MRKeySize < 4 && of.MRMode&fab.MRProvKey == 0:
		return "keys of " + strconv.Itoa(of.MRKeySize) + " bytes are too short to be capabilities"
	}
	return ""
}

// Start loads libfabric, opens a domain per NIC of the chosen provider
// (an address vector, a completion queue and an endpoint on each) and
// starts their pollers. Without the library or a usable provider it
// returns a NotSupported error that says why.
func (t *Transport) Start(h transport.Host) error {
	o, err := optionsFrom(h.Param)
	if err != nil {
		return err
	}
	t.h, t.opt = h, o
	if t.lib, err = loadLib(o); err != nil {
		return err
	}
	offers, free, prov, err := choose(t.lib, o)
	if err != nil {
		return err
	}
	defer free()
	if t.self, err = segment.LocalHostID(); err != nil {
		return err
	}
	for i := range offers {
		n, err := openNIC(t, len(t.nics), offers[i])
		if err != nil {
			h.Logf("te: fabric: skipping %s: %v", offers[i].Name(), err)
			continue
		}
		n.stall = o.StallTimeout
		if n.stall < 0 {
			n.stall = 0
			if silentRefusal(n.prov) {
				n.stall = DefaultStall
			}
		}
		t.nics = append(t.nics, n)
	}
	if len(t.nics) == 0 {
		return errs.New(errs.NotSupported, "fabric", "no %s domain could be opened for %s", prov, orAny(o.Addr))
	}
	t.hmem = true
	for _, n := range t.nics {
		t.hmem = t.hmem && n.hmem
	}
	if o.StallTimeout < 0 && len(t.nics) > 1 {
		// A NIC pair that went silent (a pulled cable) completes nothing
		// and reports nothing: only the watchdog moves its operations to
		// another pair.
		for _, n := range t.nics {
			n.stall = max(n.stall, RailStall)
		}
	}
	t.ctx, t.cancel = context.WithCancel(context.Background())
	for _, n := range t.nics {
		h.Logf("te: fabric: %s (mr_mode %s, %d-byte keys, queue %d, %s progress%s)", n.name, mrModes(n.mrMode), n.keySize, n.depth, progressName(n.progress), hmemNote(n.hmem))
		go n.run()
		if n.sread {
			n.pdone = make(chan struct{})
			go n.passive()
		}
	}
	if e, ok := h.(interface{ Encrypt() bool }); ok && e.Encrypt() {
		h.Logf("te: fabric: payloads move NIC to NIC and are not sealed; the control plane (endpoint exchange) is")
	}
	h.Control().Handle(wire.KindFabric, t.handleHandshake)
	return nil
}

func hmemNote(h bool) string {
	if h {
		return ", FI_HMEM"
	}
	return ""
}

func progressName(p int) string {
	if p == fab.ProgressManual {
		return "manual"
	}
	return "auto"
}

func mrModes(m uint64) string {
	var s []string
	for _, b := range []struct {
		bit  uint64
		name string
	}{{fab.MRLocal, "local"}, {fab.MRVirtAddr, "virt_addr"}, {fab.MRAllocated, "allocated"}, {fab.MRProvKey, "prov_key"},
		{fab.MREndpoint, "endpoint"}, {fab.MRHMEM, "hmem"}} {
		if m&b.bit != 0 {
			s = append(s, b.name)
		}
	}
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, ",")
}

// hmemIface is libfabric's name for the memory of GPU runtime kind, or why
// there is none.
func hmemIface(kind string) (int32, string) {
	switch kind {
	case "cuda":
		return fab.HMEMCUDA, ""
	case "hip":
		return fab.HMEMROCR, ""
	}
	return fab.HMEMSystem, "libfabric has no memory interface for " + kind
}

// nicDesc is what an engine publishes of a NIC (the endpoint list is the
// JSON of a []nicDesc): its name, provider and addressing. The NIC's
// endpoint address goes only over the authenticated control plane.
type nicDesc struct {
	Name     string `json:"name"`
	Provider string `json:"prov"`
	Virt     bool   `json:"virt,omitempty"` // FI_MR_VIRT_ADDR: remote addresses are virtual, else offsets
}

func parseEndpoint(d *segment.Desc) ([]nicDesc, error) {
	s := d.Endpoints[Name]
	if s == "" {
		return nil, errs.New(errs.TransportUnavailable, "fabric", "segment %q publishes no fabric endpoint", d.Name)
	}
	var nd []nicDesc
	if err := json.Unmarshal([]byte(s), &nd); err != nil || len(nd) == 0 || len(nd) > 64 {
		return nil, errs.New(errs.Protocol, "fabric", "segment %q: bad fabric endpoint %q", d.Name, s)
	}
	return nd, nil
}

// Describe publishes the NICs (name, provider, addressing) and the host.
func (t *Transport) Describe(d *segment.Desc) {
	nd := make([]nicDesc, len(t.nics))
	for i, n := range t.nics {
		nd[i] = nicDesc{Name: n.name, Provider: n.prov, Virt: n.mrMode&fab.MRVirtAddr != 0}
	}
	b, _ := json.Marshal(nd)
	if d.Endpoints == nil {
		d.Endpoints = map[string]string{}
	}
	d.Endpoints[Name] = string(b)
	if d.Host == nil {
		h := t.self
		d.Host = &h
	}
}

// Register registers r's memory on every NIC and publishes one key per
// NIC (ExtraKeys). Keys are random where the provider lets te choose them
// (a new registration of the same range gets new ones: a stale descriptor
// is refused by the owner's NIC), the provider's under FI_MR_PROV_KEY.
// GPU memory is registered with FI_HMEM where every NIC has it (the
// provider reads and writes it NIC to NIC: gpu_hmem in Stats); where not,
// or where the provider refuses the region, it is left unregistered (the
// reason logged, gpu_staged) and moves over a staging transport.
func (t *Transport) Register(r *segment.Region) error {
	if t.closing.Load() {
		return errs.New(errs.Closed, "fabric", "transport closed")
	}
	if r.Storage != nil {
		return nil
	}
	iface, dev := int32(fab.HMEMSystem), int32(0)
	device := gpu.IsDevice(r.Location.Kind)
	if device {
		var why string
		if iface, why = hmemIface(r.Location.Kind); why == "" && !t.hmem {
			why = "the provider was not opened with FI_HMEM (fabric.hmem, or no GPU support in it)"
		}
		if why != "" {
			t.st.gpuRefused.Add(1)
			return nil
		}
		dev = int32(r.Location.Index)
	} else if r.Location.Kind != "" && r.Location.Kind != "cpu" {
		t.st.gpuRefused.Add(1)
		return nil
	}
	mrs := make([]*fab.MR, 0, len(t.nics))
	keys := make([]string, 0, len(t.nics))
	for _, n := range t.nics {
		m, err := n.register(r.Addr, r.Length, iface, dev)
		if err != nil {
			for _, m := range mrs {
				_ = m.Close()
			}
			if device {
				// The provider's GPU support may not cover this runtime
				// or device (libfabric built without it, no peer-memory
				// or dma-buf path for the NIC): staging still moves it.
				t.st.gpuRefused.Add(1)
				t.h.Logf("te: fabric: GPU memory [%#x,+%d) at %s stays off the NICs, requests on it are staged over another transport: %v",
					r.Addr, r.Length, r.Location, err)
				return nil
			}
			return err
		}
		mrs = append(mrs, m)
		keys = append(keys, strconv.FormatUint(m.Key, 16))
	}
	if device {
		t.st.gpuHMEM.Add(1)
	}
	t.mu.Lock()
	t.regs[r] = mrs
	t.mu.Unlock()
	if r.Desc.Extra == nil {
		r.Desc.Extra = map[string]string{}
	}
	r.Desc.Extra[ExtraKeys] = strings.Join(keys, ",")
	return nil
}

// Unregister closes r's regions on every NIC: once fi_close returns, the
// NIC refuses their keys, so no peer reaches the range through them.
func (t *Transport) Unregister(r *segment.Region) error {
	t.mu.Lock()
	mrs := t.regs[r]
	delete(t.regs, r)
	t.mu.Unlock()
	var first error
	for _, m := range mrs {
		// fi_close runs alone among the process's provider calls (package
		// fabric's progress lock): once it returns, no copy a provider
		// checked against the region is still running.
		if err := m.Close(); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// localDesc returns the descriptor of local region r on NIC i (0 when the
// provider needs none or r is not registered with it).
func (t *Transport) localDesc(r *segment.Region, i int) (uintptr, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	mrs := t.regs[r]
	if i >= len(mrs) {
		return 0, false
	}
	return mrs[i].Desc, true
}

// Quiesce has nothing to wait for: peers reach this engine's memory with
// one-sided RMA, which the owner neither sees nor counts; Unregister's
// fi_close of the regions is the fence.
func (t *Transport) Quiesce(*segment.Region) error { return nil }

// Reachable reports whether a NIC here shares a provider with one of the
// peer's (shm only on this host).
func (t *Transport) Reachable(d *segment.Desc) error {
	if d.RPC == "" || d.Instance == "" {
		return errs.New(errs.TransportUnavailable, "fabric", "segment %q has no control-plane address for the endpoint exchange", d.Name)
	}
	nd, err := parseEndpoint(d)
	if err != nil {
		return err
	}
	if _, _, err := t.pair(d, nd); err != nil {
		return err
	}
	return t.cooling(d.Instance)
}

// cooling returns why peer instance inst is unreachable over fabric for
// now, or nil. The engine asks per request: no lock and no clock read
// unless some peer cools down.
func (t *Transport) cooling(inst string) error {
	u := t.coolingUntil.Load()
	if u == 0 {
		return nil
	}
	if now := rails.Now(); now >= u {
		t.coolingUntil.CompareAndSwap(u, 0)
		return nil
	}
	t.mu.Lock()
	p := t.peers[inst]
	t.mu.Unlock()
	if p != nil {
		return p.Unreachable(rails.Now(), "fabric")
	}
	return nil
}

// pair returns the first local NIC and peer NIC that share a provider.
// A host-only provider (shm) never pairs with an engine of this process:
// libfabric's shm provider maps a peer of its own process through that
// peer's region rather than a mapping of its own, so when that engine
// closes, this one's progress reads unmapped memory (a SIGSEGV in
// fi_cq_read). Engines of one process reach each other through the
// local transport.
func (t *Transport) pair(d *segment.Desc, nd []nicDesc) (int, int, error) {
	sameProcess := false
	for i, n := range t.nics {
		for j, p := range nd {
			if p.Provider != n.prov {
				continue
			}
			if n.hostOnly && (d.Host == nil || d.Host.BootID != t.self.BootID) {
				continue
			}
			if n.hostOnly && d.Host.Pid == t.self.Pid && d.Host.PidNS == t.self.PidNS {
				sameProcess = true
				continue
			}
			return i, j, nil
		}
	}
	if sameProcess {
		return 0, 0, errs.New(errs.TransportUnavailable, "fabric",
			"segment %q is an engine of this process, which the %s provider cannot reach safely (it maps a same-process peer through that peer's own region)",
			d.Name, t.nics[0].prov).WithHint("use the local transport between engines of one process")
	}
	return 0, 0, errs.New(errs.TransportUnavailable, "fabric", "segment %q shares no provider with this engine's %s", d.Name, t.nics[0].prov)
}

// nicPair is a local NIC and a peer NIC, by index.
type nicPair struct{ li, ri int }

// pairs returns the NIC pairs to the peer: each local NIC with the peer
// NIC of the same rank among those of its provider (NIC k to NIC k: rails
// are wired alike on both ends), the shorter list wrapping around, so that
// every NIC of both ends carries a share.
func (t *Transport) pairs(d *segment.Desc, nd []nicDesc) ([]nicPair, error) {
	var local, remote []int
	for i, n := range t.nics {
		if n.hostOnly && (d.Host == nil || d.Host.BootID != t.self.BootID) {
			continue
		}
		local = append(local, i)
	}
	if len(local) > 0 {
		for j, p := range nd {
			if p.Provider == t.nics[local[0]].prov {
				remote = append(remote, j)
			}
		}
	}
	if len(local) == 0 || len(remote) == 0 {
		li, ri, err := t.pair(d, nd)
		if err != nil {
			return nil, err
		}
		return []nicPair{{li, ri}}, nil
	}
	out := make([]nicPair, max(len(local), len(remote)))
	for k := range out {
		out[k] = nicPair{local[k%len(local)], remote[k%len(remote)]}
	}
	return out, nil
}

func (t *Transport) keyOf(d *segment.Desc, p nicPair) epKey {
	return epKey{instance: d.Instance, local: p.li, remote: p.ri}
}

// railOf returns the rail of a NIC pair to a peer, made at first use.
func (t *Transport) railOf(k epKey) *rails.Rail {
	t.mu.Lock()
	defer t.mu.Unlock()
	r := t.rails[k]
	if r == nil {
		if len(t.rails) >= maxPeers*len(t.nics) {
			// Peers come and go (a restart is a new instance): forget
			// the pairs of those with no endpoint open. Operations
			// in flight keep their rail.
			for k := range t.rails {
				if _, ok := t.eps[k]; !ok {
					delete(t.rails, k)
				}
			}
		}
		r = &rails.Rail{}
		t.rails[k] = r
	}
	return r
}

// Stats counts operations posted, posts the provider pushed back
// (-FI_EAGAIN), bytes moved, endpoints torn down to flush canceled
// operations or (stalls) ended by the stall watchdog after asking the owner
// (stall_checks: how often it asked), operations retried on
// a new endpoint (failovers: of those, the ones moved to another NIC
// pair), error completions, device regions the NICs registered (gpu_hmem)
// and those left to staging (gpu_staged), the NICs opened with FI_HMEM
// (nics_hmem); per NIC
// its posts and bytes; per NIC pair (rail.<local NIC>-<peer NIC index>,
// summed over peers) the bytes it completed, the failures that cooled it
// down and the operations moved off it.
func (t *Transport) Stats() map[string]uint64 {
	out := map[string]uint64{
		"posts": t.st.posts.Load(), "eagain": t.st.eagain.Load(), "bytes": t.st.bytes.Load(),
		"teardowns": t.st.teardowns.Load(), "stalls": t.st.stalls.Load(), "stall_checks": t.st.stallChecks.Load(), "retries": t.st.retries.Load(), "errors": t.st.errors.Load(),
		"drains": t.st.drains.Load(), "drain_timeouts": t.st.drainTimeouts.Load(),
		"gpu_staged": t.st.gpuRefused.Load(), "gpu_hmem": t.st.gpuHMEM.Load(),
	}
	out["failovers"] = t.st.failovers.Load()
	for _, n := range t.nics {
		if n.hmem {
			out["nics_hmem"]++
		}
		out["nic."+n.name+".posts"] = n.posts.Load()
		out["nic."+n.name+".bytes"] = n.bytes.Load()
	}
	// Per NIC pair, summed over peers: bytes, failures, slices moved off.
	t.mu.Lock()
	for k, r := range t.rails {
		c := r.Counters()
		name := "rail." + t.nics[k.local].name + "-" + strconv.Itoa(k.remote)
		out[name+".bytes"] += c.Bytes
		out[name+".errors"] += c.Errors
		out[name+".retries"] += c.Retries
	}
	t.mu.Unlock()
	return out
}

// Live reports the peer instances the transport has endpoints to and those
// endpoints (transport.LiveReporter).
func (t *Transport) Live() transport.Live {
	t.mu.Lock()
	defer t.mu.Unlock()
	inst := map[string]struct{}{}
	for k := range t.eps {
		inst[k.instance] = struct{}{}
	}
	return transport.Live{Peers: len(inst), Endpoints: len(t.eps)}
}

// barrier returns once no holder of mu is left from before the call.
func (t *Transport) barrier() {
	t.mu.Lock()
	defer t.mu.Unlock()
	_ = t.eps // a barrier: nothing to do under mu
}

// goTracked runs f in a goroutine Close waits for; false once the
// transport is closing.
func (t *Transport) goTracked(f func()) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closing.Load() {
		return false
	}
	t.wg.Add(1)
	go func() {
		defer t.wg.Done()
		f()
	}()
	return true
}

// Close fails everything in flight and releases every libfabric object.
// Endpoints are closed before their requests complete: the close is the
// flush after which the provider touches none of their memory.
func (t *Transport) Close() error {
	if t.closing.Swap(true) {
		return nil
	}
	if t.cancel == nil {
		return nil
	}
	t.cancel()
	// Goroutines are added under mu after a look at closing: once mu was
	// free after the swap, none is added any more.
	t.barrier()
	t.wg.Wait()
	for _, n := range t.nics {
		n.stop()
	}
	t.mu.Lock()
	eps := t.eps
	t.eps = map[epKey]*peerEP{}
	regs := t.regs
	t.regs = map[*segment.Region][]*fab.MR{}
	t.mu.Unlock()
	closed := errs.New(errs.Closed, "fabric", "transport closed")
	for _, n := range t.nics {
		n.shutdown(closed)
	}
	for _, pe := range eps {
		pe.failPending(closed)
	}
	for _, mrs := range regs {
		for _, m := range mrs {
			_ = m.Close()
		}
	}
	for _, n := range t.nics {
		n.release()
	}
	return nil
}
