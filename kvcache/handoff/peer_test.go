package handoff_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/tecache/te/cmd/te-sidecar/sidecar"
	"github.com/tecache/te/engine"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/kvcache"
	"github.com/tecache/te/kvcache/handoff"
	"github.com/tecache/te/kvcache/kvtest"
)

// The test binary re-executed with envPeer set is the other process of a
// handoff: an engine, a cache and a client driven by JSON commands on stdin.
const (
	envPeer      = "TE_HANDOFF_PEER"
	envSidecar   = "TE_HANDOFF_SIDECAR"
	envTransport = "TE_HANDOFF_TRANSPORT"
	envShape     = "TE_HANDOFF_SHAPE"
	envLostGrace = "TE_HANDOFF_LOST_GRACE"
)

func TestMain(m *testing.M) {
	if os.Getenv(envPeer) != "" {
		os.Exit(runPeer())
	}
	goleak.VerifyTestMain(m,
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*workerPool).Start.func2"),
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.updateServerDate.func1"))
}

// command is one line to the peer process.
type command struct {
	Seq     int    `json:"seq"`
	Op      string `json:"op"` // expect, ready, wait, abort, status, fill, check, windowpeer
	ID      string `json:"id,omitempty"`
	Blocks  []int  `json:"blocks,omitempty"`
	Src     []int  `json:"src,omitempty"` // check: the source blocks
	Mode    string `json:"mode,omitempty"`
	Timeout int64  `json:"timeout_ms,omitempty"`
	Reason  string `json:"reason,omitempty"`
	// raw: READ from the peer (Segment, Layout, Src) into Blocks as one
	// batch of the plan's requests, or of 4 MiB requests when Contig.
	// expect, ready: Segment is the other side's (handoff.Request.Peer).
	Segment string          `json:"segment,omitempty"`
	Layout  *kvcache.Layout `json:"layout,omitempty"`
	Contig  bool            `json:"contig,omitempty"`
}

// answer is one line from the peer process.
type answer struct {
	Seq     int             `json:"seq"`
	Segment string          `json:"segment,omitempty"`
	Code    errs.Code       `json:"code"`
	Err     string          `json:"err,omitempty"`
	Result  handoff.Result  `json:"result"`
	Status  handoff.Status  `json:"status"`
	Bad     int             `json:"bad"`
	First   string          `json:"first,omitempty"`
	Stats   engine.Stats    `json:"stats"`
	Elapsed time.Duration   `json:"elapsed"`          // raw
	Layout  *kvcache.Layout `json:"layout,omitempty"` // hello: the peer's cache
	// Window: expect, ready: the key of the window the transfer granted
	// over this side's blocks; windowpeer: Segment is whom it is bound to.
	Window uint64 `json:"window,omitempty"`
}

// side is one end of a handoff: an engine, its cache and a client.
type side struct {
	e     *engine.Engine
	cache *kvtest.Cache
	c     *handoff.Client
}

