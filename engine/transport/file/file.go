package file

import (
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/tecache/te/engine/segment"
	"github.com/tecache/te/engine/transport"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/fileio"
	"github.com/tecache/te/internal/sys/cufile"
	"github.com/tecache/te/internal/sys/gpu"
)

// Name is the transport's name.
const Name = "file"

// EnvPool, set to 1, makes every engine's file I/O use pread/pwrite threads
// instead of io_uring (for tests, and kernels where io_uring misbehaves).
const EnvPool = "TE_FILE_POOL"

func init() {
	transport.RegisterFactory(Name, func() (transport.Transport, error) { return New(), nil })
}

// owners maps an engine instance to its transport, for every engine of this
// process with the file transport: requests to a storage region of any of
// them are served by the owner's executor and checked by its registry.
var (
	omu    sync.RWMutex
	owners = map[string]*Transport{}
)

// Transport is the file transport.
type Transport struct {
	h        transport.Host
	reg      *segment.Registry
	instance string
	cfg      fileio.Config

	xmu sync.Mutex
	x   *fileio.Executor // started on first use
	xer error
	// fresh: the executor just started, and the regions registered
	// before it still have to become its fixed buffers.
	fresh bool

	// fixed (file.fixed=1): host memory regions registered with the
	// engine become the rings' registered buffers.
	fixed  bool
	fmu    sync.Mutex // serialises set changes; held across SetFixed
	fixSet map[*segment.Region]struct{}

	closed atomic.Bool
	gpu    gpuPool
	wg     sync.WaitGroup // GPU staging goroutines
}

// New returns an unstarted transport.
func New() *Transport { return &Transport{} }

// Name returns "file".
func (t *Transport) Name() string { return Name }

// Caps declares the transport's reach: storage regions of engines in this
// process, from host memory (and GPU memory, staged, when a GPU runtime
// loads).
func (t *Transport) Caps() transport.Caps {
	return transport.Caps{SameProcess: true, HostMemory: true, GPUMemory: t.gpu.available(), FileMemory: true, StorageOnly: true,
		Windows: true, Rank: 5}
}

// Start reads the parameters; the executor starts on first use, so an engine
// that never registers a file holds no ring or thread for it.
func (t *Transport) Start(h transport.Host) error {
	cfg, err := parseConfig(h)
	if err != nil {
		return err
	}
	t.h, t.reg, t.instance, t.cfg = h, h.Registry(), h.Instance(), cfg
	if v, ok := h.Param("file.fixed"); ok {
		switch strings.TrimSpace(v) {
		case "1", "true":
			t.fixed, t.fixSet = true, map[*segment.Region]struct{}{}
		case "0", "false":
		default:
			return errs.New(errs.InvalidArgument, "file", "parameter file.fixed=%q: want 0 or 1", v)
		}
	}
	omu.Lock()
	owners[t.instance] = t
	omu.Unlock()
	return nil
}

func parseConfig(h transport.Host) (fileio.Config, error) {
	cfg := fileio.Config{Logf: h.Logf}
	bad := func(key, v, why string) error {
		return errs.New(errs.InvalidArgument, "file", "parameter %s=%q: %s", key, v, why)
	}
	for _, k := range []struct {
		key      string
		lo, hi   int
		dst      *int
		unitless bool
	}{{"file.workers", 1, fileio.MaxWorkers, &cfg.Workers, true}, {"file.depth", 1, fileio.MaxDepth, &cfg.Depth, true}} {
		if v, ok := h.Param(k.key); ok {
			n, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil || n < k.lo || n > k.hi {
				return cfg, bad(k.key, v, "want an integer in ["+strconv.Itoa(k.lo)+", "+strconv.Itoa(k.hi)+"]")
			}
			*k.dst = n
		}
	}
	if v, ok := h.Param("file.chunk"); ok {
		n, err := transport.ParseSize(v)
		if err != nil || n < fileio.MinChunk || n > fileio.MaxChunk || n%4096 != 0 {
			return cfg, bad("file.chunk", v, "want a multiple of 4KiB from 4KiB to 64MiB")
		}
		cfg.Chunk = n
	}
	if v, ok := h.Param("file.staging"); ok {
		n, err := transport.ParseSize(v)
		if err != nil || n > 1<<30 {
			return cfg, bad("file.staging", v, "want a size up to 1GiB")
		}
		cfg.Staging = int64(n)
		if n == 0 {
			cfg.Staging = -1
		}
	}
	pool := os.Getenv(EnvPool)
	if v, ok := h.Param("file.pool"); ok {
		pool = v
	}
	switch strings.ToLower(strings.TrimSpace(pool)) {
	case "", "0", "false", "no":
	case "1", "true", "yes":
		cfg.ForcePool = true
	default:
		return cfg, bad("file.pool", pool, "want 0 or 1")
	}
	return cfg, nil
}

