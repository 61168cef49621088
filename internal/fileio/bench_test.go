package fileio

import (
	"encoding/json"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/tecache/te/internal/sys/mem"
)

// BenchmarkVsFio runs the same workloads through the executor and through fio
// (io_uring engine, O_DIRECT, one job) on the same file, and reports both
// rates and their ratio: te_MB/s, fio_MB/s, x_fio. The file lives on a file
// system that takes O_DIRECT (the test's temp dir, else the working dir);
// TE_BENCH_DIR picks another. It needs fio on PATH.
//
//	go test -run '^$' -bench VsFio -benchtime 5x ./internal/fileio/
func BenchmarkVsFio(b *testing.B) {
	fio, err := exec.LookPath("fio")
	if err != nil {
		b.Skip("fio is not installed")
	}
	dir := os.Getenv("TE_BENCH_DIR")
	if dir == "" {
		dir = directDir(b)
	}
	const size = 512 << 20
	path := filepath.Join(dir, "fio-bench")
	defer os.Remove(path)
	x, err := New(Config{})
	if err != nil {
		b.Fatal(err)
	}
	defer x.Close()
	f, err := x.Open(path, 0, size, OpenOptions{Create: true})
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	if !f.Direct() {
		b.Skipf("%s has no O_DIRECT", dir)
	}
	buf := mem.MustAlloc(64 << 20)
	defer mem.Free(buf)
	fill(buf, 1)
	// Lay the file out once (fio's writes then overwrite, as ours do).
	for off := uint64(0); off < size; off += 64 << 20 {
		if err := runOne(x, &Op{Write: true, File: f, Off: off, Addr: mem.Addr(buf), Len: 64 << 20}); err != nil {
			b.Fatal(err)
		}
	}
	b.Logf("executor: %s; file %s (%d MiB, O_DIRECT, alignment %d)", x.Mode(), path, size>>20, f.offAlign)
	for _, w := range []struct {
		name  string
		rw    string
		write bool
		rand  bool
		bs    uint64
		depth int
		total uint64
	}{
		{"seqread-1m-qd16", "read", false, false, 1 << 20, 16, size},
		{"seqwrite-1m-qd16", "write", true, false, 1 << 20, 16, size},
		{"randread-4k-qd32", "randread", false, true, 4 << 10, 32, 64 << 20},
		{"randread-64k-qd32", "randread", false, true, 64 << 10, 32, 256 << 20},
	} {
		b.Run(w.name, func(b *testing.B) {
			var teRate, fioRate float64
			// Alternate the two and keep each one's best run: the
			// machine is shared, and the best is the least disturbed.
			for i := 0; i < b.N; i++ {
				teRate = max(teRate, closedLoop(b, x, f, buf, w.write, w.rand, w.bs, w.depth, w.total))
				fioRate = max(fioRate, runFio(b, fio, path, w.rw, w.bs, w.depth, w.total, size))
			}
			b.ReportMetric(teRate/1e6, "te_MB/s")
			b.ReportMetric(fioRate/1e6, "fio_MB/s")
			b.ReportMetric(teRate/fioRate, "x_fio")
			b.ReportMetric(0, "ns/op")
		})
	}
	b.Logf("stats: %+v", x.Stats())
}

func runOne(x *Executor, op *Op) error {
	ch := make(chan error, 1)
	op.Done = func(_ *Op, err error) { ch <- err }
	x.Submit(op)
	return <-ch
}

// closedLoop keeps depth ops of bs bytes in flight until total bytes moved,
// and returns bytes per second.
func closedLoop(b *testing.B, x *Executor, f *File, buf []byte, write, random bool, bs uint64, depth int, total uint64) float64 {
	n := int(total / bs)
	blocks := f.Size() / bs
	var mu sync.Mutex
	issued, ended := 0, 0
	var firstErr error
	done := make(chan struct{})
	rng := rand.New(rand.NewPCG(1, 2))
	next := func(op *Op) bool {
		// under mu
		if issued >= n || firstErr != nil {
			return false
		}
		blk := uint64(issued) % blocks
		if random {
			blk = rng.Uint64N(blocks)
		}
		slot := uint64(issued%depth) * bs % uint64(len(buf))
		op.Write, op.File, op.Off, op.Addr, op.Len = write, f, blk*bs, mem.Addr(buf)+slot, bs
		issued++
		return true
	}
	ops := make([]*Op, depth)
	onDone := func(op *Op, err error) {
		mu.Lock()
		ended++
		if err != nil && firstErr == nil {
			firstErr = err
		}
		more := next(op)
		fin := ended == issued && !more
		mu.Unlock()
		if more {
			x.Submit(op)
		} else if fin {
			close(done)
		}
	}
	t0 := time.Now()
	mu.Lock()
	var start []*Op
	for i := range ops {
		ops[i] = &Op{Done: onDone}
		if next(ops[i]) {
			start = append(start, ops[i])
		}
	}
	mu.Unlock()
	x.Submit(start...)
	<-done
	el := time.Since(t0)
	if firstErr != nil {
		b.Fatal(firstErr)
	}
	return float64(uint64(n)*bs) / el.Seconds()
}

func runFio(b *testing.B, fio, path, rw string, bs uint64, depth int, total, size uint64) float64 {
	args := []string{"--name=ref", "--filename=" + path, "--rw=" + rw, "--bs=" + strconv.FormatUint(bs, 10),
		"--iodepth=" + strconv.Itoa(depth), "--direct=1", "--ioengine=io_uring", "--numjobs=1",
		"--size=" + strconv.FormatUint(size, 10), "--io_size=" + strconv.FormatUint(total, 10),
		"--randrepeat=0", "--norandommap", "--output-format=json"}
	out, err := exec.Command(fio, args...).Output()
	if err != nil {
		b.Fatalf("fio %v: %v", args, err)
	}
	var r struct {
		Jobs []struct {
			Read struct {
				BwBytes float64 `json:"bw_bytes"`
			} `json:"read"`
			Write struct {
				BwBytes float64 `json:"bw_bytes"`
			} `json:"write"`
		} `json:"jobs"`
	}
	if err := json.Unmarshal(out, &r); err != nil || len(r.Jobs) != 1 {
		b.Fatalf("fio output: %v\n%s", err, out)
	}
	bw := r.Jobs[0].Read.BwBytes + r.Jobs[0].Write.BwBytes
	if bw <= 0 {
		b.Fatalf("fio reported no bandwidth: %s", out)
	}
	return bw
}
