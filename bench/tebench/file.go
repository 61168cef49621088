package tebench

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os/exec"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/tecache/te/engine"
	"github.com/tecache/te/engine/transport"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/sys/mem"
)

// FileOptions configure a local file benchmark (te-bench file): requests of
// Block bytes between memory and a registered file, Depth of them in flight,
// sequential or random, for Duration; with Fio, fio runs the same workload
// on the same file (io_uring engine, one job, the same O_DIRECT setting) and
// the result carries the ratio.
type FileOptions struct {
	Path     string
	Size     uint64 // bytes of the file range (created and extended if needed)
	Op       string // read or write
	Block    uint64
	Depth    int
	Random   bool
	Direct   bool
	Duration time.Duration
	Fio      bool
	Params   map[string]string // engine parameters (file.pool, file.depth, ...)
}

// FileResult is one file run.
type FileResult struct {
	Op        string  `json:"op"`
	Pattern   string  `json:"pattern"` // seq or rand
	Block     uint64  `json:"block"`
	Depth     int     `json:"depth"`
	Direct    bool    `json:"direct"`
	Mode      string  `json:"mode"` // io_uring or pool
	Path      string  `json:"path"`
	Size      uint64  `json:"size"`
	DurationS float64 `json:"duration_s"`
	Bytes     uint64  `json:"bytes"`
	Requests  uint64  `json:"requests"`
	GBps      float64 `json:"gbps"`
	IOPS      float64 `json:"iops"`
	P50us     float64 `json:"p50_us"`
	P99us     float64 `json:"p99_us"`
	// BufferedIOs counts I/Os that could not go O_DIRECT (misaligned, or
	// a file system without it).
	BufferedIOs uint64  `json:"buffered_ios"`
	FixedIOs    uint64  `json:"fixed_ios"` // on registered (fixed) buffers
	FioGBps     float64 `json:"fio_gbps,omitempty"`
	RatioFio    float64 `json:"ratio_fio,omitempty"`
	Machine     Machine `json:"machine"`
}

func (r FileResult) String() string {
	fio := ""
	if r.FioGBps > 0 {
		fio = fmt.Sprintf("  fio %.3f GB/s (%.3fx)", r.FioGBps, r.RatioFio)
	}
	return fmt.Sprintf("file %-5s %-4s block %-6s depth %-3d direct %-5v %s: %7.3f GB/s %9.0f IOPS  p50 %7.0fus p99 %7.0fus%s",
		r.Op, r.Pattern, FormatSize(r.Block), r.Depth, r.Direct, r.Mode, r.GBps, r.IOPS, r.P50us, r.P99us, fio)
}

// JSON returns r as one line of JSON.
func (r FileResult) JSON() string {
	b, _ := json.Marshal(r)
	return string(b)
}

