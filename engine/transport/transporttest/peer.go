package transporttest

import (
	"bufio"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tecache/te/engine"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/sys/gpu/gputest"
	"github.com/tecache/te/internal/sys/mem"
	"github.com/tecache/te/internal/sys/proc"
	"github.com/tecache/te/internal/testexec"
)

// envPeer makes a re-executed test binary act as the target peer.
const envPeer = "TE_TRANSPORTTEST_PEER"

// envSize is the size of the peer's registered buffer.
const envSize = "TE_TRANSPORTTEST_SIZE"

// envGPU, set to a runtime's location kind ("cuda", "hip"; 1 means cuda),
// puts the peer's buffer in that runtime's GPU memory (GPU 0 of the
// runtime gputest.Setup chose: the fake one where there is no GPU).
const envGPU = "TE_TRANSPORTTEST_GPU"

// envShared, set to 1, puts the peer's buffer at the start of the engine's
// shared memory (Engine.CXLMemory).
const envShared = "TE_TRANSPORTTEST_SHARED"

// envGrace is the peer engine's UnregisterGrace (a time.Duration string).
const envGrace = "TE_TRANSPORTTEST_GRACE"

// Pauser is a Peer that can be made to hang and come back (a child process).
type Pauser interface {
	Pause() error
	Resume() error
}

// Peer is the target side of the suite: an engine with one registered,
// remote-accessible buffer, in this process or in a child process.
type Peer interface {
	Segment() string
	Addr() uint64
	Len() uint64
	// Rereg unregisters and registers the buffer again: same range, new key.
	Rereg() error
	// Fill sets every byte of the buffer to b.
	Fill(b byte) error
	// CRC returns the CRC-32 of [Addr+off, +n).
	CRC(off, n uint64) (uint32, error)
	// FillRange sets [Addr+off, +n) to b; FillPattern sets each byte at
	// offset o of [off, off+n) to Pattern(seed, o).
	FillRange(off, n uint64, b byte) error
	FillPattern(off, n, seed uint64) error
	// Protect makes [Addr+off, +n) (page-aligned) inaccessible (none) or
	// readable and writable again, so that a late access faults or fails
	// instead of landing. GPU memory cannot be protected: ErrNotSupported.
	Protect(off, n uint64, none bool) error
	// Grant grants a window over ranges of the buffer, given as offsets
	// and lengths, and returns its key; Revoke revokes it.
	Grant(ranges ...[2]uint64) (uint64, error)
	// GrantTo is Grant for the engine whose segment is named grantee
	// alone (engine.GrantWindowTo).
	GrantTo(grantee string, ranges ...[2]uint64) (uint64, error)
	Revoke(key uint64) error
	// Kill makes the peer vanish abruptly (SIGKILL for a child process).
	Kill()
	// Close stops the peer cleanly.
	Close()
}

type hello struct {
	Segment string `json:"segment"`
	Addr    uint64 `json:"addr"`
	Length  uint64 `json:"length"`
}

// peerMem is the peer's buffer: host memory, or GPU memory reached through
// the driver.
type peerMem interface {
	addr() uint64
	length() uint64
	location() string
	// read returns a copy of [off, off+n) or the bytes themselves.
	read(off, n uint64) ([]byte, error)
	// write lets f change [off, off+n).
	write(off, n uint64, f func([]byte)) error
	protect(off, n uint64, none bool) error
	free()
}

type hostMem []byte

func (m hostMem) addr() uint64                              { return mem.Addr(m) }
func (m hostMem) length() uint64                            { return uint64(len(m)) }
func (m hostMem) location() string                          { return "cpu:0" }
func (m hostMem) read(off, n uint64) ([]byte, error)        { return m[off : off+n], nil }
func (m hostMem) write(off, n uint64, f func([]byte)) error { f(m[off : off+n]); return nil }
func (m hostMem) free()                                     { mem.Free(m) }
func (m hostMem) protect(off, n uint64, none bool) error {
	prot := unix.PROT_READ | unix.PROT_WRITE
	if none {
		prot = unix.PROT_NONE
	}
	return unix.Mprotect(m[off:off+n], prot)
}

type gpuMem struct{ b *gputest.Buffer }

