package kvcache

import (
	"time"

	"github.com/tecache/te/engine"
	"github.com/tecache/te/internal/errs"
)

// FileLayout returns pool's layout as it lies in a file whose registered
// range starts at address base (Engine.RegisterFile's result, this engine's
// or a storage node's): the same format, shape and block geometry, with
// the layers' tensors packed one after another in layer order (K before V
// where they are separate). Block b of layer l is then at the same place
// relative to its tensor in memory and in the file, so NewPlan between the
// two is a plain block copy that coalesces runs of blocks, and any block of
// the pool can be offloaded to any block of the file. size is the bytes the
// file's range needs.
func FileLayout(pool *Layout, base uint64) (file *Layout, size uint64, err error) {
	if pool == nil {
		return nil, 0, invalid("nil layout")
	}
	lb, err := pool.LayerBytes()
	if err != nil {
		return nil, 0, err
	}
	f := *pool
	f.Bases, f.KBases, f.VBases = nil, nil, nil
	n := pool.NumLayers()
	if n == 0 {
		return nil, 0, invalid("%s layout has no layers", pool.Format)
	}
	total, ok := checkedMul(uint64(n), lb)
	if !ok || base+total < base {
		return nil, 0, invalid("a file of %d layers of %d bytes overflows", n, lb)
	}
	if len(pool.KBases) > 0 {
		half := lb / 2
		for i := 0; i < n; i++ {
			f.KBases = append(f.KBases, base+uint64(i)*lb)
			f.VBases = append(f.VBases, base+uint64(i)*lb+half)
		}
	} else {
		for i := 0; i < n; i++ {
			f.Bases = append(f.Bases, base+uint64(i)*lb)
		}
	}
	if err := f.Validate(); err != nil {
		return nil, 0, err
	}
	return &f, total, nil
}

// FileTier is a file laid out like a KV pool (FileLayout), registered with
// an engine as a storage buffer: Offload copies blocks of the pool into it,
// Onboard copies them back, with the plans and coalescing of any KV
// transfer. The file may be this engine's (NewFileTier) or a storage
// node's, reached over tcp (OpenFileTier).
type FileTier struct {
	e     *engine.Engine
	seg   *engine.Segment
	file  *Layout
	addr  uint64
	size  uint64
	owned bool // registered by NewFileTier: Close unregisters it
}

// NewFileTier registers a file at path sized and laid out for pool (created
// if missing) with e, as a published storage buffer, and opens e's own
// segment to reach it.
func NewFileTier(e *engine.Engine, path string, pool *Layout, o engine.FileOptions) (*FileTier, error) {
	if e == nil {
		return nil, invalid("nil engine")
	}
	_, size, err := FileLayout(pool, 1<<12) // sizes only: the real base comes next
	if err != nil {
		return nil, err
	}
	o.Remote, o.Create = true, true
	addr, err := e.RegisterFile(path, 0, size, o)
	if err != nil {
		return nil, err
	}
	t, err := OpenFileTier(e, e.Name(), pool, addr)
	if err != nil {
		e.UnregisterMemory(addr)
		return nil, err
	}
	t.owned = true
	return t, nil
}

// OpenFileTier reaches a file laid out for pool that segment holds at addr
// (a storage node's RegisterFile result): Offload and Onboard then move
// blocks between this engine's pool and that file.
func OpenFileTier(e *engine.Engine, segment string, pool *Layout, addr uint64) (*FileTier, error) {
	if e == nil {
		return nil, invalid("nil engine")
	}
	file, size, err := FileLayout(pool, addr)
	if err != nil {
		return nil, err
	}
	seg, err := e.OpenSegment(segment)
	if err != nil {
		return nil, err
	}
	return &FileTier{e: e, seg: seg, file: file, addr: addr, size: size}, nil
}

// Layout is the file's layout (its addresses are the file's).
func (t *FileTier) Layout() *Layout { return t.file }

// Addr and Size are the file range's address and length.
func (t *FileTier) Addr() uint64 { return t.addr }

// Size is the length of the file's range.
func (t *FileTier) Size() uint64 { return t.size }

// Offload starts copying blocks poolBlocks of pool (this engine's memory)
// into blocks fileBlocks of the file, layers in r (the zero LayerRange: all
// of pool's), and returns the batch to wait on; free it after.
func (t *FileTier) Offload(pool *Layout, poolBlocks, fileBlocks []int, r LayerRange) (*engine.Batch, error) {
	p, err := NewPlan(pool, t.file, poolBlocks, fileBlocks, r)
	if err != nil {
		return nil, err
	}
	return t.run(p, engine.Write)
}

// Onboard starts copying blocks fileBlocks of the file into blocks
// poolBlocks of pool, and returns the batch to wait on.
func (t *FileTier) Onboard(pool *Layout, fileBlocks, poolBlocks []int, r LayerRange) (*engine.Batch, error) {
	p, err := NewPlan(t.file, pool, fileBlocks, poolBlocks, r)
	if err != nil {
		return nil, err
	}
	return t.run(p, engine.Read)
}

func (t *FileTier) run(p *Plan, op engine.Opcode) (*engine.Batch, error) {
	n := len(p.Transfers())
	if n == 0 {
		return nil, errs.New(errs.InvalidArgument, "kvcache file tier", "nothing to move")
	}
	b, err := t.e.AllocateBatch(n)
	if err != nil {
		return nil, err
	}
	if err := Submit(b, t.seg, p, op); err != nil {
		b.Free()
		return nil, err
	}
	return b, nil
}

// WaitAndFree waits for a batch from Offload or Onboard, frees it, and returns
// the first task's error if one failed (errs.NoSpace for a full disk, IO
// for a truncated file). A batch still running after timeout is left for
// the caller (returned error Timeout).
func WaitAndFree(b *engine.Batch, timeout time.Duration) error {
	st, err := b.Wait(timeout)
	if err != nil {
		return err
	}
	b.Free()
	if st.State != engine.Completed {
		if st.Err != nil {
			return st.Err
		}
		return errs.New(errs.Internal, "kvcache file tier", "batch ended %s", st.State)
	}
	return nil
}

// Close closes the tier's segment and, for a tier NewFileTier registered,
// unregisters the file (waiting for its I/O in flight).
func (t *FileTier) Close() error {
	err := t.e.CloseSegment(t.seg)
	if t.owned {
		if uerr := t.e.UnregisterMemory(t.addr); uerr != nil {
			return uerr
		}
	}
	return err
}
