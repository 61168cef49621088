package shm

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/tecache/te/engine/segment"
	"github.com/tecache/te/engine/transport"
	"github.com/tecache/te/internal/errs"
)

func seeds() [][]byte {
	return [][]byte{
		(&attachReq{Pid: 42, BootID: "b", PidNS: "pid:[1]", Instance: "i", RPC: "127.0.0.1:1"}).encode(),
		(&attachRep{Session: 7, LeaseNS: 9, Probe: 0x1000, Token: [tokenLen]byte{1, 2}}).encode(),
		(&validateReq{Session: 7, Items: []item{{1, 2, 3}, {4, 5, 6}}}).encode(),
		(&validateRep{LeaseNS: 5, Grants: []grant{{0, 1, 2}, {errs.StaleDescriptor, 0, 0}}}).encode(),
		(&revokeReq{Owner: "o", Session: 7, Items: []item{{1, 2, 3}}}).encode(),
		(&detachReq{Session: 7}).encode(),
		ackReply(opRevoke),
		{opValidate, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff}, // lying count
	}
}

// FuzzDecode feeds every decoder arbitrary bytes: none may panic or allocate
// by a count it has not checked, and whatever decodes encodes back to the
// same bytes.
func FuzzDecode(f *testing.F) {
	for _, s := range seeds() {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if m, err := decodeAttachReq(b); err == nil && !bytes.Equal(m.encode(), b) {
			t.Fatalf("attach %x re-encodes as %x", b, m.encode())
		}
		if m, err := decodeAttachRep(b); err == nil && !bytes.Equal(m.encode(), b) {
			t.Fatalf("attach reply %x re-encodes as %x", b, m.encode())
		}
		if m, err := decodeValidateReq(b); err == nil && !bytes.Equal(m.encode(), b) {
			t.Fatalf("validate %x re-encodes as %x", b, m.encode())
		}
		if m, err := decodeValidateRep(b); err == nil && !bytes.Equal(m.encode(), b) {
			t.Fatalf("validate reply %x re-encodes as %x", b, m.encode())
		}
		if m, err := decodeRevokeReq(b); err == nil && !bytes.Equal(m.encode(), b) {
			t.Fatalf("revoke %x re-encodes as %x", b, m.encode())
		}
		if m, err := decodeDetachReq(b); err == nil && !bytes.Equal(m.encode(), b) {
			t.Fatalf("detach %x re-encodes as %x", b, m.encode())
		}
	})
}

func TestDecodeRefuses(t *testing.T) {
	good := (&validateReq{Session: 1, Items: []item{{1, 2, 3}}}).encode()
	for name, b := range map[string][]byte{
		"empty":    nil,
		"wrong op": append([]byte{opRevoke}, good[1:]...),
		"short":    good[:len(good)-1],
		"trailing": append(append([]byte(nil), good...), 0),
		"lying n":  seeds()[7],
		"long str": append([]byte{opRevoke, 0xff, 0xff}, make([]byte, 70000)...),
		"too many": append(append([]byte{opValidate}, make([]byte, 8)...), 0x01, 0x10, 0, 0),
	} {
		if _, err := decodeValidateReq(b); err == nil && name != "wrong op" {
			t.Errorf("%s: validate decoded", name)
		}
		if _, err := decodeRevokeReq(b); err == nil {
			t.Errorf("%s: revoke decoded", name)
		}
		if err := checkAck(b, opRevoke); err == nil {
			t.Errorf("%s: taken for an acknowledgement", name)
		}
	}
}

// fakeHost is a transport.Host whose control plane only records the handler
// and fails every call.
type fakeHost struct {
	reg     *segment.Registry
	handler func(context.Context, []byte) ([]byte, error)
	params  map[string]string
	logs    []string
	call    func(body []byte) ([]byte, error) // nil: every call fails
}

func (h *fakeHost) SegmentName() string           { return "fake" }
func (h *fakeHost) Instance() string              { return "fake-instance" }
func (h *fakeHost) Registry() *segment.Registry   { return h.reg }
func (h *fakeHost) Control() transport.Control    { return h }
func (h *fakeHost) Logf(f string, a ...any)       { h.logs = append(h.logs, f) }
func (h *fakeHost) Param(k string) (string, bool) { v, ok := h.params[k]; return v, ok }
func (h *fakeHost) Handle(kind uint8, f func(context.Context, []byte) ([]byte, error)) {
	h.handler = f
}
func (h *fakeHost) Call(_ context.Context, _ string, _ uint8, body []byte) ([]byte, error) {
	if h.call != nil {
		return h.call(body)
	}
	return nil, errs.New(errs.PeerUnreachable, "fake", "no network here")
}

