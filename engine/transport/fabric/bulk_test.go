package fabric_test

import (
	"bytes"
	"hash/crc32"
	"testing"
	"time"

	"github.com/tecache/te/engine"
	"github.com/tecache/te/engine/transport/fabric"
	"github.com/tecache/te/engine/transport/transporttest"
	"github.com/tecache/te/internal/sys/mem"
)

// bulk is what each direction moves between the two processes.
const bulk = 256 << 20

// TestTwoProcess256MiB moves 256 MiB each way between this process and a
// child engine over each provider, byte-exact, and checks that every task
// says fabric served it; over tcp again with a cluster secret.
func TestTwoProcess256MiB(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	for _, c := range []struct{ name, prov, secret string }{
		{"tcp", "tcp", ""}, {"shm", "shm", ""}, {"sockets", "sockets", ""}, {"tcp-secret", "tcp", sessionSecret},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := requireProvider(t, c.prov)
			t.Setenv("TE_PARAM_fabric_provider", c.prov)
			if c.secret != "" {
				t.Setenv("TE_AUTH_SECRET", c.secret)
			}
			moveBulk(t, p)
		})
	}
}

func moveBulk(t *testing.T, params map[string]string) {
	peer := transporttest.NewChildPeer(t, bulk)
	defer peer.Close()
	e, err := engine.New(engine.Config{ListenAddr: "127.0.0.1:0", Hostname: "127.0.0.1", ForceTransport: fabric.Name,
		TransferTimeout: 60 * time.Second, Params: params})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	src, dst := mem.MustAlloc(bulk), mem.MustAlloc(bulk)
	defer mem.Free(src)
	defer mem.Free(dst)
	for i := 0; i < bulk; i += 4096 {
		src[i], src[i+4095] = byte(i>>12), byte(i>>20)+1
	}
	if err := e.RegisterMemoryBatch([]engine.MemoryRegion{
		{Addr: mem.Addr(src), Length: bulk, Location: "cpu:0"}, {Addr: mem.Addr(dst), Length: bulk, Location: "cpu:0"},
	}); err != nil {
		t.Fatal(err)
	}
	seg, err := e.OpenSegment(peer.Segment())
	if err != nil {
		t.Fatal(err)
	}
	defer e.CloseSegment(seg)
	move := func(op engine.Opcode, local uint64) {
		t.Helper()
		// Eight tasks of 32 MiB: the engine's batches, several in flight.
		const tasks = 8
		b, err := e.AllocateBatch(tasks)
		if err != nil {
			t.Fatal(err)
		}
		defer b.Free()
		var reqs []engine.Request
		for i := uint64(0); i < tasks; i++ {
			off := i * bulk / tasks
			reqs = append(reqs, engine.Request{Op: op, Local: local + off, Segment: seg, Remote: peer.Addr() + off, Length: bulk / tasks})
		}
		start := time.Now()
		if err := b.Submit(reqs...); err != nil {
			t.Fatal(err)
		}
		st, err := b.Wait(60 * time.Second)
		if err != nil || st.State != engine.Completed || st.Transferred != bulk {
			t.Fatalf("%v: %+v %v", op, st, err)
		}
		for i := 0; i < tasks; i++ {
			ts, err := b.TaskStatus(i)
			if err != nil || ts.Transport != fabric.Name {
				t.Fatalf("task %d served by %q (%v), want fabric", i, ts.Transport, err)
			}
		}
		d := time.Since(start)
		t.Logf("%v 256 MiB in %v (%.2f GB/s)", op, d, bulk/d.Seconds()/1e9)
	}
	move(engine.Write, mem.Addr(src))
	got, err := peer.CRC(0, bulk)
	if err != nil {
		t.Fatal(err)
	}
	if want := crc32.ChecksumIEEE(src); got != want {
		t.Fatalf("target crc %08x after the write, want %08x", got, want)
	}
	if err := peer.FillPattern(0, bulk, 7); err != nil {
		t.Fatal(err)
	}
	move(engine.Read, mem.Addr(dst))
	want := make([]byte, 1<<20)
	for off := uint64(0); off < bulk; off += uint64(len(want)) {
		for i := range want {
			want[i] = transporttest.Pattern(7, off+uint64(i))
		}
		if !bytes.Equal(dst[off:off+uint64(len(want))], want) {
			t.Fatalf("read: bytes differ in the MiB at %d", off)
		}
	}
}
