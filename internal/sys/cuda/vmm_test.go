package cuda_test

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/sys/cuda"
	"github.com/tecache/te/internal/sys/cuda/cudatest"
	"github.com/tecache/te/internal/sys/mem"
)

// TestFabricHandles drives the virtual memory management bindings: fabric
// memory made with MemCreate exports a handle whose import (here, in the
// same process) maps the same bytes; cuMemAlloc memory and memory made
// without the fabric handle type are refused with NotSupported saying why;
// a handle of another domain fails with AccessDenied. On the fake the
// domain is FAKECUDA_FABRIC_DOMAIN; on a real driver the test runs where
// the device reports fabric support.
func TestFabricHandles(t *testing.T) {
	l := lib(t)
	if cudatest.Fake() {
		t.Setenv("FAKECUDA_FABRIC_DOMAIN", "dom-1")
	}
	d, _ := l.DeviceGet(0)
	if !l.FabricSupported(d) {
		t.Skip("device 0 does not support fabric handles")
	}
	ctx, _ := l.PrimaryCtxRetain(d)
	defer l.PrimaryCtxRelease(d)
	const n = 2 << 20
	host, err := mem.Alloc(n)
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Free(host)
	err = l.With(ctx, func() error {
		p, err := l.MemCreate(0, n, cuda.MemHandleTypeFabric)
		if err != nil {
			return err
		}
		defer l.MemDestroy(p, n)
		for i := range host {
			host[i] = byte(i * 31)
		}
		if err := l.CopyHtoD(p, mem.Addr(host), n); err != nil {
			return err
		}
		h, err := l.FabricExport(p + 4096) // any address of the allocation
		if err != nil {
			return err
		}
		q, err := l.FabricImport(0, h, n)
		if err != nil {
			return err
		}
		defer l.MemDestroy(q, n)
		want := bytes.Clone(host)
		clear(host)
		if err := l.CopyDtoH(mem.Addr(host), q, n); err != nil {
			return err
		}
		if !bytes.Equal(host, want) {
			return errors.New("the imported mapping holds other bytes")
		}

		a, err := l.MemAlloc(n)
		if err != nil {
			return err
		}
		defer l.MemFree(a)
		if _, err := l.FabricExport(a); errs.CodeOf(err) != errs.NotSupported || !strings.Contains(err.Error(), "cuMemAlloc") {
			return errors.New("cuMemAlloc memory: " + errString(err))
		}
		v, err := l.MemCreate(0, n, 0)
		if err != nil {
			return err
		}
		defer l.MemDestroy(v, n)
		if _, err := l.FabricExport(v); errs.CodeOf(err) != errs.NotSupported || !strings.Contains(err.Error(), "CU_MEM_HANDLE_TYPE_FABRIC") {
			return errors.New("memory without the fabric handle type: " + errString(err))
		}
		if cudatest.Fake() {
			t.Setenv("FAKECUDA_FABRIC_DOMAIN", "dom-2")
			if q, err := l.FabricImport(0, h, n); errs.CodeOf(err) != errs.AccessDenied {
				if err == nil {
					l.MemDestroy(q, n)
				}
				return errors.New("import into another domain: " + errString(err))
			}
			var bad cuda.FabricHandle
			if _, err := l.FabricImport(0, bad, n); err == nil {
				return errors.New("a zero fabric handle imported")
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if cudatest.Fake() && cudatest.Counter(t, "fakecuda_fabric_imports") != 0 {
		t.Fatal("fabric imports left after MemDestroy")
	}
}

func errString(err error) string {
	if err == nil {
		return "no error"
	}
	return err.Error()
}