func (m gpuMem) addr() uint64     { return m.b.Addr }
func (m gpuMem) length() uint64   { return m.b.N }
func (m gpuMem) location() string { return "*" } // the engine must recognise it
func (m gpuMem) read(off, n uint64) ([]byte, error) {
	return m.b.Download(off, n)
}
func (m gpuMem) write(off, n uint64, f func([]byte)) error {
	f(m.b.Host[off : off+n])
	return m.b.Upload(off, n)
}
func (m gpuMem) protect(uint64, uint64, bool) error {
	return errs.New(errs.NotSupported, "peer", "GPU memory cannot be protected from the CPU")
}
func (m gpuMem) free() { m.b.Free() }

// inproc is a peer engine in this process.
type inproc struct {
	e   *engine.Engine
	buf peerMem
	mu  sync.Mutex
}

// NewInProcessPeer starts a peer engine in this process.
func NewInProcessPeer(t testing.TB, size int, cfg engine.Config) Peer {
	t.Helper()
	p, err := newInproc(size, cfg, "")
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func newInproc(size int, cfg engine.Config, gpuKind string) (*inproc, error) {
	return newInprocMem(size, cfg, gpuKind, false)
}

// sharedMem is a buffer in the engine's shared mapping: the engine unmaps
// it when it closes.
type sharedMem struct{ hostMem }

func (sharedMem) free() {}

// newInprocMem starts a peer whose buffer is host memory, GPU memory of
// runtime gpuKind (not ""), or the engine's shared mapping.
func newInprocMem(size int, cfg engine.Config, gpuKind string, shared bool) (*inproc, error) {
	if cfg.ListenAddr == "" {
		cfg.ListenAddr = "127.0.0.1:0"
	}
	e, err := engine.New(cfg)
	if err != nil {
		return nil, err
	}
	var buf peerMem
	if shared {
		addr, n, err := e.CXLMemory()
		if err == nil && n < uint64(size) {
			err = fmt.Errorf("shared memory of %d bytes cannot hold %d", n, size)
		}
		if err != nil {
			e.Close()
			return nil, err
		}
		buf = sharedMem{hostMem(mem.Bytes(addr, uint64(size)))}
	} else if gpuKind != "" {
		v, ok := gputest.Of(gpuKind)
		if !ok {
			e.Close()
			return nil, fmt.Errorf("no GPU runtime %q", gpuKind)
		}
		b, err := v.NewBuffer(uint64(size))
		if err != nil {
			e.Close()
			return nil, err
		}
		buf = gpuMem{b}
	} else {
		b, err := mem.Alloc(size)
		if err != nil {
			e.Close()
			return nil, err
		}
		buf = hostMem(b)
	}
	if err := e.RegisterMemory(buf.addr(), buf.length(), buf.location(), true); err != nil {
		e.Close()
		buf.free()
		return nil, err
	}
	return &inproc{e: e, buf: buf}, nil
}

func (p *inproc) Segment() string { return p.e.Name() }
func (p *inproc) Addr() uint64    { return p.buf.addr() }
func (p *inproc) Len() uint64     { return p.buf.length() }
func (p *inproc) Rereg() error {
	if err := p.e.UnregisterMemory(p.Addr()); err != nil {
		return err
	}
	return p.e.RegisterMemory(p.Addr(), p.Len(), p.buf.location(), true)
}
func (p *inproc) Fill(b byte) error { return p.FillRange(0, p.Len(), b) }
func (p *inproc) FillRange(off, n uint64, b byte) error {
	if off+n > p.Len() || off+n < off {
		return fmt.Errorf("range out of buffer")
	}
	return p.buf.write(off, n, func(m []byte) {
		for i := range m {
			m[i] = b
		}
	})
}
func (p *inproc) FillPattern(off, n, seed uint64) error {
	if off+n > p.Len() || off+n < off {
		return fmt.Errorf("range out of buffer")
	}
	return p.buf.write(off, n, func(m []byte) { fillPattern(m, seed, off) })
}
func (p *inproc) Protect(off, n uint64, none bool) error {
	if off+n > p.Len() || off+n < off {
		return fmt.Errorf("range out of buffer")
	}
	return p.buf.protect(off, n, none)
}
func (p *inproc) CRC(off, n uint64) (uint32, error) {
	if off+n > p.Len() || off+n < off {
		return 0, fmt.Errorf("range out of buffer")
	}
	b, err := p.buf.read(off, n)
	if err != nil {
		return 0, err
	}
	return crc32.ChecksumIEEE(b), nil
}
func (p *inproc) Grant(ranges ...[2]uint64) (uint64, error) { return p.GrantTo("", ranges...) }
func (p *inproc) GrantTo(grantee string, ranges ...[2]uint64) (uint64, error) {
	var rs []engine.Range
	for _, r := range ranges {
		rs = append(rs, engine.Range{Addr: p.Addr() + r[0], Length: r[1]})
	}
	return p.e.GrantWindowTo(grantee, rs)
}
func (p *inproc) Revoke(key uint64) error { return p.e.RevokeWindow(key) }
func (p *inproc) Kill()                   { p.e.Close() }
func (p *inproc) Close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.e != nil {
		p.e.Close()
		p.buf.protect(0, p.Len(), false)
		p.buf.free()
		p.e = nil
	}
}