func started(t *testing.T, params map[string]string) (*Transport, *fakeHost) {
	t.Helper()
	h := &fakeHost{reg: segment.NewRegistry(), params: params}
	tr := New()
	if err := tr.Start(h); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tr.Close() })
	tr.Describe(&segment.Desc{RPC: "127.0.0.1:1"})
	return tr, h
}

// TestHandlerRefusesBadInput: malformed or unexpected messages get an error
// with a stable code, never a panic, and change nothing.
func TestHandlerRefusesBadInput(t *testing.T) {
	tr, h := started(t, nil)
	ctx := context.Background()
	self := tr.self
	for name, c := range map[string]struct {
		body []byte
		code errs.Code
	}{
		"empty":           {nil, errs.Protocol},
		"unknown op":      {[]byte{99}, errs.Protocol},
		"short attach":    {[]byte{opAttach, 1}, errs.Protocol},
		"other host":      {(&attachReq{Pid: 1, BootID: "x", PidNS: self.PidNS, Instance: "i", RPC: "r"}).encode(), errs.NotSupported},
		"other pid ns":    {(&attachReq{Pid: 1, BootID: self.BootID, PidNS: "pid:[0]", Instance: "i", RPC: "r"}).encode(), errs.NotSupported},
		"same pid":        {(&attachReq{Pid: uint32(self.Pid), BootID: self.BootID, PidNS: self.PidNS, Instance: "i", RPC: "r"}).encode(), errs.InvalidArgument},
		"no rpc":          {(&attachReq{Pid: 1, BootID: self.BootID, PidNS: self.PidNS, Instance: "i"}).encode(), errs.InvalidArgument},
		"unreachable":     {(&attachReq{Pid: 1, BootID: self.BootID, PidNS: self.PidNS, Instance: "i", RPC: "r"}).encode(), errs.PeerUnreachable},
		"unknown session": {(&validateReq{Session: 5, Items: []item{{1, 2, 3}}}).encode(), errs.AccessDenied},
		"bad detach":      {[]byte{opDetach, 1, 2}, errs.Protocol},
		"bad revoke":      {[]byte{opRevoke, 1}, errs.Protocol},
	} {
		_, err := h.handler(ctx, c.body)
		if errs.CodeOf(err) != c.code {
			t.Errorf("%s: %v, want %v", name, err, c.code)
		}
	}
	// A detach or revoke for nothing known is acknowledged.
	if b, err := h.handler(ctx, (&detachReq{Session: 9}).encode()); err != nil || checkAck(b, opDetach) != nil {
		t.Errorf("detach of an unknown session: %x %v", b, err)
	}
	if b, err := h.handler(ctx, (&revokeReq{Owner: "nobody", Session: 9, Items: []item{{1, 2, 3}}}).encode()); err != nil || checkAck(b, opRevoke) != nil {
		t.Errorf("revoke from an unknown owner: %x %v", b, err)
	}
	if len(tr.peers) != 0 || len(tr.owners) != 0 {
		t.Fatal("bad input left state behind")
	}
}

// TestReachableIdentity: only a peer on this boot, in this pid namespace, in
// another process is considered; a peer we cannot attach to is refused with
// the reason, and a submit to it fails without hanging.
func TestReachableIdentity(t *testing.T) {
	tr, _ := started(t, nil)
	base := func() *segment.Desc {
		h := tr.self
		h.Pid = 1
		return &segment.Desc{Name: "p", Instance: "x", RPC: "127.0.0.1:1", Host: &h}
	}
	for name, mod := range map[string]func(*segment.Desc){
		"no identity":  func(d *segment.Desc) { d.Host = nil },
		"other boot":   func(d *segment.Desc) { d.Host.BootID = "other" },
		"other pid ns": func(d *segment.Desc) { d.Host.PidNS = "pid:[1]" },
		"this process": func(d *segment.Desc) { d.Host.Pid = tr.self.Pid },
		"no rpc":       func(d *segment.Desc) { d.RPC = "" },
		"unreachable":  func(*segment.Desc) {},
	} {
		d := base()
		mod(d)
		if err := tr.Reachable(d); errs.CodeOf(err) != errs.TransportUnavailable {
			t.Errorf("%s: %v, want TransportUnavailable", name, err)
		}
	}
	if s := tr.Stats(); s["attach_failed"] != 1 {
		t.Fatalf("stats %v, want one failed attach", s)
	}
	d := base()
	done := make(chan error, 1)
	tr.Submit([]transport.Request{{Op: transport.Write, Local: 1, Remote: 1, Length: 1, Peer: d,
		Buffer: &segment.BufferDesc{Addr: 1, Length: 1, Key: 1}, Key: 1, Owner: transport.DoneFunc(func(err error) { done <- err })}})
	if err := <-done; errs.CodeOf(err) != errs.TransportUnavailable {
		t.Fatalf("submit to an unreachable peer: %v", err)
	}
}

