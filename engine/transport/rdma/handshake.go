package rdma

import (
	"bytes"
	"encoding/json"
	"strings"

	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/sys/ibv"
)

// MaxHandshake bounds a handshake payload; decoders refuse larger input
// before parsing it.
const MaxHandshake = 64 << 10

// MaxQPsPerEndpoint bounds the queue pairs one handshake may ask for.
const MaxQPsPerEndpoint = 64

// handshake is the payload of a wire.KindRDMA call and of its reply: one
// side's queue pairs of an endpoint and how to reach them. The field names
// are Mooncake's (HandShakeDesc) where the concept is the same; see
// internal/wire/spec.md, "rdma handshake".
type handshake struct {
	// LocalNICPath is the sender's "segment@device".
	LocalNICPath string `json:"local_nic_path"`
	// PeerNICPath is the receiver's "segment@device" the sender pairs with.
	PeerNICPath string `json:"peer_nic_path"`
	// QPNum lists the sender's queue pair numbers; a reply has as many as
	// the request, and QP i of one side is connected to QP i of the other.
	QPNum []uint32 `json:"qp_num"`
	// LID and GID address the sender's port; MTU is its active MTU (enum
	// ibv_mtu, 1 = 256 ... 5 = 4096); PSN its first packet sequence number.
	LID uint16 `json:"lid"`
	GID string `json:"gid"`
	MTU uint32 `json:"mtu"`
	PSN uint32 `json:"psn"`
	// Instance is the sender's engine instance; PeerInstance the instance
	// of the receiver the sender's descriptor came from (empty in a reply).
	// A receiver that restarted since refuses the handshake as stale.
	Instance     string `json:"te_instance"`
	PeerInstance string `json:"te_peer_instance,omitempty"`
	// ReplyMsg is Mooncake's error text field; te reports errors in the
	// control plane's error reply instead and leaves it empty.
	ReplyMsg string `json:"reply_msg,omitempty"`
}

func (h *handshake) encode() ([]byte, error) {
	b, err := json.Marshal(h)
	if err != nil {
		return nil, errs.Wrap(errs.Internal, "rdma", err, "encode handshake")
	}
	return b, nil
}

// splitNICPath splits "segment@device"; the device is after the last '@'
// (segment names may hold one, devices do not).
func splitNICPath(p string) (seg, dev string, ok bool) {
	i := strings.LastIndexByte(p, '@')
	if i <= 0 || i == len(p)-1 {
		return "", "", false
	}
	return p[:i], p[i+1:], true
}

// decodeHandshake parses and validates a handshake from a peer. Malformed
// input is a Protocol error, never a panic.
func decodeHandshake(b []byte) (*handshake, ibv.GID, error) {
	var g ibv.GID
	if len(b) > MaxHandshake {
		return nil, g, errs.New(errs.Protocol, "rdma", "handshake of %d bytes exceeds %d", len(b), MaxHandshake)
	}
	var h handshake
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(&h); err != nil {
		return nil, g, errs.Wrap(errs.Protocol, "rdma", err, "malformed handshake")
	}
	if dec.More() {
		return nil, g, errs.New(errs.Protocol, "rdma", "trailing data after handshake")
	}
	if _, _, ok := splitNICPath(h.LocalNICPath); !ok {
		return nil, g, errs.New(errs.Protocol, "rdma", "local_nic_path %q is not segment@device", h.LocalNICPath)
	}
	if _, _, ok := splitNICPath(h.PeerNICPath); !ok {
		return nil, g, errs.New(errs.Protocol, "rdma", "peer_nic_path %q is not segment@device", h.PeerNICPath)
	}
	if len(h.QPNum) == 0 || len(h.QPNum) > MaxQPsPerEndpoint {
		return nil, g, errs.New(errs.Protocol, "rdma", "handshake has %d queue pairs, want 1 to %d", len(h.QPNum), MaxQPsPerEndpoint)
	}
	for _, q := range h.QPNum {
		if q == 0 || q > 1<<24-1 {
			return nil, g, errs.New(errs.Protocol, "rdma", "queue pair number %d is not a 24-bit QPN", q)
		}
	}
	if ibv.MTUBytes(h.MTU) == 0 {
		return nil, g, errs.New(errs.Protocol, "rdma", "mtu %d is not an ibv_mtu value", h.MTU)
	}
	if h.PSN > 1<<24-1 {
		return nil, g, errs.New(errs.Protocol, "rdma", "psn %d exceeds 24 bits", h.PSN)
	}
	if h.Instance == "" {
		return nil, g, errs.New(errs.Protocol, "rdma", "handshake lacks te_instance")
	}
	g, err := parseGID(h.GID)
	if err != nil {
		return nil, g, err
	}
	return &h, g, nil
}
