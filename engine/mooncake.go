package engine

import (
	"context"
	"encoding/json"
	"sync"
	"sync/atomic"

	"github.com/tecache/te/engine/internal/ctrl"
	"github.com/tecache/te/engine/segment"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/wire"
)

// Interop with Mooncake Transfer Engine peers (spec.md, "Mooncake interop"),
// the engine's side of it, all here: whether Mooncake peers are served, the
// handlers of the handshake kinds 1 to 3, the choice between te's and
// Mooncake's handshake when this engine fetches a peer's descriptor, sends it
// a notification or probes it, and the adoption of a Mooncake descriptor.
// The handshake's framing is a dialect of the control plane
// (internal/ctrl/mooncake.go); the data path is a framing of the tcp
// transport (transport/tcp/mooncake.go).

// EnvAcceptMooncakePeers turns Config.AcceptMooncakePeers on for every entry
// point (Go, C, Python) when set to 1 (env.go reads it).
const EnvAcceptMooncakePeers = "TE_ACCEPT_MOONCAKE_PEERS"

// paramAcceptMooncake is the transport parameter the engine answers from its
// own decision (Host.Param), never from Config.Params.
const paramAcceptMooncake = "mooncake.accept"

// maxMooncakeAddrs bounds the remembered Mooncake peer addresses.
const maxMooncakeAddrs = 4096

// mooncakeState is an engine's Mooncake interop state.
type mooncakeState struct {
	// accept: serve Mooncake peers' data requests (no key, no
	// authentication).
	accept bool
	// open: answer Mooncake's handshake (Metadata, Notify, Probe) on the
	// RPC listener. With a cluster secret only when Mooncake peers are
	// accepted at all (AcceptMooncakePeers, which the secret admits only
	// with AllowMooncakeWithSecret): a Mooncake peer cannot prove it holds
	// the secret, so it learns the descriptor's addresses and queues
	// notifications only where the operator chose to trust the network.
	open bool
	// call: talk to an engine known to be Mooncake's (its descriptor says
	// so) as an initiator. With a secret only with AllowMooncakeWithSecret.
	call bool
	// guess: take a te call that was closed unanswered for a Mooncake
	// engine and ask again Mooncake's way. Never with a secret: whoever can
	// cut a connection (or answer in its place) would otherwise make this
	// engine speak an unauthenticated protocol to whatever answers.
	guess bool
	addrs sync.Map // RPC address -> struct{}: known to be a Mooncake engine
	n     atomic.Int64
	noted atomic.Uint64
}

// newMooncakeState decides what Mooncake peers may do; secret says whether
// the engine loaded a cluster secret.
func newMooncakeState(cfg *Config, secret bool) (*mooncakeState, error) {
	m := &mooncakeState{
		accept: cfg.AcceptMooncakePeers, // env.go applied TE_ACCEPT_MOONCAKE_PEERS
		call:   !secret || cfg.AllowMooncakeWithSecret,
		guess:  !secret,
	}
	m.open = !secret || cfg.AllowMooncakeWithSecret && m.accept
	if cfg.Encrypt {
		// Mooncake's protocol has no encryption: an encrypting engine
		// never talks to a Mooncake peer, whatever else allows it.
		if m.accept {
			return nil, errs.New(errs.InvalidArgument, "new",
				"Mooncake peers are to be accepted, but encryption (%s) is on and Mooncake's protocol sends KV in the clear", EnvEncrypt).
				WithHint("an encrypting engine never talks to Mooncake peers: turn one of the two off")
		}
		m.call, m.open, m.guess = false, false, false
	}
	if m.accept && !m.call {
		return nil, errs.New(errs.InvalidArgument, "new",
			"Mooncake peers are to be accepted, but a cluster secret is set and Mooncake peers cannot authenticate").
			WithHint("to accept them anyway (they bypass the secret: the network is trusted) set " + EnvAllowMooncakeWithSecret +
				"=1 (Config.AllowMooncakeWithSecret, te_config_t.allow_mooncake_with_secret, te.Engine(allow_mooncake_with_secret=True)); " +
				"or do not accept Mooncake peers")
	}
	if m.accept {
		cfg.Logger.Warn("te: accepting Mooncake peers: their tcp requests carry no key and are not authenticated; the network is trusted")
	}
	return m, nil
}

func (m *mooncakeState) known(addr string) bool {
	_, ok := m.addrs.Load(addr)
	return ok
}

func (m *mooncakeState) remember(addr string) {
	if _, loaded := m.addrs.LoadOrStore(addr, struct{}{}); !loaded && m.n.Add(1) > maxMooncakeAddrs {
		// Too many peers come and go: start over (each costs one te
		// attempt more when next met).
		m.addrs.Range(func(k, _ any) bool { m.addrs.Delete(k); return true })
		m.n.Store(0)
	}
}