// child is a peer engine in a child process driven over stdin/stdout.
type child struct {
	cmd  *exec.Cmd
	in   io.WriteCloser
	out  *bufio.Reader
	h    hello
	mu   sync.Mutex
	done chan struct{}
}

// NewChildPeer starts the test binary again as a peer process. The package's
// TestMain must call Main.
func NewChildPeer(t testing.TB, size int, env ...string) Peer {
	t.Helper()
	cmd := testexec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append(os.Environ(), envPeer+"=1", envSize+"="+strconv.Itoa(size)), env...)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	outPipe, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &child{cmd: cmd, in: in, out: bufio.NewReader(outPipe), done: make(chan struct{})}
	go func() { cmd.Wait(); close(c.done) }()
	line, err := c.readLine(20 * time.Second)
	if err != nil {
		c.Kill()
		t.Fatalf("peer process did not start: %v", err)
	}
	if err := json.Unmarshal([]byte(line), &c.h); err != nil {
		c.Kill()
		t.Fatalf("peer process said %q: %v", line, err)
	}
	return c
}

func (c *child) readLine(timeout time.Duration) (string, error) {
	type res struct {
		s   string
		err error
	}
	ch := make(chan res, 1)
	go func() {
		s, err := c.out.ReadString('\n')
		ch <- res{strings.TrimSpace(s), err}
	}()
	select {
	case r := <-ch:
		return r.s, r.err
	case <-time.After(timeout):
		return "", fmt.Errorf("no answer from peer within %v", timeout)
	}
}

func (c *child) cmdLine(s string) (string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, err := io.WriteString(c.in, s+"\n"); err != nil {
		return "", err
	}
	r, err := c.readLine(30 * time.Second)
	if err != nil {
		return "", err
	}
	if strings.HasPrefix(r, "error ") {
		return "", fmt.Errorf("peer: %s", r[6:])
	}
	return r, nil
}

func (c *child) Segment() string { return c.h.Segment }
func (c *child) Addr() uint64    { return c.h.Addr }
func (c *child) Len() uint64     { return c.h.Length }
func (c *child) Rereg() error    { _, err := c.cmdLine("rereg"); return err }
func (c *child) Fill(b byte) error {
	_, err := c.cmdLine("fill " + strconv.Itoa(int(b)))
	return err
}
func (c *child) FillRange(off, n uint64, b byte) error {
	_, err := c.cmdLine(fmt.Sprintf("fillr %d %d %d", off, n, b))
	return err
}
func (c *child) FillPattern(off, n, seed uint64) error {
	_, err := c.cmdLine(fmt.Sprintf("pattern %d %d %d", off, n, seed))
	return err
}
func (c *child) Protect(off, n uint64, none bool) error {
	v := 0
	if none {
		v = 1
	}
	r, err := c.cmdLine(fmt.Sprintf("protect %d %d %d", off, n, v))
	if err == nil && r == "unsupported" {
		err = errs.New(errs.NotSupported, "peer", "the peer's memory cannot be protected")
	}
	return err
}
func (c *child) CRC(off, n uint64) (uint32, error) {
	r, err := c.cmdLine(fmt.Sprintf("crc %d %d", off, n))
	if err != nil {
		return 0, err
	}
	v, err := strconv.ParseUint(r, 10, 32)
	return uint32(v), err
}

