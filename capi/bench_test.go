package main

import (
	"bufio"
	"bytes"
	"log/slog"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/tecache/te/engine"
	"github.com/tecache/te/internal/sys/mem"
)

const (
	benchReqs = 128
	benchSize = 4096
)

// BenchmarkSubmitWait128 measures allocate + submit + wait + free of a batch
// of 128 local 4 KiB WRITEs, reported per request ("ns/req"):
//
//   - go:     through package engine;
//   - cabi:   through te.h from C (tests/c/bench_submit.c, run as a child
//     process for b.N batches; it times its own loop, and also reports
//     "ns/call", the fixed cost of one call across the ABI, measured with
//     te_rpc_port, which does nothing but cross and look a handle up);
//   - memcpy: the physical reference, copying the same 128 x 4 KiB.
//
// The C ABI's added cost per request is cabi minus go.
func BenchmarkSubmitWait128(b *testing.B) {
	b.Run("memcpy", func(b *testing.B) {
		buf := mem.MustAlloc(2 * benchReqs * benchSize)
		defer mem.Free(buf)
		b.SetBytes(benchReqs * benchSize)
		for b.Loop() {
			for i := 0; i < benchReqs; i++ {
				copy(buf[(benchReqs+i)*benchSize:(benchReqs+i+1)*benchSize], buf[i*benchSize:(i+1)*benchSize])
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*benchReqs), "ns/req")
	})
	b.Run("go", func(b *testing.B) {
		e, err := engine.New(engine.Config{ListenAddr: "127.0.0.1:0", Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			b.Fatal(err)
		}
		defer e.Close()
		buf := mem.MustAlloc(2 * benchReqs * benchSize)
		defer mem.Free(buf)
		base := mem.Addr(buf)
		if err := e.RegisterMemory(base, uint64(len(buf)), "cpu", true); err != nil {
			b.Fatal(err)
		}
		seg, err := e.OpenSegment(e.Name())
		if err != nil {
			b.Fatal(err)
		}
		reqs := make([]engine.Request, benchReqs)
		for i := range reqs {
			reqs[i] = engine.Request{Op: engine.Write, Local: base + uint64(i*benchSize), Segment: seg,
				Remote: base + uint64((benchReqs+i)*benchSize), Length: benchSize}
		}
		b.SetBytes(benchReqs * benchSize)
		for b.Loop() {
			bt, err := e.AllocateBatch(benchReqs)
			if err != nil {
				b.Fatal(err)
			}
			if err := bt.Submit(reqs...); err != nil {
				b.Fatal(err)
			}
			if st, err := bt.Wait(-1); err != nil || st.State != engine.Completed {
				b.Fatal(st, err)
			}
			if err := bt.Free(); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*benchReqs), "ns/req")
	})
	b.Run("cabi", func(b *testing.B) {
		cc, err := exec.LookPath("cc")
		if err != nil {
			b.Skip("no C compiler (cc) on PATH")
		}
		lib := buildLib(b)
		bin := filepath.Join(filepath.Dir(lib), "bench_submit")
		build := exec.Command(cc, "-O2", "-std=c11", "-D_GNU_SOURCE", "-I../include", "-I../tests/c",
			"../tests/c/bench_submit.c", "-o", bin, "-L"+filepath.Dir(lib), "-lte", "-Wl,-rpath,"+filepath.Dir(lib))
		if out, err := build.CombinedOutput(); err != nil {
			b.Fatalf("compiling bench_submit: %v\n%s", err, out)
		}
		out, err := exec.Command(bin, strconv.Itoa(b.N)).CombinedOutput()
		if err != nil {
			b.Fatalf("bench_submit: %v\n%s", err, out)
		}
		vals := map[string]float64{}
		sc := bufio.NewScanner(bytes.NewReader(out))
		for sc.Scan() {
			if f := strings.Fields(sc.Text()); len(f) == 2 {
				if v, err := strconv.ParseFloat(f[1], 64); err == nil {
					vals[f[0]] = v
				}
			}
		}
		perReq, ok := vals["ns_per_request"]
		if !ok {
			b.Fatalf("bench_submit printed no ns_per_request:\n%s", out)
		}
		// The process's own timing replaces the wall time of running it.
		b.ReportMetric(vals["ns_per_batch"], "ns/op")
		b.ReportMetric(perReq, "ns/req")
		b.ReportMetric(vals["ns_per_call"], "ns/call")
	})
}
