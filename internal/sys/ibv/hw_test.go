package ibv

import (
	"bytes"
	"errors"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/sys/mem"
)

// requireDevice opens the first RDMA device or skips: tests that need
// hardware skip on ErrNotSupported with the reason, and run wherever a NIC
// or Soft-RoCE is present (see engine/transport/rdma/README.md).
func requireDevice(t *testing.T) *Context {
	t.Helper()
	if _, err := Probe(); errors.Is(err, errs.ErrNotSupported) {
		t.Skipf("needs an RDMA device: %v", err)
	} else if err != nil {
		t.Fatal(err)
	}
	l, _ := Load()
	d, err := l.Devices()
	if err != nil {
		t.Fatal(err)
	}
	defer d.Free()
	c, err := d.Open(0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// TestLoopbackRDMA connects two RC queue pairs of one device to each other
// and moves data with RDMA WRITE and READ, checking every verb te uses:
// query device/port/GID, PD, MR keys, CQ, QP state changes, post_send and
// poll_cq through the ops table.
func TestLoopbackRDMA(t *testing.T) {
	loopback(t, requireDevice(t))
}

func loopback(t *testing.T, c *Context) {
	da, err := c.QueryDevice()
	if err != nil {
		t.Fatal(err)
	}
	if da.PhysPortCnt == 0 {
		t.Fatalf("%s reports no ports", c.Name)
	}
	port := uint8(0)
	var pa PortAttr
	for p := uint8(1); p <= da.PhysPortCnt; p++ {
		if pa, err = c.QueryPort(p); err == nil && pa.State == PortActive {
			port = p
			break
		}
	}
	if port == 0 {
		t.Skipf("%s has no active port", c.Name)
	}
	if pa.LID == 0 && pa.LinkLayer != LinkLayerEthernet {
		t.Fatalf("%s port %d: InfiniBand without a LID: %+v", c.Name, port, pa)
	}
	gidIndex := 0
	if s := os.Getenv("TE_IBV_GID_INDEX"); s != "" {
		gidIndex, _ = strconv.Atoi(s)
	}
	gid, err := c.QueryGID(port, gidIndex)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s port %d: lid %d, link layer %d, mtu %d, gid %x", c.Name, port, pa.LID, pa.LinkLayer, MTUBytes(pa.ActiveMTU), gid)

	pd, err := c.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	defer pd.Dealloc()
	const n = 1 << 16
	src, dst := mem.MustAlloc(n), mem.MustAlloc(n)
	defer mem.Free(src)
	defer mem.Free(dst)
	for i := range src {
		src[i] = byte(i * 7)
	}
	access := AccessLocalWrite | AccessRemoteRead | AccessRemoteWrite
	smr, err := pd.RegMR(mem.Addr(src), n, access)
	if err != nil {
		t.Fatal(err)
	}
	defer smr.Dereg()
	dmr, err := pd.RegMR(mem.Addr(dst), n, access|AccessRelaxedOrdering)
	if err != nil {
		t.Fatal(err)
	}
	defer dmr.Dereg()
	if smr.Addr != mem.Addr(src) || smr.Length != n || smr.Lkey == 0 && smr.Rkey == 0 {
		t.Fatalf("MR = %+v", smr)
	}

	cq, err := c.CreateCQ(64, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer cq.Destroy()
	mk := func() *QP {
		qp, err := pd.CreateQP(QPInitAttr{SendCQ: cq.Handle(), RecvCQ: cq.Handle(), QPType: QPTypeRC,
			Cap: QPCap{MaxSendWR: 16, MaxRecvWR: 1, MaxSendSge: 1, MaxRecvSge: 1}})
		if err != nil {
			t.Fatal(err)
		}
		return qp
	}
	a, b := mk(), mk()
	defer a.Destroy()
	defer b.Destroy()
	for _, p := range [][2]*QP{{a, b}, {b, a}} {
		if err := ConnectRC(p[0], RCParams{Port: port, GIDIndex: uint8(gidIndex), MTU: pa.ActiveMTU,
			RemoteQPN: p[1].Num, RemoteLID: pa.LID, RemoteGID: gid, Global: true, MaxRdAtomic: 1}); err != nil {
			t.Fatal(err)
		}
	}

	wcs, err := NewWCArray(4)
	if err != nil {
		t.Fatal(err)
	}
	defer wcs.Free()
	batch, err := NewWRBatch(4)
	if err != nil {
		t.Fatal(err)
	}
	defer batch.Free()
	run := func(op uint32, local uint64, lkey uint32, remote uint64, rkey uint32) {
		batch.Reset()
		batch.Add(1, op, local, n, lkey, remote, rkey, SendSignaled)
		if posted, err := a.PostSend(batch); err != nil || posted != 1 {
			t.Fatalf("post: %d, %v", posted, err)
		}
		deadline := time.Now().Add(5 * time.Second)
		for {
			got, err := cq.Poll(wcs)
			if err != nil {
				t.Fatal(err)
			}
			if got == 1 {
				if wc := wcs.At(0); wc.Status != WCSuccess || wc.WRID != 1 {
					t.Fatalf("completion %+v: %s", wc, WCStatusString(wc.Status))
				}
				return
			}
			if time.Now().After(deadline) {
				t.Fatal("no completion in 5s")
			}
		}
	}
	run(WRRDMAWrite, mem.Addr(src), smr.Lkey, mem.Addr(dst), dmr.Rkey)
	if !bytes.Equal(src, dst) {
		t.Fatal("RDMA WRITE: destination differs")
	}
	clear(src)
	run(WRRDMARead, mem.Addr(src), smr.Lkey, mem.Addr(dst), dmr.Rkey)
	if !bytes.Equal(src, dst) {
		t.Fatal("RDMA READ: data differs")
	}
}
