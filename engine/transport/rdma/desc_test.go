package rdma

import (
	"encoding/json"
	"errors"
	"reflect"
	"testing"

	"github.com/tecache/te/engine/segment"
	"github.com/tecache/te/internal/errs"
)

// A descriptor as this transport publishes it survives the JSON codec with
// Mooncake's field names: devices {name, lid, gid}, and per buffer rkey[] and
// lkey[] in devices order.
func TestDescriptorKeys(t *testing.T) {
	d := &segment.Desc{Name: "10.0.0.1:12345", Protocol: "rdma", RPC: "10.0.0.1:12345", Instance: "i1",
		Buffers: []segment.BufferDesc{{Name: "cpu:0", Addr: 0x7f0000000000, Length: 1 << 30,
			Rkey: []uint32{0x1234, 0x5678}, Lkey: []uint32{0x4321, 0x8765}}}}
	nics := []nicInfo{{"mlx5_0", "ib"}, {"mlx5_1", "eth"}}
	d.Devices = []segment.Device{
		{Name: "mlx5_0", LID: 3, GID: "fe:80:00:00:00:00:00:00:02:02:c9:ff:fe:00:00:01"},
		{Name: "mlx5_1", LID: 0, GID: "00:00:00:00:00:00:00:00:00:00:ff:ff:0a:00:00:01"},
	}
	d.Endpoints = map[string]string{Name: endpointString(nics)}
	b, err := d.Encode()
	if err != nil {
		t.Fatal(err)
	}
	var raw struct {
		Devices []map[string]any `json:"devices"`
		Buffers []map[string]any `json:"buffers"`
	}
	if err := json.Unmarshal(b, &raw); err != nil {
		t.Fatal(err)
	}
	if raw.Devices[0]["name"] != "mlx5_0" || raw.Devices[0]["lid"] != float64(3) || raw.Devices[1]["gid"] != d.Devices[1].GID {
		t.Fatalf("devices in JSON: %v", raw.Devices)
	}
	if !reflect.DeepEqual(raw.Buffers[0]["rkey"], []any{float64(0x1234), float64(0x5678)}) ||
		!reflect.DeepEqual(raw.Buffers[0]["lkey"], []any{float64(0x4321), float64(0x8765)}) {
		t.Fatalf("keys in JSON: %v", raw.Buffers[0])
	}
	back, err := segment.Decode(b)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back.Buffers[0].Rkey, d.Buffers[0].Rkey) || !reflect.DeepEqual(back.Devices, d.Devices) {
		t.Fatalf("round trip: %+v", back)
	}
	got, err := peerNICs(back)
	if err != nil || !reflect.DeepEqual(got, nics) {
		t.Fatalf("peerNICs = %v, %v", got, err)
	}
}

// A descriptor written by Mooncake (no te_endpoints) still pairs: the link
// layer is read from the GID.
func TestMooncakeDescriptor(t *testing.T) {
	js := `{"name":"node1:17777","protocol":"rdma","devices":[
		{"name":"mlx5_0","lid":0,"gid":"00:00:00:00:00:00:00:00:00:00:ff:ff:0a:00:00:01"},
		{"name":"mlx5_1","lid":9,"gid":"fe80:0000:0000:0000:0202:c9ff:fe00:0002"}],
		"buffers":[{"name":"cpu:0","addr":140000000000,"length":4096,"rkey":[1,2],"lkey":[3,4]}],
		"priority_matrix":{}}`
	d, err := segment.Decode([]byte(js))
	if err != nil {
		t.Fatal(err)
	}
	got, err := peerNICs(d)
	if err != nil || !reflect.DeepEqual(got, []nicInfo{{"mlx5_0", "eth"}, {"mlx5_1", "ib"}}) {
		t.Fatalf("peerNICs = %v, %v", got, err)
	}
}

func TestPeerNICsInvalid(t *testing.T) {
	good := segment.Device{Name: "mlx5_0", GID: "fe80:0000:0000:0000:0202:c9ff:fe00:0001"}
	for name, d := range map[string]*segment.Desc{
		"no devices":   {Name: "p"},
		"no name":      {Name: "p", Devices: []segment.Device{{GID: good.GID}}},
		"bad gid":      {Name: "p", Devices: []segment.Device{{Name: "x", GID: "1"}}},
		"bad endpoint": {Name: "p", Devices: []segment.Device{good}, Endpoints: map[string]string{Name: "mlx5_0=roce"}},
	} {
		if _, err := peerNICs(d); err == nil {
			t.Errorf("%s: accepted", name)
		} else if name != "no devices" && !errors.Is(err, errs.ErrMetadata) {
			t.Errorf("%s: %v, want a metadata error", name, err)
		}
	}
}
