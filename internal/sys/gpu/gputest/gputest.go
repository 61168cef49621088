// Package gputest runs one GPU test body over every runtime te has: it sets
// up each vendor's runtime for tests (the fakes of cudatest and hiptest, or
// the real ones they are told to keep) and gives tests device buffers and
// the fakes' counters without naming a vendor, so a test is parametrized
// by location kind rather than duplicated.
package gputest

import (
	"errors"
	"os"
	"strconv"
	"testing"

	"github.com/tecache/te/internal/sys/cuda/cudatest"
	"github.com/tecache/te/internal/sys/gpu"
	"github.com/tecache/te/internal/sys/hip/hiptest"
)

// EnvKind names the vendor a re-executed child process allocates its device
// memory with ("cuda" when unset).
const EnvKind = "TE_TEST_GPU_KIND"

// Vendor is one GPU runtime as tests see it.
type Vendor struct {
	// Kind is the location kind ("cuda", "hip").
	Kind   string
	setup  func() (string, error)
	alloc  func(n uint64) (*Buffer, error)
	fake   func() bool
	count  func(t testing.TB, name string) int64
	prefix string // of the fake's probes
}

// Buffer is device memory on device 0 and a host buffer of the same size,
// outside the Go heap, that fills and reads go through.
type Buffer struct {
	Addr, N uint64
	Host    []byte
	up      func(off, n uint64) error
	down    func(off, n uint64) ([]byte, error)
	free    func()
}

// Upload copies Host[off:off+n] to the same range of device memory.
func (b *Buffer) Upload(off, n uint64) error { return b.up(off, n) }

// Download copies device [off, off+n) into Host[off:off+n] and returns it.
func (b *Buffer) Download(off, n uint64) ([]byte, error) { return b.down(off, n) }

// Fill sets the whole device buffer to f(i) for each offset i.
func (b *Buffer) Fill(f func(i uint64) byte) error {
	for i := range b.Host {
		b.Host[i] = f(uint64(i))
	}
	return b.Upload(0, b.N)
}

// Free releases both buffers.
func (b *Buffer) Free() { b.free() }

var vendors = []Vendor{
	{
		Kind:  "cuda",
		setup: cudatest.Setup,
		alloc: func(n uint64) (*Buffer, error) {
			g, err := cudatest.NewBuffer(n)
			if err != nil {
				return nil, err
			}
			return &Buffer{Addr: g.Addr, N: g.N, Host: g.Host, up: g.Upload, down: g.Download, free: g.Free}, nil
		},
		fake: cudatest.Fake, count: cudatest.Counter, prefix: "fakecuda_",
	},
	{
		Kind:  "hip",
		setup: hiptest.Setup,
		alloc: func(n uint64) (*Buffer, error) {
			g, err := hiptest.NewBuffer(0, n)
			if err != nil {
				return nil, err
			}
			return &Buffer{Addr: g.Addr, N: g.N, Host: g.Host, up: g.Upload, down: g.Download, free: g.Free}, nil
		},
		fake: hiptest.Fake, count: hiptest.Counter, prefix: "fakehip_",
	},
}

// Vendors lists every runtime, "cuda" first.
func Vendors() []Vendor { return vendors }

// Of returns the vendor of kind; ok is false for an unknown kind.
func Of(kind string) (Vendor, bool) {
	for _, v := range vendors {
		if v.Kind == kind {
			return v, true
		}
	}
	return Vendor{}, false
}

// FromEnv is the vendor a child process was started for (EnvKind).
func FromEnv() Vendor {
	if v, ok := Of(os.Getenv(EnvKind)); ok {
		return v
	}
	return vendors[0]
}

// setupErrs holds each vendor's Setup error, by kind (written by Setup
// before any test runs, read by tests).
var setupErrs = map[string]error{}

// Setup chooses every runtime for this test process (see cudatest.Setup and
// hiptest.Setup) before anything loads one; the error says which fakes
// could not be built. Child processes inherit the choice. One vendor's
// failure does not keep the others from their tests (Ready): on a GPU
// machine without a C compiler the other vendor's fake cannot be built.
func Setup() error {
	var all []error
	for _, v := range vendors {
		if _, err := v.setup(); err != nil {
			setupErrs[v.Kind] = err
			all = append(all, err)
		}
	}
	return errors.Join(all...)
}

// Ready says why Setup could not set up the vendor's runtime (real or
// fake) for tests; nil if it did.
func (v Vendor) Ready() error { return setupErrs[v.Kind] }

// Driver loads the vendor's runtime, or skips the test saying why.
func (v Vendor) Driver(t testing.TB) gpu.Driver {
	t.Helper()
	d, known, err := gpu.Load(v.Kind)
	if !known {
		t.Fatalf("no %s runtime is linked in", v.Kind)
	}
	if err != nil {
		t.Skipf("%s runtime not available (no fake either): %v", v.Kind, err)
	}
	return d
}

// Available says whether the vendor's runtime loads.
func (v Vendor) Available() error {
	_, _, err := gpu.Load(v.Kind)
	return err
}

// Location is device dev's location string ("hip:0").
func (v Vendor) Location(dev int) string {
	return v.Kind + ":" + strconv.Itoa(dev)
}

// NewBuffer allocates n bytes of device memory on device 0.
func (v Vendor) NewBuffer(n uint64) (*Buffer, error) { return v.alloc(n) }

// Fake reports whether the process runs the vendor's fake runtime.
func (v Vendor) Fake() bool { return v.fake() }

// Counter reads one of the fake's counters by its short name ("streams",
// "open_handles", "events" on CUDA only).
func (v Vendor) Counter(t testing.TB, name string) int64 {
	return v.count(t, v.prefix+name)
}
