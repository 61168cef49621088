package rdma

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/tecache/te/internal/errs"
)

func sampleHandshake() handshake {
	return handshake{
		LocalNICPath: "10.0.0.1:12345@mlx5_0", PeerNICPath: "10.0.0.2:12345@mlx5_1",
		QPNum: []uint32{0x11, 0x12}, LID: 7, GID: "fe:80:00:00:00:00:00:00:02:02:c9:ff:fe:00:00:01",
		MTU: 5, PSN: 0x123456, Instance: "a1", PeerInstance: "b2",
	}
}

func TestHandshakeRoundTrip(t *testing.T) {
	h := sampleHandshake()
	b, err := h.encode()
	if err != nil {
		t.Fatal(err)
	}
	// Mooncake's HandShakeDesc names.
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"local_nic_path", "peer_nic_path", "qp_num"} {
		if _, ok := m[k]; !ok {
			t.Errorf("encoded handshake lacks %q: %s", k, b)
		}
	}
	got, gid, err := decodeHandshake(b)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(*got, h) || formatGID(gid) != h.GID {
		t.Fatalf("round trip: %+v, gid %x", got, gid)
	}
	seg, dev, ok := splitNICPath(got.LocalNICPath)
	if !ok || seg != "10.0.0.1:12345" || dev != "mlx5_0" {
		t.Fatalf("splitNICPath = %q %q %v", seg, dev, ok)
	}
}

func TestHandshakeInvalid(t *testing.T) {
	mod := func(f func(*handshake)) []byte {
		h := sampleHandshake()
		f(&h)
		b, _ := json.Marshal(h)
		return b
	}
	cases := map[string][]byte{
		"not json":     []byte("{"),
		"trailing":     append(mod(func(*handshake) {}), []byte(" {}")...),
		"too large":    []byte(`{"reply_msg":"` + strings.Repeat("x", MaxHandshake) + `"}`),
		"no qps":       mod(func(h *handshake) { h.QPNum = nil }),
		"too many qps": mod(func(h *handshake) { h.QPNum = make([]uint32, MaxQPsPerEndpoint+1) }),
		"qpn 0":        mod(func(h *handshake) { h.QPNum = []uint32{0} }),
		"qpn 25 bits":  mod(func(h *handshake) { h.QPNum = []uint32{1 << 24} }),
		"mtu":          mod(func(h *handshake) { h.MTU = 6 }),
		"psn":          mod(func(h *handshake) { h.PSN = 1 << 24 }),
		"gid":          mod(func(h *handshake) { h.GID = "fe80::1" }),
		"local path":   mod(func(h *handshake) { h.LocalNICPath = "mlx5_0" }),
		"peer path":    mod(func(h *handshake) { h.PeerNICPath = "seg@" }),
		"no instance":  mod(func(h *handshake) { h.Instance = "" }),
		"wrong types":  []byte(`{"qp_num":"1"}`),
		"negative qpn": []byte(`{"qp_num":[-1]}`),
		"empty":        nil,
	}
	for name, b := range cases {
		if _, _, err := decodeHandshake(b); !errors.Is(err, errs.ErrProtocol) {
			t.Errorf("%s: %v, want a protocol error", name, err)
		}
	}
}

func FuzzHandshake(f *testing.F) {
	h := sampleHandshake()
	b, _ := h.encode()
	f.Add(b)
	f.Add([]byte(`{"qp_num":[1],"local_nic_path":"a@b","peer_nic_path":"c@d","mtu":1,"gid":"00000000000000000000000000000000","te_instance":"x"}`))
	f.Fuzz(func(t *testing.T, in []byte) {
		h, _, err := decodeHandshake(in)
		if err != nil {
			if !errors.Is(err, errs.ErrProtocol) {
				t.Fatalf("error %v is not a protocol error", err)
			}
			return
		}
		out, err := h.encode()
		if err != nil {
			t.Fatal(err)
		}
		h2, _, err := decodeHandshake(out)
		if err != nil || !reflect.DeepEqual(h, h2) {
			t.Fatalf("re-decode: %+v vs %+v: %v", h, h2, err)
		}
	})
}
