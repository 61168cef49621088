package cuda

import (
	"path/filepath"
	"testing"
	"unsafe"
)

// fabricGolden lists vmm.go's constants under their cuda.h names (CUDA
// 12.3 and later).
var fabricGolden = map[string]uint64{
	"CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED": AttrHandleTypeFabricSupported,
	"CU_MEM_HANDLE_TYPE_FABRIC":                        MemHandleTypeFabric,
	"CU_MEM_ALLOCATION_TYPE_PINNED":                    memAllocationTypePinned,
	"CU_MEM_LOCATION_TYPE_DEVICE":                      memLocationTypeDevice,
	"CU_MEM_ACCESS_FLAGS_PROT_READWRITE":               memAccessProtReadWrite,
}

// TestFabricConstants checks vmm.go against the recorded facts (which must
// have them all) and a machine's cuda.h (where it has them: a toolkit
// older than 12.3 has no fabric handles), and the struct layouts.
func TestFabricConstants(t *testing.T) {
	for i, h := range headers() {
		vals, _ := headerFacts(t, h)
		for name, want := range fabricGolden {
			got, ok := vals[name]
			switch {
			case !ok && i == 0:
				t.Errorf("%s: %s not found", filepath.Base(h), name)
			case ok && got != want:
				t.Errorf("%s: %s = %d, vmm.go has %d", h, name, got, want)
			}
		}
	}
	if s := unsafe.Sizeof(MemAllocationProp{}); s != 32 {
		t.Errorf("MemAllocationProp is %d bytes, want 32 (CUmemAllocationProp)", s)
	}
	if o := unsafe.Offsetof(MemAllocationProp{}.Win32HandleMetaData); o != 16 {
		t.Errorf("win32HandleMetaData at %d, want 16", o)
	}
	if s := unsafe.Sizeof(memAccessDesc{}); s != 12 {
		t.Errorf("memAccessDesc is %d bytes, want 12 (CUmemAccessDesc)", s)
	}
	if s := unsafe.Sizeof(FabricHandle{}); s != 64 {
		t.Errorf("FabricHandle is %d bytes, want 64 (CUmemFabricHandle)", s)
	}
}