func TestOptions(t *testing.T) {
	for _, p := range []map[string]string{
		{"shm.lease": "0s"}, {"shm.lease": "x"}, {"shm.revoke_timeout": "-1s"},
		{"shm.workers": "0"}, {"shm.workers": "many"}, {"shm.job_bytes": "12"},
	} {
		h := &fakeHost{reg: segment.NewRegistry(), params: p}
		tr := New()
		if err := tr.Start(h); errs.CodeOf(err) != errs.InvalidArgument {
			t.Errorf("%v: %v, want InvalidArgument", p, err)
			tr.Close()
		}
	}
	tr, _ := started(t, map[string]string{"shm.lease": "2s", "shm.workers": "3", "shm.job_bytes": "65536"})
	if o := tr.Options(); o.Lease != 2e9 || o.Workers != 3 || o.JobBytes != 65536 {
		t.Fatalf("options %+v", o)
	}
}

// TestSubmitAfterClose: requests submitted to a closed transport end with
// Closed at once; Close twice is fine.
func TestSubmitAfterClose(t *testing.T) {
	tr, _ := started(t, nil)
	tr.Close()
	done := make(chan error, 1)
	h := tr.self
	h.Pid = 1
	tr.Submit([]transport.Request{{Op: transport.Read, Local: 1, Remote: 1, Length: 1,
		Peer: &segment.Desc{Name: "p", Instance: "x", RPC: "r", Host: &h}, Buffer: &segment.BufferDesc{Key: 1}, Key: 1,
		Owner: transport.DoneFunc(func(err error) { done <- err })}})
	if err := <-done; errs.CodeOf(err) != errs.Closed {
		t.Fatalf("%v, want Closed", err)
	}
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
}

// attachedOwner gives tr an owner state with an active session, as if attach
// had succeeded.
func attachedOwner(tr *Transport) *owner {
	h := tr.self
	h.Pid = 1
	o := tr.ownerFor(&segment.Desc{Name: "p", Instance: "owner-1", RPC: "r", Host: &h})
	o.session, o.lease, o.leaseUntil, o.probed = 77, time.Hour, time.Now().Add(time.Hour), true
	o.allowed = map[uint64]*entry{}
	return o
}

// TestRevokeWaitsForInFlight: the acknowledgement of a revocation waits until
// the access in flight to the buffer has ended, and new accesses are refused
// from the moment the revocation arrived.
func TestRevokeWaitsForInFlight(t *testing.T) {
	tr, h := started(t, nil)
	o := attachedOwner(tr)
	e := &entry{addr: 0x1000, len: 0x1000}
	o.allowed[5] = e
	if !e.acquire() {
		t.Fatal("acquire refused")
	}
	acked := make(chan error, 1)
	go func() {
		_, err := h.handler(context.Background(), (&revokeReq{Owner: "owner-1", Session: 77, Items: []item{{5, 0x1000, 0x1000}}}).encode())
		acked <- err
	}()
	for !e.revoked.Load() {
		time.Sleep(time.Millisecond)
	}
	if e.acquire() {
		t.Fatal("a new access was let in after the revocation arrived")
	}
	select {
	case err := <-acked:
		t.Fatalf("acknowledged with an access in flight (%v)", err)
	case <-time.After(50 * time.Millisecond):
	}
	e.release()
	if err := <-acked; err != nil {
		t.Fatal(err)
	}
	if o.allowed[5] != nil {
		t.Fatal("the key is still allowed")
	}
}

