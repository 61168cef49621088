package tebench

import (
	"os"
	"sync"

	"github.com/ebitengine/purego"
)

// The fake libibverbs (internal/sys/ibv/ibvtest, `make fakes`) executes work
// requests on threads of this process: CPU time a real NIC would spend, not
// the host. It counts that time; te-bench reads it to report te's own CPU
// cost with the fake NIC charged what a memcpy of the same bytes costs.

const fakeStatNICNanos = 14 // ibvtest.StatNICNanos

var fakeNIC struct {
	once sync.Once
	stat func(what int32) int64
}

// fakeNICNanos returns the fake NIC's CPU time so far, or -1 when the
// libibverbs in use (TE_IBV_LIBRARY) is not the fake.
func fakeNICNanos() int64 {
	fakeNIC.once.Do(func() {
		p := os.Getenv("TE_IBV_LIBRARY")
		if p == "" {
			return
		}
		h, err := purego.Dlopen(p, purego.RTLD_NOW|purego.RTLD_GLOBAL)
		if err != nil {
			return
		}
		if sym, err := purego.Dlsym(h, "fake_verbs_stat"); err == nil && sym != 0 {
			purego.RegisterFunc(&fakeNIC.stat, sym)
		}
	})
	if fakeNIC.stat == nil {
		return -1
	}
	return fakeNIC.stat(fakeStatNICNanos)
}
