package fabric

import (
	"runtime/debug"
	"testing"
	"unsafe"
)

var sink byte

// TestLoadKeepsFaultHandlers: loading libfabric and asking it for providers
// leaves the Go runtime's fault handling in place. Debian's libfabric links
// the PSM providers, whose libinfinipath installs a SIGSEGV handler that
// prints a backtrace and exits; without sigkeep this test's process dies at
// the read below instead of recovering, as libte's refusal of a wild
// request pointer did.
func TestLoadKeepsFaultHandlers(t *testing.T) {
	l := testLib(t)
	if os, err := l.GetInfo(Query{Node: "127.0.0.1", Caps: rmaCaps, MRMode: MRHandled}); err == nil {
		os.Free()
	}
	old := debug.SetPanicOnFault(true)
	defer debug.SetPanicOnFault(old)
	defer func() {
		if recover() == nil {
			t.Fatal("a fault after loading libfabric did not panic")
		}
	}()
	sink = *(*byte)(unsafe.Add(unsafe.Pointer(nil), 0xdead0000))
}