func newSide(sidecarAddr, transport string, shape kvtest.Shape, lostGrace time.Duration) (*side, error) {
	e, err := engine.New(engine.Config{ListenAddr: "127.0.0.1:0", Hostname: "127.0.0.1",
		Transports: []string{"shm", "tcp"}, ForceTransport: transport, TransferTimeout: 20 * time.Second,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		return nil, err
	}
	cache, err := kvtest.New(shape)
	if err != nil {
		e.Close()
		return nil, err
	}
	if err := cache.Register(e); err != nil {
		e.Close()
		cache.Free()
		return nil, err
	}
	c, err := handoff.New(e, handoff.Options{Sidecar: sidecarAddr, LostGrace: lostGrace})
	if err != nil {
		e.Close()
		cache.Free()
		return nil, err
	}
	return &side{e: e, cache: cache, c: c}, nil
}

func (s *side) close() {
	s.c.Close()
	s.e.Close()
	s.cache.Free()
}

func runPeer() int {
	var shape kvtest.Shape
	if err := json.Unmarshal([]byte(os.Getenv(envShape)), &shape); err != nil {
		fmt.Fprintln(os.Stderr, "peer: shape:", err)
		return 2
	}
	grace, _ := time.ParseDuration(os.Getenv(envLostGrace))
	s, err := newSide(os.Getenv(envSidecar), os.Getenv(envTransport), shape, grace)
	if err != nil {
		fmt.Fprintln(os.Stderr, "peer:", err)
		return 1
	}
	defer s.close()
	var wmu sync.Mutex
	out := json.NewEncoder(os.Stdout)
	reply := func(a answer) {
		wmu.Lock()
		defer wmu.Unlock()
		out.Encode(a)
	}
	reply(answer{Segment: s.e.Name(), Layout: &s.cache.Layout})
	var mu sync.Mutex
	transfers := map[string]*handoff.Transfer{}
	var wg sync.WaitGroup
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		var c command
		if err := json.Unmarshal(sc.Bytes(), &c); err != nil {
			reply(answer{Code: errs.InvalidArgument, Err: err.Error()})
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			a := answer{Seq: c.Seq}
			fail := func(err error) {
				if err != nil {
					a.Code, a.Err = errs.CodeOf(err), err.Error()
				}
			}
			ctx := context.Background()
			mu.Lock()
			t := transfers[c.ID]
			mu.Unlock()
			switch c.Op {
			case "expect", "ready":
				r := handoff.Request{ID: c.ID, Layout: &s.cache.Layout, Blocks: c.Blocks, Mode: handoff.Mode(c.Mode),
					Timeout: time.Duration(c.Timeout) * time.Millisecond, Peer: c.Segment}
				var err error
				if c.Op == "expect" {
					t, err = s.c.Expect(ctx, r)
				} else {
					t, err = s.c.Ready(ctx, r)
				}
				fail(err)
				if err == nil {
					a.Window = handoff.WindowOf(t)
					mu.Lock()
					transfers[c.ID] = t
					mu.Unlock()
				}
			case "wait":
				if t == nil {
					fail(errs.New(errs.NotFound, "peer", "no transfer %q", c.ID))
					break
				}
				res, err := t.Wait(ctx)
				a.Result = res
				fail(err)
			case "abort":
				if t == nil {
					fail(errs.New(errs.NotFound, "peer", "no transfer %q", c.ID))
					break
				}
				fail(t.Abort(ctx, c.Reason))
			case "status":
				st, err := t.Status(ctx)
				a.Status = st
				fail(err)
			case "fill":
				s.cache.Fill(c.Blocks)
			case "clear":
				s.cache.Clear(0)
			case "check":
				a.Bad, a.First = s.cache.Check(c.Src, c.Blocks, 0)
			case "raw":
				d, err := rawRead(s, c)
				a.Elapsed = d
				fail(err)
			case "stats":
				a.Stats = s.e.Stats()
			case "windowpeer":
				if t == nil {
					fail(errs.New(errs.NotFound, "peer", "no transfer %q", c.ID))
					break
				}
				p, err := s.e.WindowPeer(handoff.WindowOf(t))
				a.Segment = p
				fail(err)
			default:
				fail(errs.New(errs.InvalidArgument, "peer", "unknown op %q", c.Op))
			}
			reply(a)
		}()
	}
	wg.Wait()
	return 0
}

// child is the peer process as the test sees it.
type child struct {
	t       testing.TB
	cmd     *exec.Cmd
	in      io.WriteCloser
	segment string
	layout  *kvcache.Layout

	mu      sync.Mutex
	seq     int
	waiters map[int]chan answer
	done    chan struct{}
}

func startChild(t testing.TB, sidecarAddr, transport string, shape kvtest.Shape, lostGrace time.Duration) *child {
	t.Helper()
	sh, _ := json.Marshal(shape)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envPeer+"=1", envSidecar+"="+sidecarAddr, envTransport+"="+transport,
		envShape+"="+string(sh), envLostGrace+"="+lostGrace.String())
	cmd.Stderr = os.Stderr
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
	c := &child{t: t, cmd: cmd, in: in, waiters: map[int]chan answer{}, done: make(chan struct{})}
	hello := make(chan answer, 1)
	go func() {
		defer close(c.done)
		dec := json.NewDecoder(out)
		first := true
		for {
			var a answer
			if err := dec.Decode(&a); err != nil {
				return
			}
			if first {
				first = false
				hello <- a
				continue
			}
			c.mu.Lock()
			ch := c.waiters[a.Seq]
			delete(c.waiters, a.Seq)
			c.mu.Unlock()
			if ch != nil {
				ch <- a
			}
		}
	}()
	t.Cleanup(func() {
		in.Close()
		select {
		case <-c.done:
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
			t.Error("peer process did not exit")
		}
		cmd.Wait()
	})
	select {
	case a := <-hello:
		c.segment, c.layout = a.Segment, a.Layout
	case <-time.After(20 * time.Second):
		cmd.Process.Kill()
		t.Fatal("peer process did not start")
	}
	return c
}