// RunFile measures one file workload through an engine of this process.
func RunFile(ctx context.Context, o FileOptions) (FileResult, error) {
	if o.Block == 0 || o.Block > 64<<20 || o.Depth <= 0 || o.Depth > 1024 || o.Size < o.Block || o.Duration <= 0 {
		return FileResult{}, errs.New(errs.InvalidArgument, "te-bench file", "block %d, depth %d, size %d, duration %v",
			o.Block, o.Depth, o.Size, o.Duration)
	}
	if o.Op != "read" && o.Op != "write" {
		return FileResult{}, errs.New(errs.InvalidArgument, "te-bench file", "--op %q: want read or write", o.Op)
	}
	e, err := engine.New(engine.Config{ListenAddr: "127.0.0.1:0", Params: o.Params, TransferTimeout: time.Minute})
	if err != nil {
		return FileResult{}, err
	}
	defer e.Close()
	fa, err := e.RegisterFile(o.Path, 0, o.Size, engine.FileOptions{Remote: true, Create: true, NoDirect: !o.Direct})
	if err != nil {
		return FileResult{}, err
	}
	defer e.UnregisterMemory(fa)
	local, err := mem.Alloc(int(o.Block) * o.Depth)
	if err != nil {
		return FileResult{}, err
	}
	defer mem.Free(local)
	for i := range local {
		local[i] = byte(i*7 + i>>12)
	}
	if err := e.RegisterMemory(mem.Addr(local), uint64(len(local)), "cpu", false); err != nil {
		return FileResult{}, err
	}
	seg, err := e.OpenSegment(e.Name())
	if err != nil {
		return FileResult{}, err
	}
	op := engine.Read
	if o.Op == "write" {
		op = engine.Write
	}
	if op == engine.Read {
		// Reads need written blocks (a sparse file's holes read as zeros
		// without touching the disk).
		if err := layOut(e, seg, fa, o.Size, mem.Addr(local), o.Block*uint64(o.Depth)); err != nil {
			return FileResult{}, err
		}
	}
	blocks := o.Size / o.Block
	var next uint64
	var mu sync.Mutex
	pick := func(rng *rand.Rand) uint64 {
		if o.Random {
			return rng.Uint64N(blocks)
		}
		mu.Lock()
		defer mu.Unlock()
		b := next % blocks
		next++
		return b
	}
	// Depth goroutines, each with one request in flight: a closed loop of
	// Depth outstanding requests, as fio's iodepth.
	var (
		wg       sync.WaitGroup
		lats     []time.Duration
		firstErr error
		requests uint64
	)
	start := time.Now()
	stop := start.Add(o.Duration)
	for d := 0; d < o.Depth; d++ {
		wg.Add(1)
		go func(d int) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(d), 7))
			b, err := e.AllocateBatch(1)
			if err != nil {
				mu.Lock()
				firstErr = err
				mu.Unlock()
				return
			}
			defer b.Free()
			var my []time.Duration
			for time.Now().Before(stop) && ctx.Err() == nil {
				t0 := time.Now()
				err := b.Submit(engine.Request{Op: op, Local: mem.Addr(local) + uint64(d)*o.Block, Segment: seg,
					Remote: fa + pick(rng)*o.Block, Length: o.Block})
				if err == nil {
					var st engine.BatchStatus
					st, err = b.Wait(time.Minute)
					if err == nil && st.State != engine.Completed {
						err = st.Err
					}
				}
				if err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
					return
				}
				my = append(my, time.Since(t0))
				b.Reset()
			}
			mu.Lock()
			lats = append(lats, my...)
			requests += uint64(len(my))
			mu.Unlock()
		}(d)
	}
	wg.Wait()
	el := time.Since(start)
	if firstErr != nil {
		return FileResult{}, firstErr
	}
	pat := "seq"
	if o.Random {
		pat = "rand"
	}
	fs := e.TransportStats()["file"]
	mode := "pool"
	if fs["io_uring"] == 1 {
		mode = "io_uring"
	}
	r := FileResult{Op: o.Op, Pattern: pat, Block: o.Block, Depth: o.Depth, Direct: o.Direct, Mode: mode, Path: o.Path,
		Size: o.Size, DurationS: el.Seconds(), Requests: requests, Bytes: requests * o.Block, BufferedIOs: fs["buffered_ios"],
		FixedIOs: fs["fixed_ios"],
		Machine:  ThisMachine()}
	r.GBps = float64(r.Bytes) / el.Seconds() / 1e9
	r.IOPS = float64(requests) / el.Seconds()
	sort.Slice(lats, func(i, j int) bool { return lats[i] < lats[j] })
	r.P50us, r.P99us = pct(lats, 0.5), pct(lats, 0.99)
	if o.Fio {
		g, err := Fio(o)
		if err != nil {
			return r, err
		}
		r.FioGBps, r.RatioFio = g, r.GBps/g
	}
	return r, nil
}

// layOut writes the whole range once (reads then hit written blocks).
func layOut(e *engine.Engine, seg *engine.Segment, fa, size, local, chunk uint64) error {
	b, err := e.AllocateBatch(64)
	if err != nil {
		return err
	}
	defer b.Free()
	chunk = min(chunk, 1<<20)
	for off := uint64(0); off < size; {
		var rs []engine.Request
		for len(rs) < 64 && off < size {
			n := min(chunk, size-off)
			rs = append(rs, engine.Request{Op: engine.Write, Local: local, Segment: seg, Remote: fa + off, Length: n})
			off += n
		}
		if err := b.Submit(rs...); err != nil {
			return err
		}
		st, err := b.Wait(time.Minute)
		if err == nil && st.State != engine.Completed {
			err = st.Err
		}
		if err != nil {
			return err
		}
		b.Reset()
	}
	return nil
}