// TestRevokeOvertakesGrant: a revocation that arrives while the validation of
// the same key is on its way back must win: the grant is dropped and the
// caller asks again (and the owner, which has unregistered, refuses).
func TestRevokeOvertakesGrant(t *testing.T) {
	tr, h := started(t, nil)
	o := attachedOwner(tr)
	h.call = func(body []byte) ([]byte, error) {
		// The owner granted key 5, then unregistered it; its revocation
		// reaches us before the grant does.
		if _, err := h.handler(context.Background(), (&revokeReq{Owner: "owner-1", Session: 77, Items: []item{{5, 0x1000, 0x1000}}}).encode()); err != nil {
			return nil, err
		}
		return (&validateRep{LeaseNS: uint64(time.Hour), Grants: []grant{{0, 0x1000, 0x1000}}}).encode(), nil
	}
	if _, err := o.validate(tr, []item{{5, 0x1000, 0x1000}}); err != errRaced {
		t.Fatalf("validate: %v, want the race reported", err)
	}
	if o.allowed[5] != nil {
		t.Fatal("a revoked key was granted")
	}
	// Without a revocation in between the grant is kept.
	h.call = func([]byte) ([]byte, error) {
		return (&validateRep{LeaseNS: uint64(time.Hour), Grants: []grant{{0, 0x1000, 0x1000}}}).encode(), nil
	}
	if _, err := o.validate(tr, []item{{5, 0x1000, 0x1000}}); err != nil || o.allowed[5] == nil {
		t.Fatalf("validate: %v, allowed %v", err, o.allowed[5])
	}
	// An owner that no longer knows the session makes us start over.
	h.call = func([]byte) ([]byte, error) { return nil, errs.New(errs.AccessDenied, "x", "cut off") }
	if _, err := o.validate(tr, nil); errs.CodeOf(err) != errs.AccessDenied || o.session != 0 || o.allowed != nil {
		t.Fatalf("after a refused renewal: %v, session %d", err, o.session)
	}
}

// TestHandlersCheckProvenCaller: with a secret the engine hands each control
// call the instance its session proved (transport.CallerOf); a body that
// names another instance (attach in another's name, validate or detach
// another's session, revoke another owner's grants) is refused with
// Unauthenticated and changes nothing. Without a secret (an unknown caller)
// the body is taken at its word, as before.
func TestHandlersCheckProvenCaller(t *testing.T) {
	tr, h := started(t, nil)
	self := tr.self
	mallory := transport.WithCaller(context.Background(), segment.Caller{Name: "mallory", Instance: "mallory-1", Known: true})
	owner := transport.WithCaller(context.Background(), segment.Caller{Name: "p", Instance: "owner-1", Known: true})
	// A session of instance "victim-1", as if it had attached.
	tr.pmu.Lock()
	tr.peers[42] = &peer{session: 42, instance: "victim-1", rpc: "r", pid: 1, pidfd: -1, grants: map[uint64]struct{}{}, lastGrant: time.Now()}
	tr.pmu.Unlock()
	o := attachedOwner(tr)
	o.allowed[5] = &entry{addr: 0x1000, len: 0x1000}
	for name, body := range map[string][]byte{
		"attach in another's name":   (&attachReq{Pid: 1, BootID: self.BootID, PidNS: self.PidNS, Instance: "victim-1", RPC: "r"}).encode(),
		"validate another's session": (&validateReq{Session: 42, Items: []item{{1, 2, 3}}}).encode(),
		"detach another's session":   (&detachReq{Session: 42}).encode(),
		"revoke as another owner":    (&revokeReq{Owner: "owner-1", Session: 77, Items: []item{{5, 0x1000, 0x1000}}}).encode(),
	} {
		if _, err := h.handler(mallory, body); errs.CodeOf(err) != errs.Unauthenticated {
			t.Errorf("%s: %v, want Unauthenticated", name, err)
		}
	}
	if tr.peers[42] == nil || o.allowed[5] == nil {
		t.Fatal("a refused call changed state")
	}
	// The engine the session proved is served.
	if b, err := h.handler(owner, (&revokeReq{Owner: "owner-1", Session: 77, Items: []item{{5, 0x1000, 0x1000}}}).encode()); err != nil || checkAck(b, opRevoke) != nil {
		t.Fatalf("revoke from the proven owner: %v", err)
	}
	if o.allowed[5] != nil {
		t.Fatal("the proven owner's revoke did not end the grant")
	}
}
