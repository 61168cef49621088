package cuda_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/ebitengine/purego"
	"golang.org/x/sys/unix"

	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/sys/cuda"
	"github.com/tecache/te/internal/sys/cuda/cudatest"
	"github.com/tecache/te/internal/sys/mem"
	"github.com/tecache/te/internal/sys/topo/topotest"
	"github.com/tecache/te/internal/testexec"
)

var setupErr error

func TestMain(m *testing.M) {
	_, setupErr = cudatest.Setup()
	os.Exit(m.Run())
}

// lib returns the driver for this process, or skips the test with the reason
// CUDA is not available.
func lib(t *testing.T) *cuda.Lib {
	t.Helper()
	if setupErr != nil {
		t.Skipf("no CUDA driver and no fake: %v", setupErr)
	}
	l, err := cuda.Load()
	if err != nil {
		if errors.Is(err, errs.ErrNotSupported) {
			t.Skipf("CUDA not available: %v", err)
		}
		t.Fatal(err)
	}
	return l
}

func TestOpenMissingLibrary(t *testing.T) {
	path := filepath.Join(t.TempDir(), "libcuda.so.1")
	_, err := cuda.Open(path)
	if !errors.Is(err, errs.ErrNotSupported) {
		t.Fatalf("Open(%s) = %v, want NotSupported", path, err)
	}
	if !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), cuda.EnvLibrary) {
		t.Fatalf("error %q names neither the file nor %s", err, cuda.EnvLibrary)
	}
}

func TestOpenNotCUDA(t *testing.T) {
	_, err := cuda.Open("libc.so.6")
	if !errors.Is(err, errs.ErrNotSupported) {
		t.Fatalf("Open(libc.so.6) = %v, want NotSupported", err)
	}
	// The versioned names are the ones asked for.
	for _, s := range []string{"cuInit", "cuMemcpyHtoD_v2", "cuIpcOpenMemHandle_v2", "cuMemGetAddressRange_v2"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not name %s", err, s)
		}
	}
}

func TestBindsVersionedNames(t *testing.T) {
	l := lib(t)
	for api, want := range map[string]string{
		"cuMemcpyHtoD": "cuMemcpyHtoD_v2", "cuMemcpyDtoDAsync": "cuMemcpyDtoDAsync_v2",
		"cuIpcOpenMemHandle": "cuIpcOpenMemHandle_v2", "cuMemGetAddressRange": "cuMemGetAddressRange_v2",
		"cuDevicePrimaryCtxRelease": "cuDevicePrimaryCtxRelease_v2", "cuStreamDestroy": "cuStreamDestroy_v2",
	} {
		if got := l.Bound[api]; got != want {
			t.Errorf("%s bound to %q, want %q", api, got, want)
		}
	}
}

// TestIPCHandleByValue checks that the 64-byte CUipcMemHandle reaches C by
// value as the ABI lays it out, through a fake entry point that echoes it.
func TestIPCHandleByValue(t *testing.T) {
	if !cudatest.Fake() {
		t.Skip("needs the fake driver's echo entry point")
	}
	lib(t)
	h, err := purego.Dlopen(os.Getenv(cuda.EnvLibrary), purego.RTLD_NOW)
	if err != nil {
		t.Fatal(err)
	}
	sym, err := purego.Dlsym(h, "fakecuda_ipc_arg")
	if err != nil {
		t.Fatal(err)
	}
	var echo func(out uintptr, h cuda.IPCMemHandle, flags uint32) uint32
	purego.RegisterFunc(&echo, sym)
	out := mem.MustAlloc(4096)
	defer mem.Free(out)
	var in cuda.IPCMemHandle
	for i := range in.Reserved {
		in.Reserved[i] = byte(i*7 + 3)
	}
	if r := echo(uintptr(mem.Addr(out)), in, 0x1); r != 0 {
		t.Fatalf("echo returned %d", r)
	}
	if !bytes.Equal(out[:64], in.Reserved[:]) || out[64] != 1 {
		t.Fatalf("C received % x flags %d", out[:64], out[64])
	}
}