// send sends c and returns a channel for its answer.
func (c *child) send(cmd command) <-chan answer {
	c.mu.Lock()
	c.seq++
	cmd.Seq = c.seq
	ch := make(chan answer, 1)
	c.waiters[cmd.Seq] = ch
	c.mu.Unlock()
	b, _ := json.Marshal(cmd)
	if _, err := c.in.Write(append(b, '\n')); err != nil {
		c.t.Fatal(err)
	}
	return ch
}

// get waits for an answer.
func (c *child) get(ch <-chan answer) answer {
	c.t.Helper()
	select {
	case a := <-ch:
		return a
	case <-time.After(60 * time.Second):
		c.t.Fatal("no answer from the peer process")
	}
	return answer{}
}

// do sends cmd and waits for its answer.
func (c *child) do(cmd command) answer {
	c.t.Helper()
	return c.get(c.send(cmd))
}

// sidecarProc is a te-sidecar server in this process on 127.0.0.1; restart
// stops it and starts a new one (a new instance) on the same address.
type sidecarProc struct {
	t    testing.TB
	addr string
	srv  *sidecar.Server
	errc chan error
	cfg  sidecar.Config
}

func startSidecar(t testing.TB) *sidecarProc {
	return startSidecarWith(t, sidecar.Config{})
}

func startSidecarWith(t testing.TB, cfg sidecar.Config) *sidecarProc {
	t.Helper()
	s := &sidecarProc{t: t, cfg: cfg}
	s.serve("127.0.0.1:0")
	t.Cleanup(s.stop)
	return s
}

func (s *sidecarProc) serve(addr string) {
	var ln net.Listener
	var err error
	for i := 0; i < 50; i++ { // the old listener's port may take a moment
		if ln, err = net.Listen("tcp", addr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		s.t.Fatal(err)
	}
	s.addr = ln.Addr().String()
	s.srv = sidecar.New(s.cfg)
	s.errc = make(chan error, 1)
	go func() { s.errc <- s.srv.Serve(ln) }()
}

func (s *sidecarProc) stop() {
	if s.srv == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s.srv.Shutdown(ctx)
	if err := <-s.errc; err != nil {
		s.t.Error(err)
	}
	s.srv = nil
}

func (s *sidecarProc) restart() {
	s.stop()
	s.serve(s.addr)
}

// newLocal starts this process's side and closes it at the end of the test.
func newLocal(t testing.TB, sc *sidecarProc, transport string, shape kvtest.Shape, lostGrace time.Duration) *side {
	t.Helper()
	s, err := newSide(sc.addr, transport, shape, lostGrace)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.close)
	return s
}

func wantCode(t *testing.T, what string, err error, code errs.Code) {
	t.Helper()
	if errs.CodeOf(err) != code {
		t.Fatalf("%s: got %v (code %v), want code %v", what, err, errs.CodeOf(err), code)
	}
}

// rawRead is the pull benchmark's reference on the reading side: the same
// bytes read from the peer with one engine batch, no sidecar.
func rawRead(s *side, c command) (time.Duration, error) {
	seg, err := s.e.OpenSegment(c.Segment)
	if err != nil {
		return 0, err
	}
	defer s.e.CloseSegment(seg)
	var rs []engine.Request
	if c.Contig {
		p, err := kvcache.NewPlan(c.Layout, &s.cache.Layout, c.Src, c.Blocks, kvcache.LayerRange{})
		if err != nil {
			return 0, err
		}
		// Local is this side's memory, the peer's layout is the remote.
		rs = contiguous(s.cache, c.Layout, seg, engine.Read, p.Stats().Bytes)
	} else {
		p, err := kvcache.NewPlan(c.Layout, &s.cache.Layout, c.Src, c.Blocks, kvcache.LayerRange{})
		if err != nil {
			return 0, err
		}
		if rs, err = kvcache.EngineRequests(p.Transfers(), seg, engine.Read); err != nil {
			return 0, err
		}
	}
	b, err := s.e.AllocateBatch(len(rs))
	if err != nil {
		return 0, err
	}
	defer b.Free()
	t0 := time.Now()
	if err := b.Submit(rs...); err != nil {
		return 0, err
	}
	st, err := b.Wait(-1)
	d := time.Since(t0)
	if err == nil && st.State != engine.Completed {
		err = st.Err
	}
	return d, err
}
