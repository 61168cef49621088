package shm_test

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
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/tecache/te/engine"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/sys/mem"
	"github.com/tecache/te/internal/testexec"
)

// The process tests re-execute the test binary as an initiator: an engine
// that opens the parent's segment and moves bytes on command (stdin lines),
// answering one line per command on stdout.
const (
	envRole   = "TE_SHM_TEST_ROLE"
	envTarget = "TE_SHM_TEST_TARGET" // segment to open
	envAddr   = "TE_SHM_TEST_ADDR"   // its buffer's address
	envLen    = "TE_SHM_TEST_LEN"
)

func runRole(role string) int {
	if role != "initiator" {
		fmt.Fprintln(os.Stderr, "unknown role", role)
		return 2
	}
	if err := initiator(); err != nil {
		fmt.Fprintln(os.Stderr, "initiator:", err)
		return 1
	}
	return 0
}

type hammerReport struct {
	OK, Failed int
	Codes      map[string]int
}

func initiator() error {
	target := os.Getenv(envTarget)
	addr, _ := strconv.ParseUint(os.Getenv(envAddr), 10, 64)
	n, _ := strconv.ParseUint(os.Getenv(envLen), 10, 64)
	e, err := engine.New(engine.Config{ListenAddr: "127.0.0.1:0", Hostname: "127.0.0.1", TransferTimeout: 10 * time.Second})
	if err != nil {
		return err
	}
	defer e.Close()
	buf, err := mem.Alloc(int(n))
	if err != nil {
		return err
	}
	defer mem.Free(buf)
	if err := e.RegisterMemory(mem.Addr(buf), n, "cpu", false); err != nil {
		return err
	}
	seg, err := e.OpenSegment(target)
	if err != nil {
		return err
	}
	// one runs a single request and returns the transport that carried it.
	one := func(op engine.Opcode, off, size uint64) (string, error) {
		b, err := e.AllocateBatch(1)
		if err != nil {
			return "", err
		}
		defer b.Free()
		if err := b.Submit(engine.Request{Op: op, Local: mem.Addr(buf) + off, Segment: seg, Remote: addr + off, Length: size}); err != nil {
			return "", err
		}
		st, err := b.Wait(20 * time.Second)
		if err != nil {
			return "", err
		}
		ts, _ := b.TaskStatus(0)
		if st.State != engine.Completed {
			return ts.Transport, st.Err
		}
		return ts.Transport, nil
	}
	var stop atomic.Bool
	var wg sync.WaitGroup
	var rep hammerReport
	out := bufio.NewWriter(os.Stdout)
	say := func(format string, args ...any) {
		fmt.Fprintf(out, format+"\n", args...)
		out.Flush()
	}
	say("ready")
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 {
			continue
		}
		arg := func(i int) uint64 { v, _ := strconv.ParseUint(f[i], 10, 64); return v }
		switch f[0] {
		case "write": // write OFF N BYTE
			off, size := arg(1), arg(2)
			for i := range buf[off : off+size] {
				buf[off+uint64(i)] = byte(arg(3))
			}
			tr, err := one(engine.Write, off, size)
			if err != nil {
				say("fail %s %d %s", tr, errs.CodeOf(err), err)
			} else {
				say("ok %s", tr)
			}
		case "read": // read OFF N
			off, size := arg(1), arg(2)
			tr, err := one(engine.Read, off, size)
			if err != nil {
				say("fail %s %d %s", tr, errs.CodeOf(err), err)
			} else {
				say("ok %s %d", tr, crc32.ChecksumIEEE(buf[off:off+size]))
			}
		case "cancel": // cancel write|read N SIZE BYTE
			op := engine.Write
			if f[1] == "read" {
				op = engine.Read
			}
			say("%s", cancelMidBatch(e, seg, buf, addr, op, int(arg(2)), arg(3), byte(arg(4))))
		case "closeall": // closeall N SIZE BYTE: N writes in flight, then Close
			say("%s", closeInFlight(e, seg, buf, addr, int(arg(1)), arg(2), byte(arg(3))))
		case "stats":
			b, _ := json.Marshal(e.TransportStats())
			say("%s", b)
		case "hammer": // hammer BYTE: 16 x 4 KiB writes per batch, until stop
			for i := range buf {
				buf[i] = byte(arg(1))
			}
			rep = hammerReport{Codes: map[string]int{}}
			stop.Store(false)
			wg.Add(1)
			go func() {
				defer wg.Done()
				hammer(e, seg, mem.Addr(buf), addr, n, &stop, &rep)
			}()
			say("ok")
		case "stop":
			stop.Store(true)
			wg.Wait()
			b, _ := json.Marshal(rep)
			say("%s", b)
		case "exit":
			return nil
		default:
			say("error unknown command")
		}
	}
	return nil
}