func TestDevicesAndContexts(t *testing.T) {
	l := lib(t)
	v, err := l.DriverVersion()
	if err != nil || v < 11000 {
		t.Fatalf("DriverVersion = %d, %v", v, err)
	}
	n, err := l.DeviceCount()
	if err != nil || n < 1 {
		t.Fatalf("DeviceCount = %d, %v", n, err)
	}
	if _, err := l.DeviceGet(n); !errors.Is(err, errs.ErrInvalidArgument) {
		t.Errorf("DeviceGet(%d) = %v, want InvalidArgument (CUDA_ERROR_INVALID_DEVICE)", n, err)
	}
	d, err := l.DeviceGet(0)
	if err != nil {
		t.Fatal(err)
	}
	if u, err := l.DeviceUUID(d); err != nil || u == (cuda.UUID{}) {
		t.Errorf("DeviceUUID = %x, %v", u, err)
	}
	ctx, err := l.PrimaryCtxRetain(d)
	if err != nil {
		t.Fatal(err)
	}
	defer l.PrimaryCtxRelease(d)
	// With makes ctx current inside and restores the thread's context after.
	err = l.With(ctx, func() error {
		c, err := l.CtxGetCurrent()
		if err != nil || c != ctx {
			return fmt.Errorf("inside With: current %#x, %v; want %#x", c, err, ctx)
		}
		return l.With(0, func() error {
			c, _ := l.CtxGetCurrent()
			if c != 0 {
				return fmt.Errorf("nested With(0): current %#x", c)
			}
			return nil
		})
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestMemoryAndCopies allocates device and pinned memory, recognises each by
// its pointer attributes and moves bytes host -> device -> device -> host,
// synchronously and on a stream.
func TestMemoryAndCopies(t *testing.T) {
	l := lib(t)
	d, _ := l.DeviceGet(0)
	ctx, err := l.PrimaryCtxRetain(d)
	if err != nil {
		t.Fatal(err)
	}
	defer l.PrimaryCtxRelease(d)
	const n = 1 << 20
	host := mem.MustAlloc(n)
	defer mem.Free(host)
	back := mem.MustAlloc(n)
	defer mem.Free(back)
	for i := range host {
		host[i] = byte(i * 13)
	}
	err = l.With(ctx, func() error {
		a, err := l.MemAlloc(n)
		if err != nil {
			return err
		}
		defer l.MemFree(a)
		b, err := l.MemAlloc(n)
		if err != nil {
			return err
		}
		defer l.MemFree(b)
		pinned, err := l.MemHostAlloc(n, cuda.HostAllocPortable)
		if err != nil {
			return err
		}
		defer l.MemFreeHost(pinned)

		for _, c := range []struct {
			p    uint64
			want cuda.MemoryType
		}{{a + 100, cuda.MemoryDevice}, {pinned, cuda.MemoryHost}, {mem.Addr(host), cuda.MemoryUnknown}} {
			pi, err := l.PointerInfo(c.p)
			if err != nil {
				return err
			}
			if pi.Type != c.want || (c.want == cuda.MemoryDevice && (pi.Device != 0 || pi.Context != ctx)) {
				return fmt.Errorf("PointerInfo(%#x) = %+v, want type %v", c.p, pi, c.want)
			}
		}
		if v, err := l.PointerAttribute(cuda.AttrDeviceOrdinal, b); err != nil || v != 0 {
			return fmt.Errorf("DEVICE_ORDINAL of b = %d, %v", v, err)
		}
		if base, size, err := l.MemGetAddressRange(a + 4096); err != nil || base != a || size < n {
			return fmt.Errorf("MemGetAddressRange = %#x+%d, %v; want %#x+%d", base, size, err, a, n)
		}
		if err := l.CopyHtoD(a, mem.Addr(host), n); err != nil {
			return err
		}
		if err := l.CopyDtoD(b, a, n); err != nil {
			return err
		}
		if err := l.CopyDtoH(mem.Addr(back), b, n); err != nil {
			return err
		}
		if !bytes.Equal(back, host) {
			return errors.New("synchronous round trip changed the bytes")
		}
		clear(back)
		s, err := l.StreamCreate(cuda.StreamNonBlocking)
		if err != nil {
			return err
		}
		defer l.StreamDestroy(s)
		ev, err := l.EventCreate(cuda.EventDisableTiming)
		if err != nil {
			return err
		}
		defer l.EventDestroy(ev)
		steps := []error{
			l.CopyHtoDAsync(b, mem.Addr(host), n, s),
			l.CopyDtoDAsync(a, b, n, s),
			l.CopyDtoHAsync(pinned, a, n, s),
			l.CopyAsync(mem.Addr(back), pinned, n, s),
			l.EventRecord(ev, s),
			l.EventSynchronize(ev),
			l.StreamSynchronize(s),
		}
		if err := errors.Join(steps...); err != nil {
			return err
		}
		if !bytes.Equal(back, host) {
			return errors.New("asynchronous round trip changed the bytes")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestCopyOutsideContext(t *testing.T) {
	l := lib(t)
	if !cudatest.Fake() {
		t.Skip("the real driver may have a context current on this thread")
	}
	d, _ := l.DeviceGet(0)
	ctx, _ := l.PrimaryCtxRetain(d)
	defer l.PrimaryCtxRelease(d)
	var a uint64
	if err := l.With(ctx, func() (err error) { a, err = l.MemAlloc(4096); return }); err != nil {
		t.Fatal(err)
	}
	defer l.With(ctx, func() error { return l.MemFree(a) })
	err := l.With(0, func() error { return l.CopyDtoD(a, a, 16) })
	r, ok := cuda.ResultOf(err)
	if !ok || r != cuda.ErrInvalidContext {
		t.Fatalf("copy without a context = %v, want CUDA_ERROR_INVALID_CONTEXT", err)
	}
	if !strings.Contains(err.Error(), "cuMemcpyDtoD") {
		t.Fatalf("error %q does not name the call", err)
	}
}

func TestIPCSameProcessRefused(t *testing.T) {
	l := lib(t)
	d, _ := l.DeviceGet(0)
	ctx, _ := l.PrimaryCtxRetain(d)
	defer l.PrimaryCtxRelease(d)
	err := l.With(ctx, func() error {
		a, err := l.MemAlloc(1 << 16)
		if err != nil {
			return err
		}
		defer l.MemFree(a)
		h, err := l.IPCGetMemHandle(a)
		if err != nil {
			return err
		}
		if h == (cuda.IPCMemHandle{}) {
			return errors.New("empty handle")
		}
		if p, err := l.IPCOpenMemHandle(h, cuda.IPCLazyEnablePeerAccess); err == nil {
			l.IPCCloseMemHandle(p)
			return errors.New("a process opened its own IPC handle")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestFakeSkipsStaleNames: a process killed before cuMemFree leaves its
// shared-memory names in /dev/shm; a later process with the same pid must
// still allocate (the fake once failed with OUT_OF_MEMORY on the name).
func TestFakeSkipsStaleNames(t *testing.T) {
	if !cudatest.Fake() {
		t.Skip("the fake driver's names")
	}
	l := lib(t)
	d, _ := l.DeviceGet(0)
	ctx, _ := l.PrimaryCtxRetain(d)
	defer l.PrimaryCtxRelease(d)
	err := l.With(ctx, func() error {
		a, err := l.MemAlloc(1 << 12)
		if err != nil {
			return err
		}
		h, err := l.IPCGetMemHandle(a)
		l.MemFree(a)
		if err != nil {
			return err
		}
		// The handle carries the name, /fakecuda-PID-SEQ, after 24 bytes.
		raw := h.Reserved[24:]
		name := string(raw[:max(bytes.IndexByte(raw, 0), 0)])
		i := strings.LastIndexByte(name, '-')
		seq, err := strconv.Atoi(name[i+1:])
		if err != nil {
			return fmt.Errorf("handle name %q: %v", name, err)
		}
		for k := seq + 1; k <= seq+8; k++ {
			p := "/dev/shm" + name[:i+1] + strconv.Itoa(k)
			if err := os.WriteFile(p, nil, 0o600); err != nil {
				return err
			}
			defer os.Remove(p)
		}
		b, err := l.MemAlloc(1 << 12)
		if err != nil {
			return fmt.Errorf("allocation beside stale names: %v", err)
		}
		return l.MemFree(b)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestNoDevice runs a child process whose driver finds no device: Load must
// say so with NotSupported and a hint, not fail later.
func TestNoDevice(t *testing.T) {
	if os.Getenv("TE_CUDA_NODEV_CHILD") == "1" {
		_, err := cuda.Load()
		if !errors.Is(err, errs.ErrNotSupported) || !strings.Contains(err.Error(), "CUDA_ERROR_NO_DEVICE") ||
			!strings.Contains(err.Error(), "CUDA_VISIBLE_DEVICES") {
			fmt.Printf("BAD %v\n", err)
			os.Exit(1)
		}
		if cuda.Available() == nil {
			fmt.Println("BAD Available() is nil")
			os.Exit(1)
		}
		fmt.Println("OK")
		os.Exit(0)
	}
	if !cudatest.Fake() {
		t.Skip("needs the fake driver to hide the devices")
	}
	lib(t)
	cmd := testexec.Command(os.Args[0], "-test.run=^TestNoDevice$", "-test.count=1")
	cmd.Env = append(os.Environ(), "TE_CUDA_NODEV_CHILD=1", "FAKECUDA_DEVICES=0")
	out, err := cmd.CombinedOutput()
	if err != nil || !bytes.Contains(out, []byte("OK")) {
		t.Fatalf("child: %v\n%s", err, out)
	}
}

// TestPointerInfoWithoutContext: should the driver want a context for a
// pointer query, PointerInfo asks again under the primary context.
func TestPointerInfoWithoutContext(t *testing.T) {
	l := lib(t)
	if !cudatest.Fake() {
		t.Skip("needs the fake driver")
	}
	d, _ := l.DeviceGet(0)
	ctx, _ := l.PrimaryCtxRetain(d)
	defer l.PrimaryCtxRelease(d)
	var a uint64
	if err := l.With(ctx, func() (err error) { a, err = l.MemAlloc(4096); return }); err != nil {
		t.Fatal(err)
	}
	defer l.With(ctx, func() error { return l.MemFree(a) })
	t.Setenv("FAKECUDA_POINTER_NEEDS_CTX", "1")
	var pi cuda.PointerInfo
	err := l.With(0, func() (err error) { pi, err = l.PointerInfo(a); return })
	if err != nil || pi.Type != cuda.MemoryDevice {
		t.Fatalf("PointerInfo without a context = %+v, %v", pi, err)
	}
}

func TestNormalizeBusID(t *testing.T) {
	for in, want := range map[string]string{
		"0000:3B:00.0": "0000:3b:00.0", "00000000:1A:00.0": "0000:1a:00.0", "1:02:00.1": "0001:02:00.1", " 0000:af:00.0\n": "0000:af:00.0",
	} {
		if got := cuda.NormalizeBusID(in); got != want {
			t.Errorf("NormalizeBusID(%q) = %q, want %q", in, got, want)
		}
	}
}

// The PCI address places a GPU in the sysfs tree; a dma-buf of device
// memory shows its bytes to whoever maps it (as a NIC does).
func TestPCIBusIDAndDmabuf(t *testing.T) {
	if os.Getenv("TE_CUDA_TREE_CHILD") == "1" {
		l, err := cuda.Load()
		if err != nil {
			fmt.Println("BAD", err)
			os.Exit(1)
		}
		n, _ := l.DeviceCount()
		var ids []string
		for i := 0; i < n; i++ {
			d, _ := l.DeviceGet(i)
			id, err := l.DevicePCIBusID(d)
			if err != nil {
				fmt.Println("BAD", err)
				os.Exit(1)
			}
			ids = append(ids, id)
		}
		fmt.Println("IDS", strings.Join(ids, ","))
		os.Exit(0)
	}
	l := lib(t)
	d, err := l.DeviceGet(0)
	if err != nil {
		t.Fatal(err)
	}
	id, err := l.DevicePCIBusID(d)
	if err != nil || len(id) != 12 || id != strings.ToLower(id) {
		t.Fatalf("bus id %q, %v", id, err)
	}
	ctx, err := l.PrimaryCtxRetain(d)
	if err != nil {
		t.Fatal(err)
	}
	defer l.PrimaryCtxRelease(d)
	const n = 1 << 20
	host := mem.MustAlloc(n)
	defer mem.Free(host)
	for i := range host {
		host[i] = byte(i * 7)
	}
	err = l.With(ctx, func() error {
		p, err := l.MemAlloc(n)
		if err != nil {
			return err
		}
		defer l.MemFree(p)
		if err := l.CopyHtoD(p, mem.Addr(host), n); err != nil {
			return err
		}
		fd, err := l.DmabufFD(p, n)
		if errors.Is(err, errs.ErrNotSupported) && !cudatest.Fake() {
			t.Skipf("this driver exports no dma-buf: %v", err)
		}
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		if !cudatest.Fake() {
			return nil // a GPU's dma-buf is for devices: the CPU may not map it
		}
		b, err := unix.Mmap(fd, 0, n, unix.PROT_READ, unix.MAP_SHARED)
		if err != nil {
			return err
		}
		defer unix.Munmap(b)
		if !bytes.Equal(b, host) {
			t.Error("the dma-buf does not hold the device memory's bytes")
		}
		if _, err := l.DmabufFD(p+1, n-4096); !errors.Is(err, errs.ErrInvalidArgument) {
			t.Errorf("unaligned dma-buf: %v, want InvalidArgument", err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if !cudatest.Fake() {
		return
	}
	// The fake driver's devices are a recorded tree's GPUs, by address.
	root := topotest.Tree(t, "hgx8")
	cmd := testexec.Command(os.Args[0], "-test.run=^TestPCIBusIDAndDmabuf$", "-test.count=1")
	cmd.Env = append(os.Environ(), "TE_CUDA_TREE_CHILD=1", "TE_SYSFS_ROOT="+root)
	out, err := cmd.CombinedOutput()
	if err != nil || !bytes.Contains(out, []byte("IDS "+strings.Join(topotest.BusIDs, ","))) {
		t.Fatalf("child: %v\n%s", err, out)
	}
}