// executor returns the executor, starting it on first use.
func (t *Transport) executor() (*fileio.Executor, error) {
	t.xmu.Lock()
	defer t.xmu.Unlock()
	if t.closed.Load() {
		return nil, errs.New(errs.Closed, "file", "transport closed")
	}
	if t.x == nil && t.xer == nil {
		t.x, t.xer = fileio.New(t.cfg)
		t.fresh = t.xer == nil
	}
	return t.x, t.xer
}

// applyFixed hands the current set of regions to the executor (if it runs).
// A refusal is logged: I/O stays plain and correct.
func (t *Transport) applyFixed() {
	t.fmu.Lock()
	defer t.fmu.Unlock()
	t.xmu.Lock()
	x := t.x
	t.xmu.Unlock()
	if x == nil || t.closed.Load() {
		return
	}
	set := make([][2]uint64, 0, len(t.fixSet))
	for r := range t.fixSet {
		set = append(set, [2]uint64{r.Addr, r.Length})
	}
	if err := x.SetFixed(set); err != nil && errs.CodeOf(err) != errs.Closed {
		t.h.Logf("te: file: registered memory is not used as io_uring fixed buffers: %v", err)
	}
}

// ExecStats returns the executor's counters (zero before the first file).
func (t *Transport) ExecStats() fileio.Stats {
	t.xmu.Lock()
	x := t.x
	t.xmu.Unlock()
	if x == nil {
		return fileio.Stats{}
	}
	return x.Stats()
}

// Stats returns the executor's counters for Engine.TransportStats:
// io_uring is 1 when the rings run (0: the pread/pwrite pool, or no file
// registered yet), buffered_ios counts I/Os that could not go O_DIRECT.
func (t *Transport) Stats() map[string]uint64 {
	s := t.ExecStats()
	m := map[string]uint64{"ops": s.Ops, "read_bytes": s.ReadBytes, "write_bytes": s.WriteBytes, "direct_ios": s.DirectIOs,
		"buffered_ios": s.BufferedIOs, "fixed_ios": s.FixedIOs, "split": s.Split, "short": s.Short, "failed": s.Failed,
		"canceled": s.Canceled, "io_uring": 0}
	if s.Mode == "io_uring" {
		m["io_uring"] = 1
	}
	if _, err := cufile.Load(); err == nil {
		m["gds_available"] = 1 // loaded, not used yet (package doc)
	}
	return m
}

// OpenFile opens a file range for a storage region (transport.FileOpener).
func (t *Transport) OpenFile(spec transport.FileSpec) (segment.Storage, uint64, error) {
	x, err := t.executor()
	if err != nil {
		return nil, 0, err
	}
	t.xmu.Lock()
	fresh := t.fresh
	t.fresh = false
	t.xmu.Unlock()
	if fresh && t.fixed {
		t.applyFixed()
	}
	o := fileio.OpenOptions{Create: spec.Create, ReadOnly: spec.ReadOnly, NoDirect: spec.NoDirect}
	var f *fileio.File
	if spec.Path != "" {
		f, err = x.Open(spec.Path, spec.Offset, spec.Length, o)
	} else {
		f, err = x.OpenFD(spec.FD, spec.Offset, spec.Length, o)
	}
	if err != nil {
		return nil, 0, err
	}
	return &Storage{x: x, f: f}, f.Size(), nil
}

// Describe adds nothing: the instance id identifies the engine.
func (t *Transport) Describe(*segment.Desc) {}

// Register needs no per-transport state for a file (opened by OpenFile).
// With file.fixed=1 host memory becomes the rings' registered buffers.
func (t *Transport) Register(r *segment.Region) error {
	if !t.fixed || r.Storage != nil || r.Location.Kind != "cpu" {
		return nil
	}
	t.fmu.Lock()
	t.fixSet[r] = struct{}{}
	t.fmu.Unlock()
	t.applyFixed()
	return nil
}

// Unregister drops host memory from the rings' registered buffers (and
// returns once no ring holds it); a file is closed by the engine.
func (t *Transport) Unregister(r *segment.Region) error {
	if !t.fixed || r.Storage != nil {
		return nil
	}
	t.fmu.Lock()
	_, ok := t.fixSet[r]
	delete(t.fixSet, r)
	t.fmu.Unlock()
	if ok {
		t.applyFixed()
	}
	return nil
}

// Reachable reports whether the peer is an engine of this process.
func (t *Transport) Reachable(d *segment.Desc) error {
	omu.RLock()
	_, ok := owners[d.Instance]
	omu.RUnlock()
	if !ok {
		return errs.New(errs.TransportUnavailable, "file", "segment %q is not in this process (its files are reached over tcp)", d.Name)
	}
	return nil
}

// Quiesce has nothing to cut: the owner's accesses end with their I/O,
// which the executor never leaves running.
func (t *Transport) Quiesce(*segment.Region) error { return nil }

