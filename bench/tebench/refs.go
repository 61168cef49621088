package tebench

import (
	"crypto/aes"
	"crypto/cipher"
	"encoding/binary"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/sys/mem"
)

// The raw TCP reference: plain sockets, no framing beyond a 24-byte hello
// (direction, block size, span). Each side moves whole blocks, rotating
// through a buffer of span bytes (a multiple of the block), so the reference
// touches as much memory as the te run it is compared to: moving the same
// bytes through a cold 128 MiB working set is memory-bound on small machines,
// through one hot block it is not. Buffers come from mem.Alloc and are
// faulted in before anything is timed, like the engine's registered memory.
const (
	refClientSends uint64 = 0 // the initiator writes (te's WRITE)
	refServerSends uint64 = 1 // the target writes (te's READ)
	maxRefSpan            = 256 << 20
)

// RefServer serves the raw TCP reference.
type RefServer struct {
	ln    net.Listener
	mu    sync.Mutex
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

// NewRefServer listens on addr (host:port, port 0 for any).
func NewRefServer(addr string) (*RefServer, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, errs.Wrap(errs.InvalidArgument, "te-bench", err, "reference listener on %s", addr)
	}
	s := &RefServer{ln: ln, conns: map[net.Conn]struct{}{}}
	s.wg.Add(1)
	go s.accept()
	return s, nil
}

// Addr returns the listener's address.
func (s *RefServer) Addr() string { return s.ln.Addr().String() }

func (s *RefServer) accept() {
	defer s.wg.Done()
	for {
		nc, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.mu.Lock()
		s.conns[nc] = struct{}{}
		s.wg.Add(1)
		s.mu.Unlock()
		go func() {
			defer s.wg.Done()
			s.serve(nc)
			s.mu.Lock()
			delete(s.conns, nc)
			s.mu.Unlock()
			nc.Close()
		}()
	}
}

// refBuffer allocates and faults in a span of whole blocks.
func refBuffer(block, span uint64) ([]byte, error) {
	span = max(block, span-span%block)
	b, err := mem.Alloc(int(span))
	if err != nil {
		return nil, err
	}
	for i := 0; i < len(b); i += 4096 {
		b[i] = 1
	}
	return b, nil
}

func (s *RefServer) serve(nc net.Conn) {
	nc.(*net.TCPConn).SetNoDelay(true)
	var h [24]byte
	if _, err := io.ReadFull(nc, h[:]); err != nil {
		return
	}
	dir, block, span := binary.LittleEndian.Uint64(h[:]), binary.LittleEndian.Uint64(h[8:]), binary.LittleEndian.Uint64(h[16:])
	if block == 0 || block > maxRefSpan || span > maxRefSpan || dir > refServerSends {
		return
	}
	buf, err := refBuffer(block, span)
	if err != nil {
		return
	}
	defer mem.Free(buf)
	nc.Write([]byte{1}) // ready: the buffer is faulted in
	for off := uint64(0); ; off += block {
		if off+block > uint64(len(buf)) {
			off = 0
		}
		if dir == refServerSends {
			_, err = nc.Write(buf[off : off+block])
		} else {
			_, err = io.ReadFull(nc, buf[off:off+block])
		}
		if err != nil {
			return
		}
	}
}

// Close stops the server and waits for its goroutines.
func (s *RefServer) Close() {
	s.ln.Close()
	s.mu.Lock()
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}

// RawRef is an open raw TCP reference: conns connections to a RefServer.
type RawRef struct {
	dir   uint64
	block uint64
	ncs   []net.Conn
	bufs  [][]byte
	offs  []uint64
}

// DialRawRef opens conns connections to the RefServer at addr, each moving
// blocks of block bytes in direction op ("read": the server sends, "write":
// the client sends) through span/conns bytes of memory on each side.
func DialRawRef(addr, op string, block, span uint64, conns int) (*RawRef, error) {
	r := &RawRef{dir: refClientSends, block: block}
	if op == "read" {
		r.dir = refServerSends
	}
	span = min(maxRefSpan, max(span/uint64(conns), block))
	for i := 0; i < conns; i++ {
		nc, err := net.Dial("tcp", addr)
		if err != nil {
			r.Close()
			return nil, errs.Wrap(errs.PeerUnreachable, "te-bench", err, "reference server %s", addr)
		}
		nc.(*net.TCPConn).SetNoDelay(true)
		r.ncs = append(r.ncs, nc)
		var h [24]byte
		binary.LittleEndian.PutUint64(h[:], r.dir)
		binary.LittleEndian.PutUint64(h[8:], block)
		binary.LittleEndian.PutUint64(h[16:], span)
		var ok [1]byte
		_, err = nc.Write(h[:])
		if err == nil {
			_, err = io.ReadFull(nc, ok[:])
		}
		if err != nil {
			r.Close()
			return nil, errs.Wrap(errs.PeerUnreachable, "te-bench", err, "reference server %s", addr)
		}
		b, err := refBuffer(block, span)
		if err != nil {
			r.Close()
			return nil, err
		}
		r.bufs = append(r.bufs, b)
		r.offs = append(r.offs, 0)
	}
	return r, nil
}

