package engine_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tecache/te/engine"
	"github.com/tecache/te/engine/meta"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/sys/mem"
)

// watchStore is an in-process store that pushes changes like etcd does.
type watchStore struct {
	*meta.Memory
	mu      sync.Mutex
	fns     []func(string)
	stopped atomic.Int32
}

func (w *watchStore) Watch(ctx context.Context, prefix string, fn func(string)) error {
	w.mu.Lock()
	w.fns = append(w.fns, func(k string) {
		if strings.HasPrefix(k, prefix) {
			fn(k)
		}
	})
	w.mu.Unlock()
	context.AfterFunc(ctx, func() { w.stopped.Add(1) })
	return nil
}

func (w *watchStore) Put(ctx context.Context, k string, v []byte) error {
	if err := w.Memory.Put(ctx, k, v); err != nil {
		return err
	}
	w.mu.Lock()
	fns := append([]func(string){}, w.fns...)
	w.mu.Unlock()
	for _, f := range fns {
		f(k)
	}
	return nil
}

func (w *watchStore) Close() error { return nil }

var (
	watchStores sync.Map
	watchRuns   atomic.Int32
)

func init() {
	meta.RegisterScheme("watchtest", func(conn string) (meta.Store, error) {
		s, _ := watchStores.LoadOrStore(conn, &watchStore{Memory: meta.NewMemory()})
		return s.(*watchStore), nil
	})
}