// canary is what the initiator writes into its buffer once its tasks ended:
// a copy that ran after that would carry it to the owner (WRITE) or
// overwrite it (READ).
const canary = 0xCD

// cancelMidBatch submits n requests of size bytes at consecutive offsets,
// cancels the batch at once and waits. Then it fills its buffer with the
// canary and, for a READ, watches it for 200 ms. It answers
// "ok STATES INTACT": one letter per task (c completed, x canceled, f
// anything else) and whether the canary survived.
func cancelMidBatch(e *engine.Engine, seg *engine.Segment, buf []byte, remote uint64, op engine.Opcode, n int, size uint64, v byte) string {
	local := mem.Addr(buf)
	if op == engine.Write {
		fillBytes(buf[:uint64(n)*size], v)
	} else {
		fillBytes(buf[:uint64(n)*size], 0)
	}
	b, err := e.AllocateBatch(n)
	if err != nil {
		return "error " + err.Error()
	}
	defer b.Free()
	reqs := make([]engine.Request, n)
	for i := range reqs {
		off := uint64(i) * size
		reqs[i] = engine.Request{Op: op, Local: local + off, Segment: seg, Remote: remote + off, Length: size}
	}
	if err := b.Submit(reqs...); err != nil {
		return "error " + err.Error()
	}
	if err := b.Cancel(); err != nil {
		return "error " + err.Error()
	}
	if _, err := b.Wait(30 * time.Second); err != nil {
		return "error " + err.Error()
	}
	states := make([]byte, n)
	for i := range states {
		ts, _ := b.TaskStatus(i)
		switch ts.State {
		case engine.Completed:
			states[i] = 'c'
		case engine.Canceled:
			states[i] = 'x'
		default:
			states[i] = 'f'
		}
	}
	// Completed reads brought the owner's bytes; check them before the
	// canary goes over them.
	if op == engine.Read {
		for i, s := range states {
			if s == 'c' && firstNotByte(buf[uint64(i)*size:uint64(i+1)*size], v) >= 0 {
				return "error completed read " + strconv.Itoa(i) + " has wrong bytes"
			}
		}
	}
	fillBytes(buf[:uint64(n)*size], canary)
	intact := 1
	if op == engine.Read {
		for end := time.Now().Add(200 * time.Millisecond); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
			if firstNotByte(buf[:uint64(n)*size], canary) >= 0 {
				intact = 0
				break
			}
		}
	}
	return fmt.Sprintf("ok %s %d", states, intact)
}

// closeInFlight submits n writes of size bytes in batches of 128 and closes
// the engine at once. Every task must have ended when Close returns; then
// the buffer is filled with the canary. It answers "ok COMPLETED ENDED
// PENDING".
func closeInFlight(e *engine.Engine, seg *engine.Segment, buf []byte, remote uint64, n int, size uint64, v byte) string {
	fillBytes(buf[:uint64(n)*size], v)
	local := mem.Addr(buf)
	var bs []*engine.Batch
	for lo := 0; lo < n; lo += 128 {
		hi := min(lo+128, n)
		b, err := e.AllocateBatch(hi - lo)
		if err != nil {
			return "error " + err.Error()
		}
		reqs := make([]engine.Request, hi-lo)
		for i := range reqs {
			off := uint64(lo+i) * size
			reqs[i] = engine.Request{Op: engine.Write, Local: local + off, Segment: seg, Remote: remote + off, Length: size}
		}
		if err := b.Submit(reqs...); err != nil {
			return "error " + err.Error()
		}
		bs = append(bs, b)
	}
	if err := e.Close(); err != nil {
		return "error " + err.Error()
	}
	var completed, ended, pending int
	for _, b := range bs {
		st := b.Status()
		if st.State == engine.Pending {
			pending += st.Tasks - st.Completed - st.Failed
		}
		completed += st.Completed
		ended += st.Completed + st.Failed
	}
	fillBytes(buf[:uint64(n)*size], canary)
	return fmt.Sprintf("ok %d %d %d", completed, ended, pending)
}

