package fanin

import (
	"bufio"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tecache/te/engine"
	_ "github.com/tecache/te/engine/std"
	"github.com/tecache/te/internal/sys/mem"
)

const (
	block = 64 << 10

	envChild = "TE_FANIN_CHILD" // set in a child: "segment first count idle-ms"
)

// idleFor is the prefill engines' peer_idle_timeout, how long an idle fleet
// keeps its connections: longer than a fleet of n takes to start and write
// on two cores, so that the decode side is measured with all of them held.
func idleFor(n int) time.Duration { return time.Duration(max(2, n/50)) * time.Second }

func TestMain(m *testing.M) {
	if v := os.Getenv(envChild); v != "" {
		os.Exit(child(v))
	}
	os.Exit(m.Run())
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

func newEngine(l engine.Limits) (*engine.Engine, error) {
	return engine.New(engine.Config{
		ListenAddr: "127.0.0.1:0", Hostname: "127.0.0.1", Transports: []string{"tcp"},
		Limits: l, Logger: slog.New(slog.DiscardHandler),
	})
}

// child runs count prefill engines: it creates them all, opens the decode
// segment from each, says "ready", waits for "go" on stdin, writes each
// engine's block (engine first+i writes block first+i, every byte first+i
// mod 251) concurrently and prints "done ID MICROSECONDS" per engine, then
// stays until stdin closes.
func child(arg string) int {
	var seg string
	var first, count int
	var idleMS int64
	if _, err := fmt.Sscan(arg, &seg, &first, &count, &idleMS); err != nil {
		fmt.Println("error", err)
		return 2
	}
	type peer struct {
		e   *engine.Engine
		s   *engine.Segment
		buf []byte
	}
	peers := make([]peer, count)
	defer func() {
		for _, p := range peers {
			if p.e != nil {
				p.e.Close()
			}
		}
	}()
	for i := range peers {
		e, err := newEngine(engine.Limits{PeerIdleTimeout: time.Duration(idleMS) * time.Millisecond})
		if err != nil {
			fmt.Println("error", err)
			return 1
		}
		buf := mem.MustAlloc(block)
		for j := range buf {
			buf[j] = byte((first + i) % 251)
		}
		if err := e.RegisterMemory(mem.Addr(buf), block, "cpu:0", false); err != nil {
			fmt.Println("error", err)
			return 1
		}
		s, err := e.OpenSegment(seg)
		if err != nil {
			fmt.Println("error", err)
			return 1
		}
		peers[i] = peer{e, s, buf}
	}
	in := bufio.NewReader(os.Stdin)
	fmt.Println("ready")
	if l, _ := in.ReadString('\n'); strings.TrimSpace(l) != "go" {
		return 1
	}
	d, err := peers[0].s.Descriptor()
	if err != nil || len(d.Buffers) == 0 {
		fmt.Println("error descriptor", err)
		return 1
	}
	base := d.Buffers[0].Addr
	var mu sync.Mutex
	var wg sync.WaitGroup
	t0 := time.Now()
	for i, p := range peers {
		wg.Go(func() {
			line := ""
			b, err := p.e.AllocateBatch(1)
			if err == nil {
				err = b.Submit(engine.Request{Op: engine.Write, Local: mem.Addr(p.buf), Segment: p.s,
					Remote: base + uint64(first+i)*block, Length: block})
				if err == nil {
					var st engine.BatchStatus
					if st, err = b.Wait(2 * time.Minute); err == nil && st.State != engine.Completed {
						err = fmt.Errorf("%v: %v", st.State, st.Err)
					}
				}
				b.Free()
			}
			if err != nil {
				line = fmt.Sprintf("error %d %v", first+i, err)
			} else {
				line = fmt.Sprintf("done %d %d", first+i, time.Since(t0).Microseconds())
			}
			mu.Lock()
			fmt.Println(line)
			mu.Unlock()
		})
	}
	wg.Wait()
	io.Copy(io.Discard, in) // idle until the parent closes stdin
	return 0
}

// usage is what the decode side holds.
type usage struct {
	rssKiB, fds, goroutines, threads, accepted, ctrlConns int
}

func measure(t *testing.T, e *engine.Engine) usage {
	t.Helper()
	var u usage
	st, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(st), "\n") {
		f := strings.Fields(l)
		if len(f) < 2 {
			continue
		}
		switch f[0] {
		case "VmRSS:":
			u.rssKiB, _ = strconv.Atoi(f[1])
		case "Threads:":
			u.threads, _ = strconv.Atoi(f[1])
		}
	}
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	u.fds = len(fds)
	u.goroutines = runtime.NumGoroutine()
	s := e.Stats()
	u.accepted = s.Live["tcp"].ConnsAccepted
	u.ctrlConns = s.Control.ConnsOpen
	return u
}