// TestMetaWatchInvalidates: a peer's republication reaches an open handle
// through the store's watch, before any transfer fails.
func TestMetaWatchInvalidates(t *testing.T) {
	conn := fmt.Sprintf("watchtest://%s-%d", t.Name(), watchRuns.Add(1))
	cfg := func(c *engine.Config) { c.Metadata = conn; c.Transports = []string{"local"} }
	a, b := newEngine(t, cfg), newEngine(t, cfg)
	buf := mem.MustAlloc(4096)
	defer mem.Free(buf)
	seg, err := a.OpenSegment(b.Name())
	if err != nil {
		t.Fatal(err)
	}
	defer a.CloseSegment(seg)
	d0, _ := seg.Descriptor()
	if err := b.RegisterMemory(mem.Addr(buf), 4096, "cpu:0", true); err != nil {
		t.Fatal(err)
	}
	d1, err := seg.Descriptor()
	if err != nil || d1.Version == d0.Version || len(d1.Buffers) != 1 {
		t.Fatalf("handle still serves version %d (%v), want the republished one", d1.Version, err)
	}
	s, _ := watchStores.Load(conn)
	a.Close()
	b.Close()
	// AfterFunc runs on a goroutine of its own: give it a moment.
	deadline := time.Now().Add(2 * time.Second)
	for s.(*watchStore).stopped.Load() != 2 {
		if time.Now().After(deadline) {
			t.Fatalf("%d of 2 watches ended with their engines", s.(*watchStore).stopped.Load())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// FuzzStoreDescriptor feeds arbitrary descriptor and rpc_meta records from
// a metadata store to an engine: opening, reading and transferring against
// them must fail cleanly or succeed, never crash, and never touch memory
// outside the peer's registered buffer. $INST, $ADDR, $LEN and $KEY in the
// input are replaced by a real peer's instance, buffer address, length and
// key, so the fuzzer reaches the data path and the owner's checks.
func FuzzStoreDescriptor(f *testing.F) {
	for _, s := range []string{
		`{"name":"peer","protocol":"tcp","buffers":[{"name":"cpu:0","addr":$ADDR,"length":$LEN,"rkey":[],"lkey":[],"te_key":$KEY}],"te_instance":"$INST","te_transports":["local"]}`,
		`{"name":"peer","buffers":[{"addr":$ADDR,"length":18446744073709551615,"te_key":$KEY}],"te_instance":"$INST","te_transports":["local"]}`,
		`{"name":"peer","buffers":[{"addr":$ADDR,"length":64,"te_key":1}],"te_instance":"$INST","te_transports":["local"]}`,
		`{"name":"peer","buffers":[{"addr":1,"length":1},{"addr":0,"length":5}],"te_transports":["local"]}`,
		`{"name":"other","buffers":[]}`,
		`{"name":"peer","buffers":null,"te_endpoints":{"tcp":"127.0.0.1:1"}}`,
		`{"name":"","buffers":[]}`, `null`, `[]`, `{`, ``, `"x"`, `{"buffers":[{"addr":-1}]}`,
	} {
		f.Add([]byte(s), []byte(`{"ip_or_host_name":"127.0.0.1","rpc_port":1}`), uint16(0), uint16(64))
	}
	f.Add([]byte(`{"name":"peer"}`), []byte(`{"rpc_port":70000}`), uint16(4000), uint16(200))

	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	conn := "mem://fuzz-store-descriptor"
	cfg := engine.Config{Metadata: conn, ListenAddr: "127.0.0.1:0", Transports: []string{"local"},
		RPCTimeout: 200 * time.Millisecond, TransferTimeout: time.Second, Logger: quiet}
	a, err := engine.New(cfg)
	if err != nil {
		f.Fatal(err)
	}
	defer a.Close()
	cfg.SegmentName = "real-peer"
	b, err := engine.New(cfg)
	if err != nil {
		f.Fatal(err)
	}
	defer b.Close()
	const n = 4096
	local := mem.MustAlloc(n)
	defer mem.Free(local)
	// The peer's buffer sits between two guard areas it never registers.
	area := mem.MustAlloc(3 * n)
	defer mem.Free(area)
	target := mem.Addr(area) + n
	if err := a.RegisterMemory(mem.Addr(local), n, "cpu:0", true); err != nil {
		f.Fatal(err)
	}
	if err := b.RegisterMemory(target, n, "cpu:0", true); err != nil {
		f.Fatal(err)
	}
	key := b.Descriptor().Buffers[0].Key
	for i := range local {
		local[i] = 0xab
	}
	store, err := meta.Open(conn)
	if err != nil {
		f.Fatal(err)
	}
	defer store.Close()
	r := strings.NewReplacer("$INST", b.Instance(), "$ADDR", strconv.FormatUint(target, 10),
		"$LEN", strconv.Itoa(n), "$KEY", strconv.FormatUint(key, 10))
	ctx := context.Background()

	f.Fuzz(func(t *testing.T, desc, rpc []byte, off, length uint16) {
		store.Put(ctx, meta.KeyRAM("peer"), []byte(r.Replace(string(desc))))
		store.Put(ctx, meta.KeyRPC("peer"), rpc)
		seg, err := a.OpenSegment("peer")
		if err != nil {
			if c := errs.CodeOf(err); c != errs.Metadata && c != errs.SegmentNotFound && c != errs.InvalidArgument {
				t.Fatalf("open: unexpected code %v: %v", c, err)
			}
			return
		}
		defer a.CloseSegment(seg)
		if _, err := seg.Descriptor(); err != nil {
			return
		}
		bt, err := a.AllocateBatch(1)
		if err != nil {
			t.Fatal(err)
		}
		defer bt.Free()
		remote := target - n + uint64(off)
		if err := bt.Submit(engine.Request{Op: engine.Write, Local: mem.Addr(local), Segment: seg,
			Remote: remote, Length: uint64(length)}); err != nil {
			return
		}
		st, err := bt.Wait(5 * time.Second)
		if err != nil {
			t.Fatalf("wait: %v", err)
		}
		if st.State == engine.Completed && (remote < target || remote+uint64(length) > target+n) {
			t.Fatalf("a write to [%#x,+%d) outside the peer's buffer completed", remote, length)
		}
		for i, c := range area[:n] {
			if c != 0 {
				t.Fatalf("guard below the buffer changed at %d", i)
			}
		}
		for i, c := range area[2*n:] {
			if c != 0 {
				t.Fatalf("guard above the buffer changed at %d", i)
			}
		}
	})
}

func ExampleConfig_etcd() {
	// Engines sharing an etcd cluster: each publishes its segment under a
	// lease and watches the others' (see package engine/meta/etcd).
	cfg := engine.Config{Metadata: "etcd://10.0.0.1:2379,10.0.0.2:2379?ttl=10s", SegmentName: "prefill-0"}
	fmt.Println(cfg.Metadata)
	// Output: etcd://10.0.0.1:2379,10.0.0.2:2379?ttl=10s
}
