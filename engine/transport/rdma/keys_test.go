package rdma

import (
	"bytes"
	"errors"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tecache/te/engine/segment"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/sys/ibv"
	"github.com/tecache/te/internal/sys/mem"
)

// fakeNIC registers memory without hardware: keys derive from the NIC
// index and a counter, so the test can tell whose key is where.
type fakeNIC struct {
	idx      int
	fail     error
	noDmabuf error // RegDmabuf fails with it
	via      []string
	barrier  *sync.WaitGroup // when set, RegMR waits for every NIC's call
	mu       sync.Mutex
	n        uint32
	live     map[uint32]bool // lkey -> registered
	access   []int
}

func (f *fakeNIC) Name() string { return "fake" + string(rune('0'+f.idx)) }

func (f *fakeNIC) RegMR(addr, length uint64, access int) (memReg, error) {
	if f.barrier != nil {
		f.barrier.Done()
		done := make(chan struct{})
		go func() { f.barrier.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			return nil, errs.New(errs.Internal, "fake", "registrations did not run in parallel")
		}
	}
	if f.fail != nil {
		return nil, f.fail
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.n++
	lkey := uint32(f.idx)<<16 | f.n
	if f.live == nil {
		f.live = map[uint32]bool{}
	}
	f.live[lkey] = true
	f.access = append(f.access, access)
	return &fakeMR{f: f, lkey: lkey}, nil
}

func (f *fakeNIC) RegDmabuf(offset, length, iova uint64, fd int, access int) (memReg, error) {
	if f.noDmabuf != nil {
		return nil, f.noDmabuf
	}
	m, err := f.RegMR(iova, length, access)
	if err == nil {
		f.mu.Lock()
		f.via = append(f.via, "dmabuf")
		f.mu.Unlock()
	}
	return m, err
}

func (f *fakeNIC) registered() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, v := range f.live {
		if v {
			n++
		}
	}
	return n
}

type fakeMR struct {
	f    *fakeNIC
	lkey uint32
}

func (m *fakeMR) Keys() (uint32, uint32) { return m.lkey, m.lkey | 0x8000 }
func (m *fakeMR) Dereg() error {
	m.f.mu.Lock()
	defer m.f.mu.Unlock()
	if !m.f.live[m.lkey] {
		return errs.New(errs.Internal, "fake", "double dereg of %#x", m.lkey)
	}
	m.f.live[m.lkey] = false
	return nil
}

func fakes(n int) ([]*fakeNIC, []registrar) {
	fs := make([]*fakeNIC, n)
	rs := make([]registrar, n)
	for i := range fs {
		fs[i] = &fakeNIC{idx: i}
		rs[i] = fs[i]
	}
	return fs, rs
}

