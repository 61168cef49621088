package rdma

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tecache/te/engine/segment"
	"github.com/tecache/te/engine/transport"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/sys/ibv"
)

// testHost is a transport.Host without an engine, for Start's error paths.
type testHost struct {
	params map[string]string
	reg    *segment.Registry
}

func (h *testHost) SegmentName() string             { return "127.0.0.1:1" }
func (h *testHost) Instance() string                { return "test-instance" }
func (h *testHost) Registry() *segment.Registry     { return h.reg }
func (h *testHost) Control() transport.Control      { return nopControl{} }
func (h *testHost) Logf(format string, args ...any) {}
func (h *testHost) Param(k string) (string, bool)   { v, ok := h.params[k]; return v, ok }

type nopControl struct{}

func (nopControl) Handle(uint8, func(context.Context, []byte) ([]byte, error)) {}
func (nopControl) Call(context.Context, string, uint8, []byte) ([]byte, error) {
	return nil, errs.New(errs.PeerUnreachable, "test", "no control plane")
}

func host(params map[string]string) *testHost {
	return &testHost{params: params, reg: segment.NewRegistry()}
}

// Without libibverbs, Start says which file it could not load and what to
// install; Close after a failed Start is harmless.
func TestStartWithoutLibrary(t *testing.T) {
	path := filepath.Join(t.TempDir(), "libibverbs.so.1")
	tr := New()
	err := tr.Start(host(map[string]string{"rdma.library": path}))
	if !errors.Is(err, errs.ErrNotSupported) || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "libibverbs1") {
		t.Fatalf("Start = %v, want NotSupported naming %s and the package", err, path)
	}
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
}

// With the library but no device (this machine, CI), Start says so and how
// to get one.
func TestStartWithoutDevice(t *testing.T) {
	lib, err := ibv.Load()
	if err != nil {
		if _, statErr := os.Stat("/usr/lib/x86_64-linux-gnu/libibverbs.so.1"); statErr == nil {
			t.Fatalf("libibverbs is installed but does not load: %v", err)
		}
		t.Skipf("libibverbs is not installed: %v", err)
	}
	list, err := lib.Devices()
	if err != nil {
		t.Fatal(err)
	}
	n := list.Len()
	list.Free()
	if n > 0 {
		t.Skipf("this machine has %d RDMA device(s); the hardware tests cover it", n)
	}
	tr := New()
	err = tr.Start(host(nil))
	if !errors.Is(err, errs.ErrNotSupported) || !strings.Contains(err.Error(), "no RDMA device") ||
		!strings.Contains(err.Error(), "rdma link add") {
		t.Fatalf("Start = %v, want NotSupported: no RDMA device, with the Soft-RoCE hint", err)
	}
	tr.Close()
	if _, err := Probe(); !errors.Is(err, errs.ErrNotSupported) {
		t.Fatalf("Probe = %v, want NotSupported", err)
	}
	if err := Available(); err == nil {
		t.Fatal("Available = nil without a device")
	}
}

func TestStartBadParameter(t *testing.T) {
	err := New().Start(host(map[string]string{"rdma.slice": "1"}))
	if !errors.Is(err, errs.ErrInvalidArgument) {
		t.Fatalf("Start = %v, want InvalidArgument", err)
	}
}

// An allow-list naming a device that is not there is refused with the
// names that are (checked through FilterDevices), never silently empty.
func TestUsableNamesAllowList(t *testing.T) {
	lib, err := ibv.Load()
	if err != nil {
		t.Skipf("libibverbs is not installed: %v", err)
	}
	list, err := lib.Devices()
	if err != nil {
		t.Fatal(err)
	}
	defer list.Free()
	_, err = usableNames(lib, list, Options{Devices: []string{"nosuchdev0"}})
	if !errors.Is(err, errs.ErrNotSupported) {
		t.Fatalf("usableNames = %v, want NotSupported", err)
	}
}