func TestFanIn(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	n, procs := envInt("TE_FANIN_PEERS", 64), envInt("TE_FANIN_PROCS", 2)
	procs = min(procs, n)
	idle := idleFor(n)
	// Every peer here shares one address, 127.0.0.1, which the per-host
	// limit (256 connections) is meant for; the engine-wide limits stay
	// the defaults.
	dec, err := newEngine(engine.Limits{MaxConnsPerHost: 4*n + 16})
	if err != nil {
		t.Fatal(err)
	}
	defer dec.Close()
	buf := mem.MustAlloc(n * block)
	defer mem.Free(buf)
	if err := dec.RegisterMemory(mem.Addr(buf), uint64(len(buf)), "cpu:0", true); err != nil {
		t.Fatal(err)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	base := measure(t, dec)

	type proc struct {
		cmd *exec.Cmd
		in  io.WriteCloser
		out *bufio.Scanner
	}
	var ps []proc
	defer func() {
		for _, p := range ps {
			p.in.Close()
			p.cmd.Process.Kill()
			p.cmd.Wait()
		}
	}()
	for k := 0; k < procs; k++ {
		first, count := k*n/procs, (k+1)*n/procs-k*n/procs
		cmd := exec.Command(exe, "-test.run=^$")
		cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s %d %d %d", envChild, dec.Name(), first, count, idle.Milliseconds()))
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
		ps = append(ps, proc{cmd, in, bufio.NewScanner(out)})
	}
	// Each child's lines arrive on one channel; every wait is bounded.
	lines := make(chan string, 2*n+procs)
	for _, p := range ps {
		go func() {
			for p.out.Scan() {
				lines <- p.out.Text()
			}
			lines <- "eof"
		}()
	}
	next := func(what string) string {
		select {
		case l := <-lines:
			return l
		case <-time.After(5 * time.Minute):
			t.Fatalf("no line from the prefill processes while waiting for %s", what)
			return ""
		}
	}
	setup := time.Now()
	for ready := 0; ready < procs; {
		switch l := next("ready"); {
		case l == "ready":
			ready++
		default:
			t.Fatalf("a prefill process: %s", l)
		}
	}
	opened := measure(t, dec) // every prefill engine has fetched the descriptor
	t.Logf("%d prefill engines in %d processes created and opened the decode segment in %v", n, procs, time.Since(setup).Round(time.Millisecond))
	goAt := time.Now()
	for _, p := range ps {
		fmt.Fprintln(p.in, "go")
	}
	var took []time.Duration
	for len(took) < n {
		l := next("the writes")
		var id int
		var us int64
		if _, err := fmt.Sscanf(l, "done %d %d", &id, &us); err != nil {
			t.Fatalf("a prefill engine: %s", l)
		}
		took = append(took, time.Duration(us)*time.Microsecond)
	}
	peak := measure(t, dec)
	for i := 0; i < n; i++ {
		want := byte(i % 251)
		for _, b := range buf[i*block : (i+1)*block] {
			if b != want {
				t.Fatalf("block %d holds %#x, want %#x", i, b, want)
			}
		}
	}
	slices.Sort(took)
	per := func(v, b int) float64 { return float64(v-b) / float64(n) }
	base.fds += 3 * procs // the test's pipes and pidfds, not the engine's
	t.Logf("time from go to each peer's completed %d KiB write: p50 %v, p99 %v, last %v",
		block>>10, took[n/2], took[n*99/100], took[n-1])
	t.Logf("decode side per peer: %.1f KiB memory, %.2f fds, %.2f goroutines, %.3f threads, %.2f tcp connections accepted, %.2f control connections (baseline rss %d KiB, %d fds, %d goroutines, %d threads; after opening: %.2f fds, %.2f control connections per peer)",
		per(peak.rssKiB, base.rssKiB), per(peak.fds, base.fds), per(peak.goroutines, base.goroutines), per(peak.threads, base.threads),
		per(peak.accepted, base.accepted), per(peak.ctrlConns, base.ctrlConns), base.rssKiB, base.fds, base.goroutines, base.threads,
		per(opened.fds, base.fds), per(opened.ctrlConns, base.ctrlConns))
	// Bounded per peer: tcp.conns (2) data connections and one control
	// connection, one descriptor each, and no thread per peer.
	if a := peak.accepted - base.accepted; a > 2*n {
		t.Errorf("%d tcp connections accepted from %d peers: more than tcp.conns each", a, n)
	}
	if f := peak.fds - base.fds; f > 3*n {
		t.Errorf("%d descriptors for %d peers", f, n)
	}
	if th := peak.threads - base.threads; th > 16 {
		t.Errorf("%d more threads with %d peers", th, n)
	}
	// Idle: the prefill engines drop their connections after their
	// peer_idle_timeout, and the decode engine gives back what they cost.
	deadline := time.Now().Add(4*idle + 30*time.Second)
	for {
		now := measure(t, dec)
		// The test's own: two pipes and a pidfd per prefill process.
		if now.accepted == base.accepted && now.ctrlConns == base.ctrlConns && now.fds <= base.fds {
			t.Logf("an idle fleet's connections reclaimed %v after the last write", time.Since(goAt.Add(took[n-1])).Round(100*time.Millisecond))
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("idle peers still hold %d tcp and %d control connections, %d fds (baseline %d, %d, %d)",
				now.accepted, now.ctrlConns, now.fds, base.accepted, base.ctrlConns, base.fds)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