func region(t *testing.T, n int, remote bool) *segment.Region {
	t.Helper()
	b := mem.MustAlloc(n)
	t.Cleanup(func() { mem.Free(b) })
	r, err := segment.NewRegion(mem.Addr(b), uint64(n), "cpu:0", remote)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// One MR per buffer per NIC; the descriptor carries lkey[i]/rkey[i] of NIC i.
func TestKeysPerNIC(t *testing.T) {
	fs, rs := fakes(3)
	k := newKeyTable()
	r := region(t, 1<<16, true)
	if err := k.register(r, rs, ParallelRegMin); err != nil {
		t.Fatal(err)
	}
	wantL := []uint32{0<<16 | 1, 1<<16 | 1, 2<<16 | 1}
	wantR := []uint32{wantL[0] | 0x8000, wantL[1] | 0x8000, wantL[2] | 0x8000}
	if !reflect.DeepEqual(r.Desc.Lkey, wantL) || !reflect.DeepEqual(r.Desc.Rkey, wantR) {
		t.Fatalf("lkey %x rkey %x, want %x %x", r.Desc.Lkey, r.Desc.Rkey, wantL, wantR)
	}
	for _, f := range fs {
		if f.registered() != 1 || f.access[0] != ibv.AccessLocalWrite|ibv.AccessRemoteRead|ibv.AccessRemoteWrite {
			t.Fatalf("%s: %d regions, access %v", f.Name(), f.registered(), f.access)
		}
	}
	// A second registration of the same region is a no-op.
	if err := k.register(r, rs, ParallelRegMin); err != nil || fs[0].registered() != 1 {
		t.Fatalf("re-register: %v, %d regions", err, fs[0].registered())
	}
	// Local-only memory is not remotely accessible on the NIC either.
	local := region(t, 4096, false)
	if err := k.register(local, rs, ParallelRegMin); err != nil {
		t.Fatal(err)
	}
	if fs[1].access[1] != ibv.AccessLocalWrite {
		t.Fatalf("local-only access = %#x", fs[1].access[1])
	}
	if k.len() != 2 {
		t.Fatalf("%d regions tracked", k.len())
	}
	if err := k.unregister(r); err != nil {
		t.Fatal(err)
	}
	if err := k.unregister(r); err != nil {
		t.Fatalf("second unregister: %v", err)
	}
	for _, f := range fs {
		if f.registered() != 1 {
			t.Fatalf("%s holds %d regions after unregister", f.Name(), f.registered())
		}
	}
	k.closeAll()
	for _, f := range fs {
		if f.registered() != 0 {
			t.Fatalf("%s holds %d regions after closeAll", f.Name(), f.registered())
		}
	}
}

// A NIC that refuses leaves nothing registered on the others and the
// descriptor untouched.
func TestKeysRollback(t *testing.T) {
	for _, parallel := range []bool{false, true} {
		fs, rs := fakes(3)
		fs[1].fail = errs.New(errs.NoMemory, "ibv", "ibv_reg_mr: cannot allocate memory")
		k := newKeyTable()
		r := region(t, 1<<16, true)
		min := uint64(ParallelRegMin)
		if parallel {
			min = 1
		}
		err := k.register(r, rs, min)
		if !errors.Is(err, errs.ErrNoMemory) || !bytes.Contains([]byte(err.Error()), []byte("fake1")) {
			t.Fatalf("parallel=%v: %v, want NoMemory naming fake1", parallel, err)
		}
		for _, f := range fs {
			if f.registered() != 0 {
				t.Fatalf("parallel=%v: %s kept a region", parallel, f.Name())
			}
		}
		if len(r.Desc.Lkey) != 0 || len(r.Desc.Rkey) != 0 || k.len() != 0 {
			t.Fatalf("parallel=%v: keys %v %v published after failure", parallel, r.Desc.Lkey, r.Desc.Rkey)
		}
	}
	if err := newKeyTable().register(region(t, 4096, true), nil, ParallelRegMin); !errors.Is(err, errs.ErrTransportUnavailable) {
		t.Fatalf("no NIC: %v", err)
	}
}

// From the parallel threshold on, every NIC registers at once (the fake
// NICs wait for each other, so a sequential loop would time out) and the
// memory is pre-faulted without changing it.
func TestKeysParallelLarge(t *testing.T) {
	fs, rs := fakes(4)
	var barrier sync.WaitGroup
	barrier.Add(len(fs))
	for _, f := range fs {
		f.barrier = &barrier
	}
	r := region(t, 8<<20, true)
	b := mem.Bytes(r.Addr, r.Length)
	for i := range b {
		b[i] = byte(i * 31)
	}
	want := bytes.Clone(b)
	k := newKeyTable()
	if err := k.register(r, rs, 4<<20); err != nil {
		t.Fatal(err)
	}
	if len(r.Desc.Rkey) != 4 || !bytes.Equal(b, want) {
		t.Fatalf("rkeys %v; contents changed: %v", r.Desc.Rkey, !bytes.Equal(b, want))
	}
	k.closeAll()
}

func TestPreTouchKeepsContents(t *testing.T) {
	b := mem.MustAlloc(3<<20 + 123)
	defer mem.Free(b)
	for i := range b {
		b[i] = byte(i)
	}
	want := bytes.Clone(b)
	preTouch(mem.Addr(b)+17, uint64(len(b)-17))
	if !bytes.Equal(b, want) {
		t.Fatal("preTouch changed memory")
	}
}

// GPU memory goes through a dma-buf where the driver exports one and the
// provider takes it, else by address (peer memory); a NIC that refuses both
// leaves nothing registered and an error that says what each way answered.
func TestKeysDevice(t *testing.T) {
	gpu := func(t *testing.T) *segment.Region {
		r := region(t, 1<<16, true)
		r.Location = segment.Location{Kind: "cuda", Index: 0}
		return r
	}
	fd := func(t *testing.T) dmabufSource {
		return func(uint64, uint64, int) (int, uint64, error) {
			var fds [2]int // any fd: the fakes do not read it; registration closes it
			if err := unix.Pipe(fds[:]); err != nil {
				return -1, 0, err
			}
			unix.Close(fds[1])
			return fds[0], 0, nil
		}
	}
	noExport := func(uint64, uint64, int) (int, uint64, error) {
		return -1, 0, errs.New(errs.NotSupported, "fake", "no dma-buf")
	}
	t.Run("dmabuf", func(t *testing.T) {
		fs, rs := fakes(2)
		k := newKeyTable()
		r := gpu(t)
		how, err := k.registerDevice(r, rs, fd(t))
		if err != nil || how != viaDmabuf || len(r.Desc.Rkey) != 2 || len(fs[0].via) != 1 || len(fs[1].via) != 1 {
			t.Fatalf("%q %v %v", how, err, r.Desc)
		}
		if err := k.unregister(r); err != nil || fs[0].registered()+fs[1].registered() != 0 {
			t.Fatal(err)
		}
	})
	t.Run("provider without dma-buf", func(t *testing.T) {
		fs, rs := fakes(2)
		fs[0].noDmabuf = errs.New(errs.NotSupported, "fake", "EOPNOTSUPP")
		fs[1].noDmabuf = fs[0].noDmabuf
		k := newKeyTable()
		how, err := k.registerDevice(gpu(t), rs, fd(t))
		if err != nil || how != viaPeermem || fs[0].registered() != 1 || fs[1].registered() != 1 {
			t.Fatalf("%q %v", how, err)
		}
	})
	t.Run("driver without dma-buf", func(t *testing.T) {
		fs, rs := fakes(1)
		how, err := newKeyTable().registerDevice(gpu(t), rs, noExport)
		if err != nil || how != viaPeermem || fs[0].registered() != 1 {
			t.Fatalf("%q %v", how, err)
		}
	})
	t.Run("refused", func(t *testing.T) {
		fs, rs := fakes(3)
		fs[2].fail = errs.New(errs.InvalidArgument, "fake", "EFAULT")
		k := newKeyTable()
		r := gpu(t)
		_, err := k.registerDevice(r, rs, noExport)
		if err == nil || !strings.Contains(err.Error(), "no dma-buf") || !strings.Contains(err.Error(), "fake2") {
			t.Fatalf("error %v should name the NIC and the dma-buf answer", err)
		}
		if n := fs[0].registered() + fs[1].registered() + fs[2].registered(); n != 0 || len(r.Desc.Rkey) != 0 || k.len() != 0 {
			t.Fatalf("%d regions left, keys %v", n, r.Desc.Rkey)
		}
	})
}
