package segment

import (
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/tecache/te/internal/errs"
)

func TestDescJSONNames(t *testing.T) {
	d := &Desc{Name: "10.0.0.1:1234", Protocol: "rdma", Devices: []Device{{Name: "mlx5_0", LID: 1, GID: "fe80::1"}},
		Buffers: []BufferDesc{{Name: "cpu:0", Addr: 4096, Length: 8192, Rkey: []uint32{7, 8}, Lkey: []uint32{5, 6}, Key: 99}}}
	b, err := d.Encode()
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	json.Unmarshal(b, &m)
	for _, k := range []string{"name", "protocol", "devices", "buffers"} {
		if _, ok := m[k]; !ok {
			t.Fatalf("field %q missing in %s", k, b)
		}
	}
	buf := m["buffers"].([]any)[0].(map[string]any)
	for _, k := range []string{"name", "addr", "length", "rkey", "lkey"} {
		if _, ok := buf[k]; !ok {
			t.Fatalf("buffer field %q missing in %s", k, b)
		}
	}
	back, err := Decode(b)
	if err != nil || back.Buffers[0].Rkey[1] != 8 || back.Buffers[0].Key != 99 || back.Devices[0].GID != "fe80::1" {
		t.Fatal(back, err)
	}
}

// TestDecodeMooncakeDescriptor reads a descriptor as Mooncake writes it (no
// te_* fields).
func TestDecodeMooncakeDescriptor(t *testing.T) {
	js := `{"name":"node1","protocol":"rdma","tcp_data_port":0,"devices":[{"name":"mlx5_0","lid":0,"gid":"00:00"}],
	"buffers":[{"name":"cpu:0","addr":140000000000,"length":1048576,"rkey":[1234],"lkey":[4321]}],
	"priority_matrix":{},"timestamp":"2026"}`
	d, err := Decode([]byte(js))
	if err != nil {
		t.Fatal(err)
	}
	if b, err := d.Find(140000000000+10, 100); err != nil || b.Rkey[0] != 1234 {
		t.Fatal(b, err)
	}
}