func (m *mooncakeState) forget(addr string) {
	if _, ok := m.addrs.LoadAndDelete(addr); ok {
		m.n.Add(-1)
	}
}

// mooncakeTCP is the name Mooncake's descriptors give its tcp transport.
const mooncakeTCP = "tcp"

// mooncakeProtocol sets the descriptor's protocol, the field a Mooncake
// initiator picks its transport by: what the transports' Describe said, but
// tcp when this engine serves Mooncake initiators, since it serves them on
// tcp alone.
func (e *Engine) mooncakeProtocol(d *segment.Desc) {
	if e.mc.accept {
		d.Protocol = mooncakeTCP
	}
}

// mooncakeParam answers the transport parameters that are the engine's to
// decide.
func (e *Engine) mooncakeParam(key string) (string, bool) {
	if key != paramAcceptMooncake {
		return "", false
	}
	if e.mc.accept {
		return "1", true
	}
	return "0", true
}

// installMooncake serves Mooncake's handshake kinds on the RPC listener.
func (e *Engine) installMooncake() {
	e.ctrl.Handle(wire.KindMooncakeMetadata, e.handleMooncakeMetadata)
	e.ctrl.Handle(wire.KindMooncakeNotify, e.handleMooncakeNotify)
	e.ctrl.Handle(wire.KindMooncakeProbe, e.handleMooncakeProbe)
}

// mooncakeGate refuses a Mooncake handshake request when Mooncake peers are
// shut out, and checks that its body is JSON, as Mooncake's listener does.
func (e *Engine) mooncakeGate(what string, body []byte) error {
	if !e.mc.open {
		if n := e.mc.noted.Add(1); n&1023 == 1 {
			e.cfg.Logger.Warn("te: refused a Mooncake peer's handshake: a cluster secret is set (Config.AcceptMooncakePeers with AllowMooncakeWithSecret admits them)",
				"request", what, "refused", n)
		}
		return errs.New(errs.Unauthenticated, "mooncake", "Mooncake peers cannot authenticate")
	}
	if !json.Valid(body) {
		return errs.New(errs.Protocol, "mooncake", "%s body is not JSON", what)
	}
	return nil
}

// handleMooncakeMetadata answers Mooncake's Metadata request with this
// engine's descriptor as a Mooncake peer may see it (no keys).
func (e *Engine) handleMooncakeMetadata(_ context.Context, body []byte) ([]byte, error) {
	if err := e.mooncakeGate("metadata", body); err != nil {
		return nil, err
	}
	return e.desc.Load().ForMooncake().Encode()
}

// handleMooncakeNotify queues a Mooncake peer's notification like a te
// peer's, under the same bounds.
func (e *Engine) handleMooncakeNotify(ctx context.Context, body []byte) ([]byte, error) {
	if err := e.mooncakeGate("notify", body); err != nil {
		return nil, err
	}
	n, err := wire.DecodeMooncakeNotify(body)
	if err != nil {
		return nil, err
	}
	if _, err := e.handleNotify(ctx, wire.AppendNotify(nil, []byte(n.Name), []byte(n.Msg))); err != nil {
		return nil, err
	}
	return wire.MooncakeNotifyReply, nil
}

func (e *Engine) handleMooncakeProbe(_ context.Context, body []byte) ([]byte, error) {
	if err := e.mooncakeGate("probe", body); err != nil {
		return nil, err
	}
	return wire.MooncakeProbeReply, nil
}

// mooncakeMaybe says whether a failed te call to addr may have met a Mooncake
// engine: Mooncake's listener takes a te frame for its old untyped JSON
// handshake and closes the connection without an answer.
func mooncakeMaybe(err error) bool {
	c := errs.CodeOf(err)
	return c == errs.PeerUnreachable || c == errs.Protocol
}

// describe fetches a peer's descriptor in peer-to-peer mode: with te's
// Describe, or, for a Mooncake engine, with Mooncake's Metadata exchange. A
// peer not known to be Mooncake is asked te's way first; if it closes
// without answering, Mooncake's way, but never with a cluster secret (no
// downgrade: a connection cut on the path must not turn into an
// unauthenticated exchange). A te engine that answers Mooncake's request
// (it restarted where a Mooncake engine was) is asked again te's way, for
// its full descriptor.
func (e *Engine) describe(ctx context.Context, addr, name string) ([]byte, error) {
	var teErr error
	if !e.mc.call || !e.mc.known(addr) {
		b, err := e.ctrl.CallTo(ctx, ctrl.Target{Addr: addr, Name: name}, wire.KindDescribe, []byte(name))
		if err == nil || !e.mc.guess || !mooncakeMaybe(err) || ctx.Err() != nil {
			return b, err
		}
		teErr = err
	}
	b, err := e.ctrl.ExchangeMooncake(ctx, addr, wire.KindMooncakeMetadata, e.mooncakeSelf(), segment.MaxDescSize)
	if err != nil {
		e.mc.forget(addr)
		if teErr != nil {
			return nil, teErr
		}
		return nil, err
	}
	var id struct {
		Instance string `json:"te_instance"`
	}
	if json.Unmarshal(b, &id) == nil && id.Instance != "" {
		e.mc.forget(addr)
		return e.ctrl.CallTo(ctx, ctrl.Target{Addr: addr, Name: name}, wire.KindDescribe, []byte(name))
	}
	e.mc.remember(addr)
	return b, nil
}

