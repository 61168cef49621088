package proto

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"

	"github.com/tecache/te/internal/errs"
)

// State is a transfer's state.
type State string

// States. Done, Failed, Aborted and Expired are terminal.
const (
	Waiting      State = "waiting"      // one side declared, the other not yet
	Transferring State = "transferring" // both declared; the mover moves the KV
	Done         State = "done"
	Failed       State = "failed"
	Aborted      State = "aborted"
	Expired      State = "expired"
)

// States lists every state, for metrics.
var States = []State{Waiting, Transferring, Done, Failed, Aborted, Expired}

// Terminal reports whether s is final.
func (s State) Terminal() bool { return s == Done || s == Failed || s == Aborted || s == Expired }

// Mode says which side moves the bytes.
type Mode string

// Modes.
const (
	Push Mode = "push" // prefill WRITEs into decode (Mooncake, SGLang)
	Pull Mode = "pull" // decode READs from prefill (NIXL)
)

// Role is a side of a transfer.
type Role string

// Roles.
const (
	Prefill Role = "prefill" // holds the KV (the source)
	Decode  Role = "decode"  // receives it (the destination)
)

// Mover returns the role that moves the bytes in mode m.
func (m Mode) Mover() Role {
	if m == Pull {
		return Decode
	}
	return Prefill
}

// NotifyName is the engine notification name a mover sends to the other
// side when it has finished; the message is a JSON Notice.
const NotifyName = "te.handoff"

// Notice is the message of a NotifyName notification.
type Notice struct {
	ID    string `json:"id"`
	OK    bool   `json:"ok"`
	Bytes uint64 `json:"bytes"`
	Code  int32  `json:"code,omitempty"` // errs.Code when !OK
	// MAC is NoticeMAC under the transfer's Record.NoticeKey, in hex: the
	// waiting side counts a notice only when it verifies, so only the
	// paired mover can end its wait.
	MAC string `json:"mac,omitempty"`
}

// NoticeMAC is HMAC-SHA256, keyed with the transfer's notice key (its hex
// text as bytes), over a label and the notice's id, outcome, bytes and code.
func NoticeMAC(key string, n Notice) []byte {
	m := hmac.New(sha256.New, []byte(key))
	var b [13]byte
	if n.OK {
		b[0] = 1
	}
	binary.LittleEndian.PutUint64(b[1:], n.Bytes)
	binary.LittleEndian.PutUint32(b[9:], uint32(n.Code))
	m.Write([]byte("te.handoff notice v1\x00"))
	m.Write([]byte(n.ID))
	m.Write([]byte{0})
	m.Write(b[:])
	return m.Sum(nil)
}

// Sign sets n.MAC under key.
func (n *Notice) Sign(key string) { n.MAC = hex.EncodeToString(NoticeMAC(key, *n)) }

// Verify reports whether n carries a MAC under key (a non-empty key).
func (n Notice) Verify(key string) bool {
	got, err := hex.DecodeString(n.MAC)
	return key != "" && err == nil && hmac.Equal(got, NoticeMAC(key, n))
}

// CapabilityHeader carries a side's capability on complete, abort, status
// and wait.
const CapabilityHeader = "X-Te-Capability"

// ClientHeader names the client (te's clients send their engine's segment
// name). The sidecar keeps a client's quotas under this name only when the
// request's bearer token is the client token minted for it from the
// cluster secret (authsecret.ClientToken); otherwise under the source host,
// whatever the name.
const ClientHeader = "X-Te-Client"

// InstanceHeader carries the sidecar instance on every handoff answer.
const InstanceHeader = "X-Te-Sidecar-Instance"

// Decl is one side's declaration: the body of POST /handoff/expect (decode)
// and POST /handoff/ready (prefill).
type Decl struct {
	ID string `json:"id"`
	// Segment is the declaring side's engine segment name, which the mover
	// opens.
	Segment string `json:"segment"`
	// Layout is the side's kvcache.Layout in its JSON form, with the
	// per-layer base addresses.
	Layout json.RawMessage `json:"layout"`
	Blocks []int           `json:"blocks"`
	// Mode is set by decode; prefill may set it to have a mismatch refused.
	Mode Mode `json:"mode,omitempty"`
	// TimeoutMS bounds the transfer from now: unpaired or unfinished by
	// then, it expires. 0 takes the sidecar's default.
	TimeoutMS int64 `json:"timeout_ms,omitempty"`
	// Window is the key of the engine window the side granted over its
	// blocks (engine.GrantWindow): the mover presents it instead of the
	// buffers' keys, so the side can revoke this transfer's access alone.
	// Only the mover receives it.
	Window uint64 `json:"window,omitempty"`
}

