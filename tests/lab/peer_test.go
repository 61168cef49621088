package lab_test

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tecache/te/engine"
	_ "github.com/tecache/te/engine/std"
	"github.com/tecache/te/internal/sys/mem"
	"github.com/tecache/te/internal/testexec"
	"github.com/tecache/te/tests/lab"
)

// The test binary, started again inside a host with envPeer set, is a te
// peer: an engine listening on the host's address (tcp, or the transport
// envTransport names) with one registered buffer, driven by one-line
// commands on stdin.
const (
	envPeer = "TE_LAB_PEER"      // the host address to listen on
	envSize = "TE_LAB_PEER_SIZE" // the buffer's size in bytes
	envPort = "TE_LAB_PEER_PORT" // the port to listen on (default: any)
	// envTransport is the one transport the peer uses (default tcp);
	// its parameters come as TE_PARAM_* variables.
	envTransport = "TE_LAB_PEER_TRANSPORT"
)

func TestMain(m *testing.M) {
	if r := os.Getenv(envRole); r != "" {
		os.Exit(runRole(r, os.Getenv(envPeer)))
	}
	if a := os.Getenv(envPeer); a != "" {
		os.Exit(runPeer(a))
	}
	os.Exit(m.Run())
}

type hello struct {
	Segment string `json:"segment"`
	Addr    uint64 `json:"addr"`
	Len     uint64 `json:"len"`
}

// taskResult is one task of a batch as the initiator saw it, with the
// CRC-32 of the source block it was to write.
type taskResult struct {
	State       string `json:"state"`
	Transferred uint64 `json:"transferred"`
	Code        string `json:"code,omitempty"`
	Err         string `json:"err,omitempty"`
	SrcCRC      uint32 `json:"src_crc"`
}

type batchResult struct {
	State     string       `json:"state"`
	ElapsedMS int64        `json:"elapsed_ms"`
	Tasks     []taskResult `json:"tasks"`
	Err       string       `json:"err,omitempty"`
}

// runPeer serves commands until stdin closes:
//
//	pattern SEED            fill the buffer with a pattern
//	fill B                  set every byte to B
//	crc OFF N               CRC-32 of [OFF, OFF+N)
//	stats                   the transport's Stats, one JSON line
//	write SEG RADDR N BS    write [0, N) to SEG at RADDR in one batch of
//	                        N/BS tasks: answers "submitted", then a
//	                        batchResult once every task ended; through the
//	                        segment held open by "open" if there is one,
//	                        else opened and closed around the batch
//	open SEG                open SEG and hold it: answers "opened MS" or
//	                        "refused MS CODE MESSAGE" (MS: the open's time)
func runPeer(addr string) int {
	size, _ := strconv.Atoi(os.Getenv(envSize))
	if size <= 0 {
		size = 64 << 20
	}
	port := os.Getenv(envPort)
	if port == "" {
		port = "0"
	}
	tr := os.Getenv(envTransport)
	if tr == "" {
		tr = "tcp"
	}
	e, err := engine.New(engine.Config{ListenAddr: addr + ":" + port, Hostname: addr, ForceTransport: tr})
	if err != nil {
		fmt.Fprintln(os.Stderr, "peer:", err)
		return 1
	}
	defer e.Close()
	buf, err := mem.Alloc(size)
	if err != nil {
		fmt.Fprintln(os.Stderr, "peer:", err)
		return 1
	}
	if err := e.RegisterMemory(mem.Addr(buf), uint64(size), "cpu:0", true); err != nil {
		fmt.Fprintln(os.Stderr, "peer:", err)
		return 1
	}
	out := json.NewEncoder(os.Stdout)
	out.Encode(hello{e.Name(), mem.Addr(buf), uint64(size)})
	held := map[string]*engine.Segment{}
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		num := func(i int) uint64 {
			if i >= len(f) {
				return 0
			}
			v, _ := strconv.ParseUint(f[i], 10, 64)
			return v
		}
		if len(f) == 0 {
			continue
		}
		switch f[0] {
		case "pattern":
			pattern(buf, num(1))
			fmt.Println("ok")
		case "fill":
			clear(buf) // memclr: a byte loop over 64 MiB takes seconds under -race
			if v := byte(num(1)); v != 0 {
				for i := range buf {
					buf[i] = v
				}
			}
			fmt.Println("ok")
		case "crc":
			off, n := num(1), num(2)
			if off+n > uint64(len(buf)) || off+n < off {
				fmt.Println("error range out of buffer")
				continue
			}
			fmt.Println(crc32.ChecksumIEEE(buf[off : off+n]))
		case "stats":
			out.Encode(e.TransportStats()[tr])
		case "write":
			if len(f) != 5 {
				fmt.Println("error usage: write SEG RADDR N BS")
				continue
			}
			out.Encode(write(e, held[f[1]], buf, f[1], num(2), num(3), num(4)))
		case "open":
			if len(f) != 2 {
				fmt.Println("error usage: open SEG")
				continue
			}
			t0 := time.Now()
			s, err := e.OpenSegment(f[1])
			ms := time.Since(t0).Milliseconds()
			if err != nil {
				fmt.Printf("refused %d %s %s\n", ms, engine.CodeOf(err), strings.ReplaceAll(err.Error(), "\n", " "))
				continue
			}
			if old := held[f[1]]; old != nil {
				e.CloseSegment(old)
			}
			held[f[1]] = s
			fmt.Printf("opened %d\n", ms)
		default:
			fmt.Printf("error unknown command %q\n", f[0])
		}
	}
	return 0
}

