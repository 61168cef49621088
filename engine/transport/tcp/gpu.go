package tcp

import (
	"bufio"
	"io"
	"net"
	"sync"

	"github.com/tecache/te/engine/segment"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/session"
	"github.com/tecache/te/internal/sys/gpu"
)

// GPU memory over tcp. The socket can only read and write host memory, and
// the CPU must never touch device memory, so device payloads go through
// rings of pinned host chunks (gpu.Stager, over the runtime's interface): a device payload is copied to
// the host chunk by chunk on a stream while earlier chunks are on the wire,
// and a payload arriving for device memory is read into one chunk while the
// previous chunk is copied to the device. The wire format does not change:
// either side stages only its own memory, so a host-to-GPU or GPU-to-GPU
// transfer looks like any other to the peer.
//
// Each goroutine that moves device memory (a connection's writer or reader,
// on either side) holds one ring per device, taken lazily from the
// transport's pool on its first device payload and returned when it exits,
// so a reconnect reuses the rings; Close frees them. The runtime is the
// one the region's location names ("cuda:0", "hip:0"), through gpu.Driver.

// gpuLoad is gpu.Load, replaceable in tests.
var gpuLoad = gpu.Load

// devLoc is a device of a runtime; the zero value is host memory.
type devLoc struct {
	kind string
	dev  int
}

func (d devLoc) device() bool { return d.kind != "" }

// devOf is the device of a device region.
func devOf(r *segment.Region) devLoc { return devLoc{r.Location.Kind, r.Location.Index} }

// driverFor loads the runtime of device memory of kind; without it the
// memory cannot be moved (NotSupported).
func driverFor(kind string) (gpu.Driver, error) {
	d, known, err := gpuLoad(kind)
	if !known {
		return nil, errs.New(errs.NotSupported, "tcp", "no %s runtime is built in", kind)
	}
	if err != nil {
		return nil, errs.Wrap(errs.NotSupported, "tcp", err, "%s memory needs the %s runtime", kind, kind)
	}
	return d, nil
}

// Limits and default of tcp.gpu_staging: pinned host memory per connection,
// half for its sending and half for its receiving goroutine.
const (
	DefaultGPUStaging = 4 << 20
	MinGPUStaging     = 64 << 10
	MaxGPUStaging     = 1 << 30
	maxStageDepth     = 16
)

// gpuPool holds the rings not in use and their geometry.
type gpuPool struct {
	chunk uint64
	depth int
	mu    sync.Mutex
	rings map[string]*gpu.StagerPool // by runtime
}

// pool returns the rings of runtime kind.
func (g *gpuPool) pool(kind string) *gpu.StagerPool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.rings == nil {
		g.rings = map[string]*gpu.StagerPool{}
	}
	p := g.rings[kind]
	if p == nil {
		p = &gpu.StagerPool{}
		g.rings[kind] = p
	}
	return p
}

// setGeometry derives the rings from the options: chunks of at most a
// quarter slice, so a slice's payload is cut into several chunks that
// overlap each other, and as many as half the staging budget holds.
func (g *gpuPool) setGeometry(o Options) {
	ring := o.GPUStaging / 2
	chunk := min(ring/2, o.Slice/4) &^ (4<<10 - 1)
	chunk = max(chunk, 4<<10)
	g.chunk = chunk
	g.depth = int(max(2, min(ring/chunk, maxStageDepth)))
}

func (t *Transport) takeStager(d devLoc) (*gpu.Stager, error) {
	g := &t.gpu
	return g.pool(d.kind).Take(d.dev, func() (*gpu.Stager, error) {
		drv, err := driverFor(d.kind)
		if err != nil {
			return nil, err
		}
		return gpu.NewStager(drv, d.dev, g.chunk, g.depth)
	})
}

// putStager returns a ring to the pool once its copies have ended; a ring
// whose copies failed, or one returned after Close, is freed.
func (t *Transport) putStager(d devLoc, s *gpu.Stager) {
	ok := true
	for i := 0; i < s.Depth(); i++ {
		if s.Wait(i) != nil {
			ok = false
		}
	}
	t.gpu.pool(d.kind).Put(d.dev, s, ok)
}

// closeGPU frees the pooled rings; called by Close once every goroutine has
// returned its own.
func (t *Transport) closeGPU() {
	g := &t.gpu
	g.mu.Lock()
	pools := g.rings
	g.mu.Unlock()
	for _, p := range pools {
		p.Close()
	}
}

// DeviceMemory implements transport.DeviceMover: tcp moves GPU memory for
// every peer it reaches, staging its own side through host memory; local
// device memory needs its runtime here. A target without the runtime cannot
// hold device buffers (registration refuses them), and refuses them if
// asked.
func (t *Transport) DeviceMemory(d *segment.Desc, buf *segment.BufferDesc, local *segment.Region) bool {
	if t.Reachable(d) != nil {
		return false
	}
	if isDevice(local) {
		_, err := driverFor(local.Location.Kind)
		return err == nil
	}
	return true
}

// isDevice reports whether a region is device memory.
func isDevice(r *segment.Region) bool { return r != nil && gpu.IsDevice(r.Location.Kind) }

