package sigkeep_test

import (
	"os"
	"os/exec"
	"runtime/debug"
	"syscall"
	"testing"
	"unsafe"

	"github.com/ebitengine/purego"

	"github.com/tecache/te/internal/sys/sigkeep"
)

// fault reads a wild address with faults turned into panics, and reports
// whether the Go runtime recovered it (false: the process would be dead).
func fault() (recovered bool) {
	old := debug.SetPanicOnFault(true)
	defer debug.SetPanicOnFault(old)
	defer func() { recovered = recover() != nil }()
	p := (*byte)(unsafe.Add(unsafe.Pointer(nil), 0xdead0000))
	sink = *p
	return false
}

var sink byte

// TestAroundRestoresFaultHandler: a foreign call that replaces the SIGSEGV
// disposition through libc (as libinfinipath's constructor does when
// libfabric loads; here libc's signal() sets SIG_DFL) leaves the Go
// runtime's handler in place under Around, and a fault is still a panic Go
// recovers. Each case runs in a child process, since the control case dies.
func TestAroundRestoresFaultHandler(t *testing.T) {
	if os.Getenv("SIGKEEP_CHILD") != "" {
		child()
		return
	}
	for _, mode := range []string{"kept", "bare"} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestAroundRestoresFaultHandler$", "-test.v")
		cmd.Env = append(os.Environ(), "SIGKEEP_CHILD="+mode)
		out, err := cmd.CombinedOutput()
		switch mode {
		case "kept":
			if err != nil {
				t.Fatalf("with Around, a fault after the handler swap killed the process: %v\n%s", err, out)
			}
		case "bare":
			// The control: without Around the swap is fatal, so the
			// test above can fail.
			ee, ok := err.(*exec.ExitError)
			if !ok || !ee.Sys().(syscall.WaitStatus).Signaled() || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGSEGV {
				t.Fatalf("without Around the swapped handler did not take effect (%v):\n%s", err, out)
			}
		}
	}
}

func child() {
	libc, err := purego.Dlopen("libc.so.6", purego.RTLD_NOW)
	if err != nil {
		panic(err)
	}
	var signal func(sig int32, handler uintptr) uintptr
	purego.RegisterLibFunc(&signal, libc, "signal")
	swap := func() { signal(int32(syscall.SIGSEGV), 0 /* SIG_DFL */) }
	if os.Getenv("SIGKEEP_CHILD") == "kept" {
		got := sigkeep.Around(swap)
		if len(got) != 1 || got[0] != syscall.SIGSEGV {
			panic("Around restored " + fmtSignals(got) + ", want SIGSEGV")
		}
	} else {
		swap()
	}
	if !fault() {
		panic("fault not recovered")
	}
	if got := sigkeep.Around(func() {}); len(got) != 0 {
		panic("a call that changes nothing restored " + fmtSignals(got))
	}
	os.Exit(0)
}

func fmtSignals(s []syscall.Signal) string {
	out := "["
	for i, sig := range s {
		if i > 0 {
			out += " "
		}
		out += sig.String()
	}
	return out + "]"
}