// pattern fills buf with bytes that depend on seed and differ from block to
// block: one 64 KiB block computed, copied (a memmove, fast under -race),
// each copy stamped with its offset.
func pattern(buf []byte, seed uint64) {
	const blk = 64 << 10
	first := buf[:min(blk, len(buf))]
	for i := range first {
		first[i] = byte(uint64(i)*2654435761>>13 ^ seed)
	}
	for off := blk; off < len(buf); off += blk {
		n := copy(buf[off:], first)
		if n >= 8 {
			binary.LittleEndian.PutUint64(buf[off:], uint64(off)^seed)
		}
	}
}

func write(e *engine.Engine, s *engine.Segment, buf []byte, seg string, raddr, n, bs uint64) batchResult {
	if bs == 0 || n%bs != 0 || n > uint64(len(buf)) {
		return batchResult{Err: "bad sizes"}
	}
	if s == nil {
		var err error
		if s, err = e.OpenSegment(seg); err != nil {
			fmt.Println("submitted") // the caller waits for this line first
			return batchResult{Err: err.Error()}
		}
		defer e.CloseSegment(s)
	}
	cnt := int(n / bs)
	b, err := e.AllocateBatch(cnt)
	if err != nil {
		fmt.Println("submitted")
		return batchResult{Err: err.Error()}
	}
	defer b.Free()
	reqs := make([]engine.Request, cnt)
	for i := range reqs {
		off := uint64(i) * bs
		reqs[i] = engine.Request{Op: engine.Write, Local: mem.Addr(buf) + off, Segment: s, Remote: raddr + off, Length: bs}
	}
	t0 := time.Now()
	err = b.Submit(reqs...)
	fmt.Println("submitted")
	if err != nil {
		return batchResult{Err: err.Error()}
	}
	st, err := b.Wait(2 * time.Minute)
	r := batchResult{State: st.State.String(), ElapsedMS: time.Since(t0).Milliseconds()}
	if err != nil {
		r.Err = err.Error()
	}
	for i := range cnt {
		ts, _ := b.TaskStatus(i)
		tr := taskResult{State: ts.State.String(), Transferred: ts.Transferred,
			SrcCRC: crc32.ChecksumIEEE(buf[uint64(i)*bs : uint64(i+1)*bs])}
		if ts.Err != nil {
			tr.Code, tr.Err = engine.CodeOf(ts.Err).String(), ts.Err.Error()
		}
		r.Tasks = append(r.Tasks, tr)
	}
	return r
}

// peer is the test's handle on a peer process in a host.
type peer struct {
	t    *testing.T
	host *lab.Host
	proc *lab.Proc
	in   io.WriteCloser
	out  *bufio.Reader
	h    hello
}

// startPeer starts a peer in host h with a buffer of size bytes; env adds
// variables (TE_PROGRESS_TIMEOUT, ...).
func startPeer(t *testing.T, h *lab.Host, size int, env ...string) *peer {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := testexec.Command(exe, "-test.run=^$")
	cmd.Env = append(append(os.Environ(), envPeer+"="+h.Addr(0), envSize+"="+strconv.Itoa(size),
		"TE_LOG_LEVEL=error"), env...)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	o, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	p := &peer{t: t, host: h, in: in, out: bufio.NewReader(o)}
	p.proc = h.Start(t, cmd)
	line := p.line(60 * time.Second)
	if err := json.Unmarshal([]byte(line), &p.h); err != nil {
		t.Fatalf("peer in %s said %q: %v", h.NS, line, err)
	}
	return p
}

// line reads the peer's next line, failing the test after timeout.
func (p *peer) line(timeout time.Duration) string {
	p.t.Helper()
	ch := make(chan string, 1)
	go func() {
		s, err := p.out.ReadString('\n')
		if err != nil {
			s = "error reading peer: " + err.Error()
		}
		ch <- strings.TrimSpace(s)
	}()
	select {
	case s := <-ch:
		if strings.HasPrefix(s, "error") {
			p.t.Fatalf("peer %s: %s", p.host.NS, s)
		}
		return s
	case <-time.After(timeout):
		p.t.Fatalf("peer %s: no answer within %v", p.host.NS, timeout)
		return ""
	}
}

func (p *peer) send(cmd string) {
	p.t.Helper()
	if _, err := io.WriteString(p.in, cmd+"\n"); err != nil {
		p.t.Fatalf("peer %s: %v", p.host.NS, err)
	}
}

func (p *peer) do(cmd string) string {
	p.t.Helper()
	p.send(cmd)
	return p.line(60 * time.Second)
}

func (p *peer) crc(off, n uint64) uint32 {
	p.t.Helper()
	v, err := strconv.ParseUint(p.do(fmt.Sprintf("crc %d %d", off, n)), 10, 32)
	if err != nil {
		p.t.Fatal(err)
	}
	return uint32(v)
}

// startWrite has p write [0, n) into dst's buffer in tasks of bs bytes and
// returns once the batch was submitted; result waits for its outcome.
func (p *peer) startWrite(dst *peer, n, bs uint64) {
	p.t.Helper()
	p.send(fmt.Sprintf("write %s %d %d %d", dst.h.Segment, dst.h.Addr, n, bs))
	if s := p.line(60 * time.Second); s != "submitted" {
		p.t.Fatalf("peer %s: %q", p.host.NS, s)
	}
}

// stats returns the peer's transport counters.
func (p *peer) stats() map[string]uint64 {
	p.t.Helper()
	var m map[string]uint64
	if s := p.do("stats"); json.Unmarshal([]byte(s), &m) != nil {
		p.t.Fatalf("peer %s: stats %q", p.host.NS, s)
	}
	return m
}

func (p *peer) result(timeout time.Duration) batchResult {
	p.t.Helper()
	var r batchResult
	s := p.line(timeout)
	if err := json.Unmarshal([]byte(s), &r); err != nil {
		p.t.Fatalf("peer %s: %q: %v", p.host.NS, s, err)
	}
	return r
}