// Measure moves blocks on every connection for d and returns the bytes moved
// and the time it took.
func (r *RawRef) Measure(d time.Duration) (uint64, time.Duration, error) {
	var total atomic.Uint64
	var wg sync.WaitGroup
	var firstErr atomic.Pointer[error]
	start := time.Now()
	stop := start.Add(d)
	for i := range r.ncs {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			nc, buf, block := r.ncs[i], r.bufs[i], r.block
			off := r.offs[i]
			defer func() { r.offs[i] = off }()
			for time.Now().Before(stop) {
				if off+block > uint64(len(buf)) {
					off = 0
				}
				var err error
				if r.dir == refServerSends {
					_, err = io.ReadFull(nc, buf[off:off+block])
				} else {
					_, err = nc.Write(buf[off : off+block])
				}
				if err != nil {
					firstErr.CompareAndSwap(nil, &err)
					return
				}
				off += block
				total.Add(block)
			}
		}(i)
	}
	wg.Wait()
	if e := firstErr.Load(); e != nil {
		return 0, 0, errs.Wrap(errs.PeerUnreachable, "te-bench", *e, "reference transfer")
	}
	return total.Load(), time.Since(start), nil
}

// Close closes the connections and frees the buffers.
func (r *RawRef) Close() {
	for _, nc := range r.ncs {
		nc.Close()
	}
	for _, b := range r.bufs {
		mem.Free(b)
	}
}

// RawTCP measures plain TCP throughput in GB/s (1e9 B/s) to the RefServer at
// addr for d; see DialRawRef for the arguments.
func RawTCP(addr, op string, block, span uint64, conns int, d time.Duration) (float64, error) {
	r, err := DialRawRef(addr, op, block, span, conns)
	if err != nil {
		return 0, err
	}
	defer r.Close()
	n, el, err := r.Measure(d)
	if err != nil {
		return 0, err
	}
	return float64(n) / el.Seconds() / 1e9, nil
}

// Memcpy measures single-threaded memcpy bandwidth in GB/s, copying blocks of
// block bytes through two 64 MiB buffers for d. On a machine with a large
// last-level cache part of that stays cached: MemcpySpan with ColdSpan is the
// out-of-cache reference.
func Memcpy(block uint64, d time.Duration) (float64, error) {
	return MemcpySpan(block, 64<<20, d)
}

// ColdSpan is the buffer size of the out-of-cache memcpy reference: two of
// them exceed any CPU cache, so every block comes from memory.
const ColdSpan = 512 << 20

// MemcpySpan is Memcpy through two buffers of span bytes.
func MemcpySpan(block, span uint64, d time.Duration) (float64, error) {
	if block > span {
		block = span
	}
	src, err := mem.Alloc(int(span))
	if err != nil {
		return 0, err
	}
	defer mem.Free(src)
	dst, err := mem.Alloc(int(span))
	if err != nil {
		return 0, err
	}
	defer mem.Free(dst)
	// Huge pages where the kernel gives them: faulting 1 GiB in 4 KiB pages
	// took seconds on a loaded VM, and the reference is the memory's
	// bandwidth, not the page tables'.
	unix.Madvise(src, unix.MADV_HUGEPAGE)
	unix.Madvise(dst, unix.MADV_HUGEPAGE)
	// Fault the pages in outside the timed loop; the pattern is spread by
	// doubling copies (a byte loop over 512 MiB took seconds on a loaded
	// machine).
	for i := 0; i < 4096 && i < len(src); i++ {
		src[i] = byte(i)
	}
	for k := 4096; k < len(src); k *= 2 {
		copy(src[k:], src[:k])
	}
	copy(dst, src)
	var n uint64
	start := time.Now()
	// The clock is read every 8 MiB, so d holds whatever the span.
	check := max(1, (8<<20)/block)
	for off, i := uint64(0), uint64(0); ; off, i = off+block, i+1 {
		if off+block > span {
			off = 0
		}
		if i%check == 0 && i > 0 && time.Since(start) > d {
			break
		}
		copy(dst[off:off+block], src[off:off+block])
		n += block
	}
	return float64(n) / time.Since(start).Seconds() / 1e9, nil
}

// RefAESGCM measures one core's AES-128-GCM sealing rate in GB/s over
// 64 KiB records (the session's record size), for about 200 ms: the
// physical reference of an encrypted run.
func RefAESGCM() float64 {
	b, err := aes.NewCipher(make([]byte, 16))
	if err != nil {
		return 0
	}
	g, err := cipher.NewGCM(b)
	if err != nil {
		return 0
	}
	p := make([]byte, 64<<10)
	out := make([]byte, 0, len(p)+g.Overhead())
	nonce := make([]byte, g.NonceSize())
	var n int
	start := time.Now()
	for time.Since(start) < 200*time.Millisecond {
		for i := 0; i < 16; i++ {
			nonce[0]++
			out = g.Seal(out[:0], nonce, p, nil)
			n += len(p)
		}
	}
	return float64(n) / time.Since(start).Seconds() / 1e9
}