// Submit starts each request on the owner's executor. A request whose
// target is not a storage region, or that the owner refuses, completes at
// once with the reason.
func (t *Transport) Submit(reqs []transport.Request) {
	// Runs of requests to one owner go to its executor in one Submit.
	var ops []*fileio.Op
	for i := range reqs {
		r := &reqs[i]
		op, err := t.prepare(r)
		if err != nil {
			r.Complete(err)
			continue
		}
		if op == nil {
			continue // GPU memory: staged by its own goroutine
		}
		if len(ops) > 0 && ops[0].File.Executor() != op.File.Executor() {
			ops[0].File.Executor().Submit(ops...)
			ops = nil
		}
		ops = append(ops, op)
	}
	if len(ops) > 0 {
		ops[0].File.Executor().Submit(ops...)
	}
}

// prepare checks r with the owner's registry and builds its op; the target
// region stays acquired until the op completes.
func (t *Transport) prepare(r *transport.Request) (*fileio.Op, error) {
	if t.closed.Load() {
		return nil, errs.New(errs.Closed, "file", "transport closed")
	}
	omu.RLock()
	o := owners[r.Peer.Instance]
	omu.RUnlock()
	if o == nil {
		return nil, errs.New(errs.PeerUnreachable, "file", "segment %q has closed", r.Peer.Name)
	}
	// Another engine of this process is a peer like any other: it reaches
	// published files only; the owner reaches its private ones too. In
	// one process the owner knows the accessing engine for certain.
	region, err := o.reg.Acquire(r.Remote, r.Length, r.Key, o != t,
		segment.Caller{Name: t.h.SegmentName(), Instance: t.h.Instance(), Known: true})
	if err != nil {
		return nil, err
	}
	st, ok := segment.StorageOf(region).(*Storage)
	if !ok {
		region.Release()
		return nil, errs.New(errs.NotSupported, "file", "[%#x,+%d) of %q is memory, not a file: another transport moves it",
			r.Remote, r.Length, r.Peer.Name)
	}
	base := region.Addr
	if p := region.Parent(); p != nil {
		base = p.Addr
	}
	off := r.Remote - base
	if gpu.IsDevice(r.Region.Location.Kind) {
		if err := t.startGPU(r, st, off, region); err != nil {
			region.Release()
			return nil, err
		}
		return nil, nil
	}
	if segment.StorageOf(r.Region) != nil {
		region.Release()
		return nil, errs.New(errs.NotSupported, "file", "the local side of a request must be memory, not a file")
	}
	// Ctx identifies the slot for Cancel; completion goes through the
	// ticket, never through the slot.
	tk := r.Ticket()
	op := &fileio.Op{Write: r.Op == transport.Write, File: st.f, Off: off, Addr: r.Local, Len: r.Length, Ctx: r,
		Done: func(op *fileio.Op, err error) {
			region.Release()
			tk.Complete(err)
		}}
	r.Priv = op
	return op, nil
}

// Cancel asks the executors to end reqs; each completes (Canceled, or its
// real outcome) once its I/O is out of the kernel.
func (t *Transport) Cancel(reqs []*transport.Request) {
	for _, r := range reqs {
		switch p := r.Priv.(type) {
		case *fileio.Op:
			if p.Ctx == r {
				p.File.Executor().Cancel(p)
			}
		case *gpuJob:
			p.canceled.Store(true)
		}
	}
}

// Close waits for GPU staging jobs and stops the executor (the engine has
// completed or canceled every request by then; storage regions close with
// their unregistration).
func (t *Transport) Close() error {
	omu.Lock()
	if owners[t.instance] == t {
		delete(owners, t.instance)
	}
	omu.Unlock()
	t.xmu.Lock()
	t.closed.Store(true)
	x := t.x
	t.xmu.Unlock()
	t.wg.Wait()
	t.gpu.close()
	if x != nil {
		x.Close()
	}
	return nil
}

// Storage is a registered file range (segment.Storage) on an executor.
type Storage struct {
	x *fileio.Executor
	f *fileio.File
}

// File is the open file range.
func (s *Storage) File() *fileio.File { return s.f }

// Move starts one read or write of the range (segment.Storage).
func (s *Storage) Move(write bool, off, buf, n uint64, done func(error)) {
	s.x.Submit(&fileio.Op{Write: write, File: s.f, Off: off, Addr: buf, Len: n, Done: func(_ *fileio.Op, err error) { done(err) }})
}

// Stage lends a staging buffer (segment.Storage).
func (s *Storage) Stage(abort <-chan struct{}) (uint64, bool) { return s.x.TakeStage(abort) }

// Unstage returns a staging buffer.
func (s *Storage) Unstage(addr uint64) { s.x.PutStage(addr) }

// StageSize is the size of a staging buffer.
func (s *Storage) StageSize() uint64 { return s.x.Chunk() }

// Close waits for the file's I/O in flight and closes it.
func (s *Storage) Close() error { return s.f.Close() }

// Align is the direct-I/O alignment of memory addresses and of file offsets
// and lengths (1, 1 for a file without O_DIRECT), published with the buffer.
func (s *Storage) Align() (memAlign, offAlign uint64) { return s.f.Align() }

// StageCount is the number of staging buffers the storage's executor has.
func (s *Storage) StageCount() int { return s.x.StageCount() }