// Fio runs fio with o's workload on o's file for o's duration and returns
// its GB/s.
func Fio(o FileOptions) (float64, error) {
	fio, err := exec.LookPath("fio")
	if err != nil {
		return 0, errs.New(errs.NotSupported, "te-bench file", "--fio: fio is not installed")
	}
	rw := o.Op
	if o.Random {
		rw = "rand" + rw
	}
	direct := "0"
	if o.Direct {
		direct = "1"
	}
	args := []string{"--name=ref", "--filename=" + o.Path, "--rw=" + rw, "--bs=" + strconv.FormatUint(o.Block, 10),
		"--iodepth=" + strconv.Itoa(o.Depth), "--direct=" + direct, "--ioengine=io_uring", "--numjobs=1",
		"--size=" + strconv.FormatUint(o.Size, 10), "--time_based", "--runtime=" + strconv.FormatFloat(o.Duration.Seconds(), 'f', 3, 64) + "s",
		"--norandommap", "--randrepeat=0", "--output-format=json"}
	out, err := exec.Command(fio, args...).Output()
	if err != nil {
		return 0, errs.Wrap(errs.Internal, "te-bench file", err, "fio %v", args)
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
		return 0, errs.New(errs.Internal, "te-bench file", "fio output not understood")
	}
	bw := r.Jobs[0].Read.BwBytes + r.Jobs[0].Write.BwBytes
	if bw <= 0 {
		return 0, errs.New(errs.Internal, "te-bench file", "fio reported no bandwidth")
	}
	return bw / 1e9, nil
}

func mainFile(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("te-bench file", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		o                        = FileOptions{Size: 1 << 30, Duration: 5 * time.Second}
		ops, blocks, depths, pat string
		direct                   string
		json, pool, fixed        bool
	)
	fs.StringVar(&o.Path, "path", "", "the file (created and extended to --size if needed)")
	fs.Var(sizeFlag{&o.Size}, "size", "bytes of the file range")
	fs.StringVar(&ops, "op", "read", "read, write or a list")
	fs.StringVar(&blocks, "block", "1MiB", "request size or a list")
	fs.StringVar(&depths, "depth", "32", "requests in flight or a list")
	fs.StringVar(&pat, "pattern", "seq", "seq, rand or a list")
	fs.StringVar(&direct, "direct", "on", "on (O_DIRECT where the file system takes it), off, or on,off")
	fs.Var(durFlag{&o.Duration}, "duration", "measured time per run")
	fs.BoolVar(&o.Fio, "fio", false, "also run fio on the same file with the same workload and report the ratio")
	fs.BoolVar(&pool, "pool", false, "pread/pwrite threads instead of io_uring (file.pool=1)")
	fs.BoolVar(&fixed, "fixed", false, "register the memory with the rings as fixed buffers (file.fixed=1)")
	fs.BoolVar(&json, "json", false, "print one JSON object per run")
	if err := fs.Parse(args); err != nil {
		return errs.Wrap(errs.InvalidArgument, "te-bench", err, "flags")
	}
	if o.Path == "" {
		return errs.New(errs.InvalidArgument, "te-bench file", "--path is required")
	}
	o.Params = map[string]string{}
	if pool {
		o.Params["file.pool"] = "1"
	}
	if fixed {
		o.Params["file.fixed"] = "1"
	}
	if !json {
		fmt.Fprintf(stdout, "machine: %s\n", ThisMachine())
	}
	for _, op := range list(ops) {
		for _, bs := range list(blocks) {
			block, err := transport.ParseSize(bs)
			if err != nil {
				return err
			}
			for _, ds := range list(depths) {
				depth, err := strconv.Atoi(ds)
				if err != nil {
					return errs.New(errs.InvalidArgument, "te-bench file", "--depth %q", ds)
				}
				for _, p := range list(pat) {
					if p != "seq" && p != "rand" {
						return errs.New(errs.InvalidArgument, "te-bench file", "--pattern %q: want seq or rand", p)
					}
					for _, dr := range list(direct) {
						if dr != "on" && dr != "off" {
							return errs.New(errs.InvalidArgument, "te-bench file", "--direct %q: want on or off", dr)
						}
						r := o
						r.Op, r.Block, r.Depth, r.Random, r.Direct = op, block, depth, p == "rand", dr == "on"
						res, err := RunFile(ctx, r)
						if err != nil {
							return err
						}
						if json {
							fmt.Fprintln(stdout, res.JSON())
						} else {
							fmt.Fprintln(stdout, res)
						}
						if ctx.Err() != nil {
							return ctx.Err()
						}
					}
				}
			}
		}
	}
	return nil
}