func (c *child) Grant(ranges ...[2]uint64) (uint64, error) { return c.GrantTo("", ranges...) }
func (c *child) GrantTo(grantee string, ranges ...[2]uint64) (uint64, error) {
	cmd := "grant"
	if grantee != "" {
		cmd = "grantto " + grantee
	}
	for _, r := range ranges {
		cmd += fmt.Sprintf(" %d %d", r[0], r[1])
	}
	r, err := c.cmdLine(cmd)
	if err != nil {
		return 0, err
	}
	return strconv.ParseUint(r, 10, 64)
}
func (c *child) Revoke(key uint64) error {
	_, err := c.cmdLine("revoke " + strconv.FormatUint(key, 10))
	return err
}

// Pause stops the peer process (SIGSTOP) and returns once all its threads
// are stopped: its sockets stay open but nothing answers, like a peer that
// hangs.
func (c *child) Pause() error { return proc.Stop(c.cmd.Process.Pid, 10*time.Second) }

// Resume continues a paused peer.
func (c *child) Resume() error { return c.cmd.Process.Signal(syscall.SIGCONT) }

func (c *child) Kill() {
	c.cmd.Process.Signal(syscall.SIGKILL)
	<-c.done
}
func (c *child) Close() {
	c.in.Close()
	select {
	case <-c.done:
	case <-time.After(10 * time.Second):
		c.Kill()
	}
}

// runPeer is the child side: start an engine, register a buffer, announce it,
// serve commands until stdin closes.
func runPeer() int {
	size, _ := strconv.Atoi(os.Getenv(envSize))
	if size <= 0 {
		size = 80 << 20
	}
	cfg := engine.Config{ListenAddr: "127.0.0.1:0", Hostname: "127.0.0.1"}
	if d, err := time.ParseDuration(os.Getenv(envGrace)); err == nil {
		cfg.UnregisterGrace = d
	}
	kind := os.Getenv(envGPU)
	if kind == "1" {
		kind = "cuda"
	}
	p, err := newInprocMem(size, cfg, kind, os.Getenv(envShared) == "1")
	if err != nil {
		fmt.Fprintln(os.Stderr, "peer:", err)
		return 1
	}
	defer p.Close()
	b, _ := json.Marshal(hello{p.Segment(), p.Addr(), p.Len()})
	fmt.Println(string(b))
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 {
			continue
		}
		var err error
		out := "ok"
		switch f[0] {
		case "rereg":
			err = p.Rereg()
		case "fill":
			v, _ := strconv.Atoi(f[1])
			err = p.Fill(byte(v))
		case "fillr", "pattern", "protect":
			var a [3]uint64
			for k := range a {
				if k+1 < len(f) {
					a[k], _ = strconv.ParseUint(f[k+1], 10, 64)
				}
			}
			switch f[0] {
			case "fillr":
				err = p.FillRange(a[0], a[1], byte(a[2]))
			case "pattern":
				err = p.FillPattern(a[0], a[1], a[2])
			default:
				err = p.Protect(a[0], a[1], a[2] == 1)
				if errs.CodeOf(err) == errs.NotSupported {
					err, out = nil, "unsupported"
				}
			}
		case "crc":
			off, _ := strconv.ParseUint(f[1], 10, 64)
			n, _ := strconv.ParseUint(f[2], 10, 64)
			var c uint32
			c, err = p.CRC(off, n)
			out = strconv.FormatUint(uint64(c), 10)
		case "grant", "grantto":
			grantee, k0 := "", 1
			if f[0] == "grantto" && len(f) > 1 {
				grantee, k0 = f[1], 2
			}
			var rs [][2]uint64
			for k := k0; k+1 < len(f); k += 2 {
				off, _ := strconv.ParseUint(f[k], 10, 64)
				n, _ := strconv.ParseUint(f[k+1], 10, 64)
				rs = append(rs, [2]uint64{off, n})
			}
			var key uint64
			key, err = p.GrantTo(grantee, rs...)
			out = strconv.FormatUint(key, 10)
		case "revoke":
			key, _ := strconv.ParseUint(f[1], 10, 64)
			err = p.Revoke(key)
		case "exit":
			return 0
		default:
			err = fmt.Errorf("unknown command %q", f[0])
		}
		if err != nil {
			fmt.Println("error " + err.Error())
		} else {
			fmt.Println(out)
		}
	}
	return 0
}