// devPiece is a device payload in a writev list: it goes right before
// bufs[at].
type devPiece struct {
	at      int
	dev     devLoc
	addr, n uint64
}

// stageChunk is one chunk of a device payload on its way to the socket.
type stageChunk struct {
	s       *gpu.Stager
	piece   int
	addr, n uint64
}

// stage is the rings of one goroutine, by device ordinal.
type stage struct {
	t       *Transport
	rings   map[devLoc]*gpu.Stager
	chunks  []stageChunk
	out     net.Buffers
	scratch []byte
}

func (t *Transport) newStage() *stage { return &stage{t: t} }

func (st *stage) get(dev devLoc) (*gpu.Stager, error) {
	if s := st.rings[dev]; s != nil {
		return s, nil
	}
	s, err := st.t.takeStager(dev)
	if err != nil {
		return nil, err
	}
	if st.rings == nil {
		st.rings = map[devLoc]*gpu.Stager{}
	}
	st.rings[dev] = s
	return s, nil
}

// release returns the rings (after their copies ended) to the pool.
func (st *stage) release() {
	for dev, s := range st.rings {
		st.t.putStager(dev, s)
	}
	st.rings = nil
}

// write sends bufs with the device payloads devs inserted, each through the
// rings: chunk k+depth is copied to the host while chunk k is on the wire
// (and chunks of the next payloads are already copied while this one is
// sent). It returns how many bytes reached the socket. On any error the
// connection cannot be trusted; write returns only after every copy it
// started ended, so the caller may release the memory.
func (st *stage) write(w io.Writer, bufs net.Buffers, devs []devPiece) (sent int64, err error) {
	chunks := st.chunks[:0]
	for i, p := range devs {
		s, err := st.get(p.dev)
		if err != nil {
			return 0, err
		}
		cs := s.ChunkSize()
		for off := uint64(0); off < p.n; off += cs {
			chunks = append(chunks, stageChunk{s: s, piece: i, addr: p.addr + off, n: min(cs, p.n-off)})
		}
	}
	st.chunks = chunks
	defer clear(chunks)
	depth := st.t.gpu.depth
	started := 0 // chunks whose copy was started
	waited := 0  // chunks whose copy was waited for
	defer func() {
		for k := waited; k < started; k++ {
			chunks[k].s.Wait(k % depth)
		}
	}()
	startUpTo := func(n int) error {
		for ; started < min(n, len(chunks)); started++ {
			c := chunks[started]
			if err := c.s.ToHost(started%depth, c.addr, c.n); err != nil {
				return err
			}
		}
		return nil
	}
	if err := startUpTo(depth); err != nil {
		return 0, err
	}
	out := st.out[:0]
	defer func() { clear(out); st.out = out[:0] }()
	bi := 0
	for k, c := range chunks {
		if at := devs[c.piece].at; at > bi {
			out = append(out, bufs[bi:at]...)
			bi = at
		}
		waited = k + 1
		if err := c.s.Wait(k % depth); err != nil {
			return sent, err
		}
		out = append(out, c.s.Chunk(k % depth)[:c.n])
		wb := out
		n, err := wb.WriteTo(w)
		sent += n
		if err != nil {
			return sent, errs.Wrap(errs.PeerUnreachable, "tcp", err, "send")
		}
		clear(out)
		out = out[:0]
		if err := startUpTo(k + 1 + depth); err != nil {
			return sent, err
		}
	}
	if bi < len(bufs) {
		out = append(out, bufs[bi:]...)
		wb := out
		n, err := wb.WriteTo(w)
		sent += n
		if err != nil {
			return sent, errs.Wrap(errs.PeerUnreachable, "tcp", err, "send")
		}
	}
	return sent, nil
}

// recv reads n payload bytes from the connection into device memory at dst
// of device dev: chunk k is read from the socket while chunk k-1 is copied
// to the device. A failed copy (or no ring) does not break the stream: the
// rest of the payload is read and dropped and copyErr says why. ioErr means
// the connection is lost. recv returns after every copy it started ended.
func (st *stage) recv(br *bufio.Reader, nc net.Conn, op *session.Opener, dev devLoc, dst, n uint64) (copyErr, ioErr error) {
	s, err := st.get(dev)
	if err != nil {
		if st.scratch == nil {
			st.scratch = make([]byte, drainChunk)
		}
		return err, dropPayload(br, nc, op, n, st.scratch, st.t.opt.Progress)
	}
	startPayload(op, n)
	depth, cs := s.Depth(), s.ChunkSize()
	k := 0
	for off := uint64(0); off < n; k++ {
		slot, m := k%depth, min(cs, n-off)
		if k >= depth {
			// Also after a failure: the slot's last copy must end
			// before the socket overwrites it.
			if err := s.Wait(slot); err != nil && copyErr == nil {
				copyErr = err
			}
		}
		if err := readPiece(br, nc, op, s.Chunk(slot)[:m], st.t.opt.Progress); err != nil {
			ioErr = err
			k++
			break
		}
		if copyErr == nil {
			copyErr = s.ToDevice(slot, dst+off, m)
		}
		off += m
	}
	for slot := 0; slot < min(k, depth); slot++ {
		if err := s.Wait(slot); err != nil && copyErr == nil {
			copyErr = err
		}
	}
	return copyErr, ioErr
}