func fillBytes(b []byte, v byte) {
	for i := range b {
		b[i] = v
	}
}

func firstNotByte(b []byte, v byte) int {
	for i, x := range b {
		if x != v {
			return i
		}
	}
	return -1
}

// hammer writes 16 blocks of 4 KiB over the target buffer, batch after batch,
// counting completions and failures by code, until stop.
func hammer(e *engine.Engine, seg *engine.Segment, local, remote, n uint64, stop *atomic.Bool, rep *hammerReport) {
	const per, bs = 16, 4096
	fail := func(err error) {
		rep.Failed++
		rep.Codes[errs.CodeOf(err).String()]++
		time.Sleep(50 * time.Microsecond)
	}
	for k := uint64(0); !stop.Load(); k++ {
		b, err := e.AllocateBatch(per)
		if err != nil {
			fail(err)
			continue
		}
		reqs := make([]engine.Request, per)
		for i := range reqs {
			off := ((k*per + uint64(i)) * bs) % (n - bs + 1)
			reqs[i] = engine.Request{Op: engine.Write, Local: local + off, Segment: seg, Remote: remote + off, Length: bs}
		}
		if err := b.Submit(reqs...); err != nil {
			fail(err)
			b.Free()
			continue
		}
		b.Wait(-1)
		for i := range reqs {
			ts, _ := b.TaskStatus(i)
			if ts.State == engine.Completed {
				rep.OK++
			} else {
				fail(ts.Err)
			}
		}
		b.Free()
	}
}

// child is a running initiator process.
type child struct {
	t   *testing.T
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Reader
}

// startInitiator starts an initiator for [addr, +n) of segment target;
// prepare may adjust the command (credentials, say).
func startInitiator(t *testing.T, target string, addr, n uint64, prepare func(*exec.Cmd)) *child {
	t.Helper()
	cmd := testexec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envRole+"=initiator", envTarget+"="+target,
		envAddr+"="+strconv.FormatUint(addr, 10), envLen+"="+strconv.FormatUint(n, 10))
	cmd.Stderr = os.Stderr
	if prepare != nil {
		prepare(cmd)
	}
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &child{t: t, cmd: cmd, in: in, out: bufio.NewReader(out)}
	t.Cleanup(func() {
		in.Close()
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	})
	if l := c.line(); l != "ready" {
		t.Fatalf("initiator said %q", l)
	}
	return c
}

func (c *child) line() string {
	c.t.Helper()
	ch := make(chan string, 1)
	go func() {
		s, _ := c.out.ReadString('\n')
		ch <- strings.TrimSpace(s)
	}()
	select {
	case s := <-ch:
		return s
	case <-time.After(30 * time.Second):
		c.t.Fatal("initiator did not answer within 30s")
		return ""
	}
}

// do sends one command and returns the answer line.
func (c *child) do(format string, args ...any) string {
	c.t.Helper()
	if _, err := fmt.Fprintf(c.in, format+"\n", args...); err != nil {
		c.t.Fatal(err)
	}
	return c.line()
}

func (c *child) stats() map[string]map[string]uint64 {
	c.t.Helper()
	var s map[string]map[string]uint64
	if err := json.Unmarshal([]byte(c.do("stats")), &s); err != nil {
		c.t.Fatal(err)
	}
	return s
}

func (c *child) signal(s syscall.Signal) {
	if err := c.cmd.Process.Signal(s); err != nil {
		c.t.Fatal(err)
	}
}
