package cudaipc

import (
	"testing"

	"github.com/tecache/te/engine/segment"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/sys/gpu"
)

// TestFabricDescriptor: a fabric export survives the descriptor, and a
// malformed one (bad handle, offset or size, a buffer past the allocation)
// is a Metadata error, never a mapping of the wrong range; a HIP buffer's
// fabric keys are ignored (fabric handles are CUDA's).
func TestFabricDescriptor(t *testing.T) {
	var h gpu.IPCHandle
	h[0], h[63] = 7, 9
	b := segment.BufferDesc{Name: "cuda:0", Addr: 0x10000, Length: 4096}
	setFabric(&b, export{Handle: h, Offset: 8192, Size: 1 << 20, Fabric: true, UUID: "00112233445566778899aabbccddeeff"})
	e, ok, err := fabricOf(&b)
	if err != nil || !ok || !e.Fabric || e.Handle != h || e.Offset != 8192 || e.Size != 1<<20 || e.UUID == "" {
		t.Fatalf("round trip: %+v %v %v", e, ok, err)
	}
	for name, set := range map[string][2]string{
		"bad handle":     {ExtraFabric, "not base64!"},
		"short handle":   {ExtraFabric, "AAAA"},
		"bad offset":     {ExtraFabricOffset, "-1"},
		"no size":        {ExtraFabricSize, "0"},
		"past the end":   {ExtraFabricOffset, "1048000"},
		"offset > size":  {ExtraFabricOffset, "2000000"},
		"size not a num": {ExtraFabricSize, "1MiB"},
	} {
		c := b
		c.Extra = map[string]string{}
		for k, v := range b.Extra {
			c.Extra[k] = v
		}
		c.Extra[set[0]] = set[1]
		if _, ok, err := fabricOf(&c); !ok || errs.CodeOf(err) != errs.Metadata {
			t.Errorf("%s: ok %v, err %v; want a Metadata error", name, ok, err)
		}
	}
	hip := b
	hip.Name = "hip:0"
	if _, ok, _ := fabricOf(&hip); ok {
		t.Error("a hip:0 buffer's fabric keys were read")
	}
}