func TestDecodeRejects(t *testing.T) {
	for name, js := range map[string]string{
		"not json":     `{`,
		"no name":      `{"buffers":[]}`,
		"zero length":  `{"name":"a","buffers":[{"addr":1,"length":0}]}`,
		"overflow":     `{"name":"a","buffers":[{"addr":18446744073709551615,"length":2}]}`,
		"overlap":      `{"name":"a","buffers":[{"addr":100,"length":50},{"addr":120,"length":50}]}`,
		"wrong type":   `{"name":"a","buffers":[{"addr":"x","length":1}]}`,
		"negative key": `{"name":"a","buffers":[{"addr":1,"length":1,"rkey":[-1]}]}`,
		// Split buffers: the layout and the key vectors must agree.
		"split, no step":       `{"name":"a","buffers":[{"addr":4096,"length":30000,"rkey":[1],"te_mr_span":10000,"te_rkeys":[[2],[3]]}]}`,
		"split, span <= step":  `{"name":"a","buffers":[{"addr":4096,"length":30000,"rkey":[1],"te_mr_step":10000,"te_mr_span":10000,"te_rkeys":[[2],[3]]}]}`,
		"split, span >= len":   `{"name":"a","buffers":[{"addr":4096,"length":30000,"rkey":[1],"te_mr_step":10000,"te_mr_span":30000}]}`,
		"split, too few keys":  `{"name":"a","buffers":[{"addr":4096,"length":30000,"rkey":[1],"te_mr_step":10000,"te_mr_span":15000,"te_rkeys":[[2]]}]}`,
		"split, too many keys": `{"name":"a","buffers":[{"addr":4096,"length":30000,"rkey":[1],"te_mr_step":10000,"te_mr_span":15000,"te_rkeys":[[2],[3],[4]]}]}`,
		"split, short vector":  `{"name":"a","buffers":[{"addr":4096,"length":30000,"rkey":[1,5],"te_mr_step":10000,"te_mr_span":15000,"te_rkeys":[[2,6],[3]]}]}`,
		"split, lkeys":         `{"name":"a","buffers":[{"addr":4096,"length":30000,"rkey":[1],"te_mr_step":10000,"te_mr_span":15000,"te_rkeys":[[2],[3]],"te_lkeys":[[2]]}]}`,
		"split, keys no step":  `{"name":"a","buffers":[{"addr":4096,"length":30000,"rkey":[1],"te_rkeys":[[2],[3]]}]}`,
		"split, tiny overlap":  `{"name":"a","buffers":[{"addr":4096,"length":30000,"rkey":[1],"te_mr_step":10000,"te_mr_span":10001,"te_rkeys":[[2],[3]]}]}`,
		"split, too many":      `{"name":"a","buffers":[{"addr":4096,"length":1000000000,"rkey":[1],"te_mr_step":1,"te_mr_span":2}]}`,
	} {
		if _, err := Decode([]byte(js)); !errors.Is(err, errs.ErrMetadata) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// A buffer split into overlapping memory regions: every access no longer
// than the overlap is served by one region that holds it whole.
func TestSplitBufferKeys(t *testing.T) {
	js := `{"name":"a","buffers":[{"addr":4096,"length":30000,"rkey":[1,10],"lkey":[1,10],"te_mr_step":10000,"te_mr_span":15000,"te_rkeys":[[2,20],[3,30]]}]}`
	d, err := Decode([]byte(js))
	if err != nil {
		t.Fatal(err)
	}
	b := &d.Buffers[0]
	if n := MRCount(b.Length, b.MRStep, b.MRSpan); n != 3 {
		t.Fatalf("%d regions, want 3", n)
	}
	for off := uint64(0); off+5000 <= b.Length; off += 7 {
		k := b.MRIndex(off)
		lo := uint64(k) * b.MRStep
		hi := min(lo+b.MRSpan, b.Length)
		if off < lo || off+5000 > hi {
			t.Fatalf("an access at %d of 5000 bytes goes to region %d [%d,%d)", off, k, lo, hi)
		}
		if _, rk := b.Keys(k); rk[1] != uint32(10*(k+1)) {
			t.Fatalf("region %d has rkeys %v", k, rk)
		}
	}
	c := d.Clone()
	c.Buffers[0].MoreRkey[0][0] = 99
	if d.Buffers[0].MoreRkey[0][0] == 99 {
		t.Fatal("Clone shares the split keys")
	}
}

func TestFind(t *testing.T) {
	d := &Desc{Name: "a", Buffers: []BufferDesc{{Addr: 300, Length: 100}, {Addr: 100, Length: 100}}}
	if err := d.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		addr, n uint64
		ok      bool
	}{{100, 100, true}, {150, 50, true}, {199, 2, false}, {200, 1, false}, {300, 100, true}, {399, 1, true}, {400, 1, false}, {99, 1, false}, {100, 0, false}, {^uint64(0), 2, false}} {
		_, err := d.Find(c.addr, c.n)
		if (err == nil) != c.ok {
			t.Errorf("Find(%d,%d) = %v", c.addr, c.n, err)
		}
	}
}

func TestRegistryAcquire(t *testing.T) {
	g := NewRegistry()
	r, _ := NewRegion(4096, 4096, "cpu", true)
	p, _ := NewRegion(16384, 4096, "cpu", false)
	if _, _, err := g.Add(r, p); err != nil {
		t.Fatal(err)
	}
	if _, err := g.Acquire(4096, 4096, r.Desc.Key, true, Anyone); err != nil {
		t.Fatal(err)
	}
	r.Release()
	for name, c := range map[string]struct {
		addr, n, key uint64
		remote       bool
		code         errs.Code
	}{
		"wrong key":     {4096, 10, r.Desc.Key + 1, true, errs.StaleDescriptor},
		"past end":      {8000, 200, r.Desc.Key, true, errs.AddressNotRegistered},
		"zero":          {4096, 0, 0, true, errs.InvalidArgument},
		"overflow":      {^uint64(0) - 1, 4, 0, true, errs.InvalidArgument},
		"private":       {16384, 10, 0, true, errs.AccessDenied},
		"unregistered":  {100, 10, 0, false, errs.AddressNotRegistered},
		"between":       {9000, 10, 0, false, errs.AddressNotRegistered},
		"straddles two": {8000, 9000, 0, false, errs.AddressNotRegistered},
	} {
		if _, err := g.Acquire(c.addr, c.n, c.key, c.remote, Anyone); errs.CodeOf(err) != c.code {
			t.Errorf("%s: %v", name, err)
		}
	}
	if _, err := g.Acquire(16384, 10, 0, false, Anyone); err != nil {
		t.Fatalf("local access to a private buffer: %v", err)
	}
}

// TestRegistryRemoveWaitsForAccess races accesses against removal: once
// Close and WaitIdle return, no access may still hold the region.
func TestRegistryRemoveWaitsForAccess(t *testing.T) {
	for round := 0; round < 200; round++ {
		g := NewRegistry()
		r, _ := NewRegion(4096, 4096, "cpu", true)
		g.Add(r)
		var wg sync.WaitGroup
		var mu sync.Mutex
		released := false
		for i := 0; i < 4; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for k := 0; k < 50; k++ {
					x, err := g.Acquire(4096, 10, 0, true, Anyone)
					if err != nil {
						return
					}
					mu.Lock()
					if released {
						mu.Unlock()
						// Removal finished yet this access got in.
						t.Error("access acquired after removal completed")
						x.Release()
						return
					}
					mu.Unlock()
					x.Release()
				}
			}()
		}
		rs, err := g.Close(4096)
		if err != nil {
			t.Fatal(err)
		}
		rs[0].WaitIdle(t.Context())
		g.Drop(rs...)
		mu.Lock()
		released = true
		mu.Unlock()
		wg.Wait()
	}
}

