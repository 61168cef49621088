package ibv

import (
	"errors"
	"testing"

	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/sys/ibv/ibvtest"
	"github.com/tecache/te/internal/sys/mem"
)

// openFake loads a freshly built software libibverbs (package ibvtest) and
// opens its first device.
func openFake(t *testing.T) (*Lib, *ibvtest.Lib, *DeviceList) {
	t.Helper()
	path := ibvtest.Build(t)
	fake := ibvtest.Open(t, path)
	l, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	d, err := l.Devices()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Free)
	return l, fake, d
}

// TestFakeProvider runs the hardware loopback test over the software
// provider: every binding, struct and ops-table call of this package is
// exercised against C code compiled with the real verbs.h.
func TestFakeProvider(t *testing.T) {
	_, fake, d := openFake(t)
	if d.Len() != 2 || d.Name(0) != "fake0" || d.Name(1) != "fake1" {
		t.Fatalf("devices: %d", d.Len())
	}
	c, err := d.Open(0)
	if err != nil {
		t.Fatal(err)
	}
	// The extended query_port (through verbs_context) gives LID 1; the
	// compat entry point would give 101.
	if pa, err := c.QueryPort(1); err != nil || pa.LID != 1 || pa.State != PortActive || MTUBytes(pa.ActiveMTU) != 4096 {
		t.Fatalf("QueryPort = %+v, %v", pa, err)
	}
	loopback(t, c)
	if got := fake.Stat(ibvtest.StatIova2); got != 1 {
		t.Fatalf("%d registrations through ibv_reg_mr_iova2, want 1 (the relaxed-ordering one)", got)
	}
	if got := fake.Stat(ibvtest.StatPosted); got != 2 {
		t.Fatalf("%d work requests posted, want 2", got)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if n := fake.Live(); n != 0 {
		t.Fatalf("%d verbs objects left", n)
	}
}

// A context that is not a verbs_context takes the compat ibv_query_port.
func TestFakeProviderCompatQueryPort(t *testing.T) {
	_, fake, d := openFake(t)
	fake.Set(ibvtest.SetCompat, 1)
	c, err := d.Open(1)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if pa, err := c.QueryPort(1); err != nil || pa.LID != 102 || pa.State != PortActive {
		t.Fatalf("compat QueryPort = %+v, %v", pa, err)
	}
	if _, err := c.QueryPort(2); !errors.Is(err, errs.ErrInvalidArgument) {
		t.Fatalf("QueryPort(2) = %v, want InvalidArgument (EINVAL)", err)
	}
}

// Failures come back as te errors carrying errno: NULL + errno from
// ibv_reg_mr and ibv_create_qp, a returned errno from ibv_modify_qp and
// post_send, EINVAL and EOPNOTSUPP from ibv_reg_dmabuf_mr.
func TestFakeProviderErrors(t *testing.T) {
	_, fake, d := openFake(t)
	c, err := d.Open(0)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	pd, err := c.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	defer pd.Dealloc()
	if _, err := pd.RegMR(0, 4096, AccessLocalWrite); !errors.Is(err, errs.ErrInvalidArgument) {
		t.Fatalf("RegMR(NULL) = %v, want InvalidArgument", err)
	}
	if _, err := pd.RegDmabufMR(0, 4096, 0, -1, AccessLocalWrite); !errors.Is(err, errs.ErrInvalidArgument) {
		t.Fatalf("RegDmabufMR(fd -1) = %v, want InvalidArgument", err)
	}
	fake.Set(ibvtest.SetNoDmabuf, 1)
	if _, err := pd.RegDmabufMR(0, 4096, 0, 3, AccessLocalWrite); !errors.Is(err, errs.ErrNotSupported) {
		t.Fatalf("RegDmabufMR without dma-buf support = %v, want NotSupported", err)
	}
	cq, err := c.CreateCQ(16, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer cq.Destroy()
	if _, err := pd.CreateQP(QPInitAttr{SendCQ: cq.Handle(), RecvCQ: cq.Handle(), QPType: 4}); !errors.Is(err, errs.ErrInvalidArgument) {
		t.Fatalf("CreateQP(UD) = %v, want InvalidArgument", err)
	}
	qp, err := pd.CreateQP(QPInitAttr{SendCQ: cq.Handle(), RecvCQ: cq.Handle(), QPType: QPTypeRC,
		Cap: QPCap{MaxSendWR: 4, MaxRecvWR: 1, MaxSendSge: 1, MaxRecvSge: 1}})
	if err != nil {
		t.Fatal(err)
	}
	defer qp.Destroy()
	// RESET -> RTS directly is refused.
	if err := qp.Modify(&QPAttr{QPState: QPStateRTS}, QPAttrState); !errors.Is(err, errs.ErrInvalidArgument) {
		t.Fatalf("RESET->RTS = %v", err)
	}
	// Posting on a QP that is not connected fails and says how many went.
	buf := mem.MustAlloc(4096)
	defer mem.Free(buf)
	b, err := NewWRBatch(2)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Free()
	b.Add(1, WRRDMAWrite, mem.Addr(buf), 8, 1, mem.Addr(buf), 1, SendSignaled)
	b.Add(2, WRRDMAWrite, mem.Addr(buf), 8, 1, mem.Addr(buf), 1, SendSignaled)
	if posted, err := qp.PostSend(b); posted != 0 || !errors.Is(err, errs.ErrInvalidArgument) {
		t.Fatalf("PostSend on RESET QP = %d, %v", posted, err)
	}
}

// A library with no device: Devices is empty, Probe would say so.
func TestFakeProviderNoDevice(t *testing.T) {
	path := ibvtest.Build(t)
	ibvtest.Open(t, path).Set(ibvtest.SetDevices, 0)
	l, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	d, err := l.Devices()
	if err != nil || d.Len() != 0 {
		t.Fatalf("Devices = %v, %v", d, err)
	}
	d.Free()
}