// Peer is the other side's declaration as the mover receives it.
type Peer struct {
	Segment string          `json:"segment"`
	Layout  json.RawMessage `json:"layout"`
	Blocks  []int           `json:"blocks"`
	Window  uint64          `json:"window,omitempty"`
}

// Complete is the body of POST /handoff/complete, sent by the mover.
type Complete struct {
	ID     string `json:"id"`
	OK     bool   `json:"ok"`
	Bytes  uint64 `json:"bytes"`
	Code   int32  `json:"code,omitempty"` // errs.Code of the failure
	Reason string `json:"reason,omitempty"`
	// Requests is the number of engine requests the mover submitted.
	Requests int `json:"requests,omitempty"`
	// Seconds is the time the mover spent moving (plan to last byte).
	Seconds float64 `json:"seconds,omitempty"`
}

// Abort is the body of POST /handoff/abort.
type Abort struct {
	ID     string `json:"id"`
	Role   Role   `json:"role,omitempty"`
	Reason string `json:"reason,omitempty"`
}

// Record is what every successful answer carries: the transfer's state as
// the sidecar holds it.
type Record struct {
	// Instance identifies this sidecar start; a client that sees it change
	// knows the sidecar restarted and its transfers are lost.
	Instance string `json:"instance"`
	ID       string `json:"id"`
	State    State  `json:"state"`
	Mode     Mode   `json:"mode,omitempty"`
	// Version grows with every change; GET /handoff/wait?since=V returns
	// once it exceeds V.
	Version  uint64 `json:"version"`
	Expect   bool   `json:"expect"` // decode has declared
	Ready    bool   `json:"ready"`  // prefill has declared
	Bytes    uint64 `json:"bytes,omitempty"`
	Code     int32  `json:"code,omitempty"` // errs.Code of a failed, aborted or expired transfer
	Reason   string `json:"reason,omitempty"`
	AbortBy  Role   `json:"abort_by,omitempty"`
	Settled  bool   `json:"settled"` // the mover is known not to touch either side's memory any more
	Requests int    `json:"requests,omitempty"`
	// ExpiresInMS is the time left before the transfer expires (0 once
	// terminal).
	ExpiresInMS int64 `json:"expires_in_ms,omitempty"`
	// Peer is the other side's declaration, given to the mover once both
	// sides have declared.
	Peer *Peer `json:"peer,omitempty"`
	// NoticeKey is the transfer's notice key (32 hex digits), minted when
	// it pairs and shown only to the two sides that declared it (in
	// answers to requests carrying their capability): the mover signs its
	// completion notice with it (Notice.MAC).
	NoticeKey string `json:"notice_key,omitempty"`
	// Mover is the segment name the moving side declared, from pairing on,
	// shown only to the two sides that declared the transfer: the other
	// side binds the window it granted over its blocks to that engine
	// (engine.BindWindow), or learns that another engine used it first.
	Mover string `json:"mover,omitempty"`
	// Capability is the declaring side's capability for this transfer,
	// in the answer to its declaration only: a random 128-bit value (32 hex
	// digits) that the side presents in CapabilityHeader on every later
	// request about the transfer.
	Capability string `json:"capability,omitempty"`
}

// ErrorBody is the body of every 4xx/5xx answer of the handoff routes.
type ErrorBody struct {
	Instance string `json:"instance"`
	Error    string `json:"error"`
	Code     int32  `json:"code"` // errs.Code
	// Record is the transfer's current state when the request conflicted
	// with it (409), so the caller learns e.g. that it was aborted.
	Record *Record `json:"record,omitempty"`
}

// Code is the error code a caller sees when the transfer ended in state s.
func (s State) Code() errs.Code {
	switch s {
	case Aborted:
		return errs.Canceled
	case Expired:
		return errs.Timeout
	case Failed:
		return errs.Internal
	}
	return errs.OK
}