func FuzzDecode(f *testing.F) {
	f.Add([]byte(`{"name":"a","buffers":[{"name":"cpu:0","addr":4096,"length":10,"rkey":[1],"lkey":[2],"te_key":3}]}`))
	f.Add([]byte(`{"name":"x","te_endpoints":{"tcp":"1.2.3.4:5"},"te_host":{"boot_id":"b","pid_ns":"p","pid":1}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		d, err := Decode(data)
		if err != nil {
			if !errors.Is(err, errs.ErrMetadata) {
				t.Fatalf("error without the metadata code: %v", err)
			}
			return
		}
		// A decoded descriptor re-encodes and decodes to the same buffers,
		// and lookups on it never panic.
		b, err := d.Encode()
		if err != nil {
			t.Fatal(err)
		}
		d2, err := Decode(b)
		if err != nil || len(d2.Buffers) != len(d.Buffers) {
			t.Fatalf("round trip: %v", err)
		}
		for _, x := range d.Buffers {
			d.Find(x.Addr, x.Length)
			d.Find(x.Addr+x.Length-1, 2)
		}
		d.Clone()
	})
}

// TestAcquireInWindow: a caller that remembers the window region its previous
// access got must not reach outside the window's ranges with it.
func TestAcquireInWindow(t *testing.T) {
	g := NewRegistry()
	r, _ := NewRegion(1<<20, 1<<20, "cpu", true)
	g.Add(r)
	w, err := g.GrantWindow([]Range{{Addr: 1 << 20, Length: 4096}})
	if err != nil {
		t.Fatal(err)
	}
	x, err := g.AcquireIn(nil, 1<<20, 4096, w.Key, true, Anyone)
	if err != nil {
		t.Fatal(err)
	}
	x.Release()
	if _, err := g.AcquireIn(x, 1<<20+8192, 4096, w.Key, true, Anyone); errs.CodeOf(err) != errs.AccessDenied {
		t.Fatalf("access outside the window through its region: %v", err)
	}
	if y, err := g.AcquireIn(x, 1<<20+8192, 4096, r.Desc.Key, true, Anyone); err != nil || y != r {
		t.Fatalf("access under the buffer's key: %v", err)
	} else {
		y.Release()
	}
}

// TestWindowAcrossBuffers: a range over two registered buffers that follow
// each other is granted as two parts; an access within one part is granted,
// one across the boundary is not (it is not inside one buffer either).
func TestWindowAcrossBuffers(t *testing.T) {
	g := NewRegistry()
	a, _ := NewRegion(1<<20, 4096, "cpu", true)
	b, _ := NewRegion(1<<20+4096, 4096, "cpu", true)
	g.Add(a, b)
	w, err := g.GrantWindow([]Range{{Addr: 1<<20 + 2048, Length: 4096}})
	if err != nil {
		t.Fatal(err)
	}
	if len(w.Regions()) != 2 || w.Bytes() != 4096 {
		t.Fatalf("window regions %d, bytes %d", len(w.Regions()), w.Bytes())
	}
	for _, x := range []uint64{1<<20 + 2048, 1<<20 + 4096} {
		r, err := g.Acquire(x, 2048, w.Key, true, Anyone)
		if err != nil {
			t.Fatalf("access at %#x: %v", x, err)
		}
		r.Release()
	}
	if _, err := g.Acquire(1<<20, 2048, w.Key, true, Anyone); errs.CodeOf(err) != errs.AccessDenied {
		t.Fatalf("access before the window: %v", err)
	}
	if _, err := g.GrantWindow([]Range{{Addr: 1<<20 + 6000, Length: 4096}}); errs.CodeOf(err) != errs.AddressNotRegistered {
		t.Fatalf("range past the registered buffers: %v", err)
	}
}

// TestMooncakeCXLDescriptor decodes a descriptor as a Mooncake engine with
// the cxl transport publishes it: buffers by offset in the device, no
// address. Each gets the owner's address (cxl_base_addr + offset), so
// requests name it as any other buffer.
func TestMooncakeCXLDescriptor(t *testing.T) {
	js := `{"name":"mc","protocol":"cxl","cxl_name":"/dev/dax0.0","cxl_base_addr":140000000000000,
	"buffers":[{"name":"mc","offset":4096,"length":8192},{"name":"mc","offset":0,"length":4096}]}`
	d, err := Decode([]byte(js))
	if err != nil {
		t.Fatal(err)
	}
	if d.CXLName != "/dev/dax0.0" || d.CXLBase != 140000000000000 {
		t.Fatalf("%+v", d)
	}
	if d.Buffers[0].Addr != 140000000000000 || d.Buffers[1].Addr != 140000000000000+4096 || d.Buffers[1].Offset != 4096 {
		t.Fatalf("buffers %+v", d.Buffers)
	}
	b, err := d.Encode()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{`"cxl_name":"/dev/dax0.0"`, `"cxl_base_addr":140000000000000`, `"offset":4096`} {
		if !strings.Contains(string(b), f) {
			t.Fatalf("re-encoded descriptor lacks %s: %s", f, b)
		}
	}
}