// mooncakeSelf is what this engine sends with a Metadata request: its own
// descriptor as a Mooncake peer may see it (Mooncake's listener parses it and
// otherwise ignores it).
func (e *Engine) mooncakeSelf() []byte {
	b, err := e.desc.Load().ForMooncake().Encode()
	if err != nil {
		return []byte("{}")
	}
	return b
}

// adoptMooncake completes a Mooncake engine's descriptor with what te needs
// to reach it: the RPC address (the one it was fetched from, or its rpc_meta
// record in the store), whose host its tcp data listener is on. A te
// engine's descriptor is left as it is. With a cluster secret and without
// AllowMooncakeWithSecret it refuses: a Mooncake peer cannot authenticate,
// and a store writer could otherwise turn any segment into an
// unauthenticated one by rewriting its descriptor.
func (e *Engine) adoptMooncake(d *segment.Desc, addr, name string) error {
	if !d.IsMooncake() {
		return nil
	}
	if e.cfg.Encrypt {
		return errs.New(errs.Unauthenticated, "open segment",
			"segment %q has a Mooncake Transfer Engine descriptor; this engine encrypts (%s) and Mooncake's protocol carries KV in the clear: refused", name, EnvEncrypt).
			WithHint("a Mooncake peer is never reached with encryption on (AllowMooncakeWithSecret does not change that); check who wrote this descriptor")
	}
	if !e.mc.call {
		return errs.New(errs.Unauthenticated, "open segment",
			"segment %q has a Mooncake Transfer Engine descriptor; Mooncake peers cannot prove they hold the cluster secret, and this engine has one", name).
			WithHint("set Config.AllowMooncakeWithSecret to reach Mooncake peers anyway (the network is then trusted for them), or check who wrote this descriptor to the metadata store")
	}
	if addr == "" {
		var err error
		if addr, err = e.rpcAddrOf(name); err != nil {
			return err
		}
	}
	d.RPC = addr
	e.mc.remember(addr)
	return nil
}

// sendNotify delivers a notification: te's Notify, or Mooncake's for a
// Mooncake engine (known, or found when te's call is closed unanswered).
func (e *Engine) sendNotify(ctx context.Context, seg, addr, name, msg string) error {
	if e.mc.call && e.mc.known(addr) {
		return e.notifyMooncake(ctx, addr, name, msg)
	}
	err := e.notifyTe(ctx, ctrl.Target{Addr: addr, Name: seg}, name, msg)
	if err == nil || !e.mc.guess || !mooncakeMaybe(err) || ctx.Err() != nil {
		return err
	}
	if e.notifyMooncake(ctx, addr, name, msg) != nil {
		return err
	}
	e.mc.remember(addr)
	return nil
}

func (e *Engine) notifyMooncake(ctx context.Context, addr, name, msg string) error {
	body, err := json.Marshal(wire.MooncakeNotify{Name: name, Msg: msg})
	if err != nil {
		return errs.Wrap(errs.InvalidArgument, "notify", err, "encode notification")
	}
	_, err = e.ctrl.ExchangeMooncake(ctx, addr, wire.KindMooncakeNotify, body, wire.MooncakeMaxHandshake)
	return err
}

// probeCall probes a peer: te's Probe, or for a known Mooncake engine
// Mooncake's, whose answer carries no identity (only the name is filled in).
func (e *Engine) probeCall(ctx context.Context, addr, name string) ([]byte, error) {
	if !e.mc.call || !e.mc.known(addr) {
		return e.ctrl.CallTo(ctx, ctrl.Target{Addr: addr, Name: name}, wire.KindProbe, nil)
	}
	b, err := e.ctrl.ExchangeMooncake(ctx, addr, wire.KindMooncakeProbe, []byte("{}"), wire.MooncakeMaxHandshake)
	if err != nil {
		return nil, err
	}
	var st struct {
		Status string `json:"status"`
	}
	if json.Unmarshal(b, &st) != nil || st.Status != "success" {
		return nil, errs.New(errs.Protocol, "probe", "Mooncake peer %s answered %q", addr, b)
	}
	return json.Marshal(Probe{Name: name})
}
