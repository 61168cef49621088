package lab_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tecache/te/cmd/te-sidecar/rendezvous"
	"github.com/tecache/te/cmd/te-sidecar/sidecar"
	"github.com/tecache/te/engine"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/testexec"
	"github.com/tecache/te/kvcache/handoff"
	"github.com/tecache/te/kvcache/kvtest"
	"github.com/tecache/te/tests/lab"
)

// The test binary started with envRole set plays a part of a handoff in a
// lab host: "sidecar" is a te-sidecar on the host's address and port
// sidecarPort; "kv" is an engine on the host's address with a KV cache of
// kvShape and a handoff client of the sidecar at envSidecar, driven by
// one-line commands (runKV).
const (
	envRole     = "TE_LAB_ROLE"
	envSidecar  = "TE_LAB_SIDECAR"
	sidecarPort = 18080
)

var kvShape = kvtest.Llama3_8B(64) // 2 MiB a block over 32 layers, K and V

// The handoff's timing in the lab: the engines end a silent transfer after
// the progress timeout and any after handoffEnv's transfer timeout, so the
// sidecar may settle an expired transfer whose mover never reported after
// settleGrace, which must be longer.
const settleGrace = 10 * time.Second

var handoffEnv = []string{"TE_PROGRESS_TIMEOUT=2s", "TE_TRANSFER_TIMEOUT=8s"}

// runRole runs the part envRole names.
func runRole(role, addr string) int {
	switch role {
	case "sidecar":
		ln, err := net.Listen("tcp", net.JoinHostPort(addr, strconv.Itoa(sidecarPort)))
		if err != nil {
			fmt.Fprintln(os.Stderr, "sidecar:", err)
			return 1
		}
		fmt.Println("ready")
		cfg := sidecar.Config{Handoff: rendezvous.Config{SettleGrace: settleGrace}}
		if err := sidecar.New(cfg).Serve(ln); err != nil {
			fmt.Fprintln(os.Stderr, "sidecar:", err)
			return 1
		}
		return 0
	case "kv":
		return runKV(addr)
	}
	fmt.Fprintf(os.Stderr, "unknown role %q\n", role)
	return 2
}

// kvAnswer is one answer of a kv peer.
type kvAnswer struct {
	Segment   string `json:"segment,omitempty"`
	Code      string `json:"code,omitempty"`
	Err       string `json:"err,omitempty"`
	ElapsedMS int64  `json:"elapsed_ms"`
	Bytes     uint64 `json:"bytes"`
	Bad       int    `json:"bad"`
}

// runKV serves, one at a time:
//
//	expect ID PEER TIMEOUT_MS B1,B2,...   declare the blocks to receive (decode)
//	ready ID PEER TIMEOUT_MS B1,B2,...    declare the blocks ready (prefill)
//	wait ID                               wait for the transfer's end
//	fill B1,B2,...                        write the pattern into blocks
//	clear                                 zero the cache
//	check SRC1,... DST1,...               count words of DST unlike SRC's pattern
func runKV(addr string) int {
	e, err := engine.New(engine.Config{ListenAddr: addr + ":0", Hostname: addr, ForceTransport: "tcp"})
	if err != nil {
		fmt.Fprintln(os.Stderr, "kv:", err)
		return 1
	}
	defer e.Close()
	cache, err := kvtest.New(kvShape)
	if err != nil {
		fmt.Fprintln(os.Stderr, "kv:", err)
		return 1
	}
	defer cache.Free()
	if err := cache.Register(e); err != nil {
		fmt.Fprintln(os.Stderr, "kv:", err)
		return 1
	}
	c, err := handoff.New(e, handoff.Options{Sidecar: os.Getenv(envSidecar)})
	if err != nil {
		fmt.Fprintln(os.Stderr, "kv:", err)
		return 1
	}
	defer c.Close()
	out := json.NewEncoder(os.Stdout)
	out.Encode(kvAnswer{Segment: e.Name()})
	transfers := map[string]*handoff.Transfer{}
	blocks := func(s string) []int {
		var b []int
		for _, f := range strings.Split(s, ",") {
			if n, err := strconv.Atoi(f); err == nil {
				b = append(b, n)
			}
		}
		return b
	}
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		var a kvAnswer
		fail := func(err error) {
			if err != nil {
				a.Code, a.Err = errs.CodeOf(err).String(), err.Error()
			}
		}
		t0 := time.Now()
		switch {
		case len(f) == 5 && (f[0] == "expect" || f[0] == "ready"):
			ms, _ := strconv.Atoi(f[3])
			r := handoff.Request{ID: f[1], Layout: &cache.Layout, Blocks: blocks(f[4]), Peer: f[2],
				Timeout: time.Duration(ms) * time.Millisecond}
			var t *handoff.Transfer
			if f[0] == "expect" {
				t, err = c.Expect(context.Background(), r)
			} else {
				t, err = c.Ready(context.Background(), r)
			}
			fail(err)
			if err == nil {
				transfers[f[1]] = t
			}
		case len(f) == 2 && f[0] == "wait":
			if t := transfers[f[1]]; t == nil {
				fail(errs.New(errs.NotFound, "kv", "no transfer %q", f[1]))
			} else {
				res, err := t.Wait(context.Background())
				a.Bytes = res.Bytes
				fail(err)
			}
		case len(f) == 2 && f[0] == "fill":
			cache.Fill(blocks(f[1]))
		case len(f) == 1 && f[0] == "clear":
			cache.Clear(0)
		case len(f) == 3 && f[0] == "check":
			a.Bad, a.Err = cache.Check(blocks(f[1]), blocks(f[2]), 0)
		default:
			fail(errs.New(errs.InvalidArgument, "kv", "bad command %q", sc.Text()))
		}
		a.ElapsedMS = time.Since(t0).Milliseconds()
		out.Encode(a)
	}
	return 0
}

// kvPeer is a kv peer as the test sees it.
type kvPeer struct {
	t       *testing.T
	host    *lab.Host
	in      *os.File
	out     chan kvAnswer
	segment string
}

func startRole(t *testing.T, h *lab.Host, role string, env ...string) (*lab.Proc, *bufio.Reader, *os.File) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := testexec.Command(exe, "-test.run=^$")
	cmd.Env = append(append(os.Environ(), envRole+"="+role, envPeer+"="+h.Addr(0), "TE_LOG_LEVEL=error"), env...)
	cmd.Stderr = os.Stderr
	inR, inW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdin = inR
	o, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	p := h.Start(t, cmd)
	inR.Close()
	t.Cleanup(func() { inW.Close() })
	return p, bufio.NewReader(o), inW
}

func startKV(t *testing.T, h *lab.Host, sidecarAddr string, env ...string) *kvPeer {
	t.Helper()
	_, out, in := startRole(t, h, "kv", append(env, envSidecar+"="+sidecarAddr)...)
	p := &kvPeer{t: t, host: h, in: in, out: make(chan kvAnswer, 16)}
	go func() {
		dec := json.NewDecoder(out)
		for {
			var a kvAnswer
			if dec.Decode(&a) != nil {
				close(p.out)
				return
			}
			p.out <- a
		}
	}()
	hello := p.answer(60 * time.Second)
	p.segment = hello.Segment
	return p
}

func (p *kvPeer) send(cmd string) {
	p.t.Helper()
	if _, err := fmt.Fprintln(p.in, cmd); err != nil {
		p.t.Fatalf("kv peer %s: %v", p.host.NS, err)
	}
}

func (p *kvPeer) answer(timeout time.Duration) kvAnswer {
	p.t.Helper()
	select {
	case a, ok := <-p.out:
		if !ok {
			p.t.Fatalf("kv peer %s exited", p.host.NS)
		}
		return a
	case <-time.After(timeout):
		p.t.Fatalf("kv peer %s: no answer within %v", p.host.NS, timeout)
		return kvAnswer{}
	}
}

func (p *kvPeer) do(cmd string) kvAnswer {
	p.t.Helper()
	p.send(cmd)
	a := p.answer(60 * time.Second)
	if a.Err != "" && !strings.HasPrefix(cmd, "check") {
		p.t.Fatalf("kv peer %s: %s: %s %s", p.host.NS, cmd, a.Code, a.Err)
	}
	return a
}

func blockList(lo, hi int) string {
	var s []string
	for b := lo; b < hi; b++ {
		s = append(s, strconv.Itoa(b))
	}
	return strings.Join(s, ",")
}

// tryHandoff runs one handoff of blocks [lo, hi) from prefill to decode and
// checks every byte arrived; it returns the first side's error.
func tryHandoff(t *testing.T, prefill, decode *kvPeer, id string, lo, hi int) string {
	t.Helper()
	bl := blockList(lo, hi)
	prefill.do("fill " + bl)
	decode.do("clear") // check wants every other block untouched
	decode.do("expect " + id + " " + prefill.segment + " 30000 " + bl)
	prefill.send("ready " + id + " " + decode.segment + " 30000 " + bl)
	if a := prefill.answer(time.Minute); a.Err != "" {
		// decode's declaration expires; its blocks are not reused here.
		return "ready: " + a.Code + " " + a.Err
	}
	prefill.send("wait " + id)
	decode.send("wait " + id)
	var failed string
	for _, p := range []*kvPeer{prefill, decode} {
		if a := p.answer(2 * time.Minute); a.Err != "" && failed == "" {
			failed = p.host.NS + ": " + a.Code + " " + a.Err
		}
	}
	if failed != "" {
		return failed
	}
	if a := decode.do("check " + bl + " " + bl); a.Bad != 0 {
		t.Fatalf("handoff %s completed with %d words wrong at decode: %s", id, a.Bad, a.Err)
	}
	return ""
}

func handoffOK(t *testing.T, prefill, decode *kvPeer, id string, lo, hi int) {
	t.Helper()
	if err := tryHandoff(t, prefill, decode, id, lo, hi); err != "" {
		t.Fatalf("handoff %s: %s", id, err)
	}
}

// TestHandoffPrefillHostCut runs the prefill-to-decode handoff across three
// hosts (prefill, decode, te-sidecar), links shaped to 200 Mbit, and cuts
// the prefill host off from both others while it pushes 64 MiB of KV: both
// sides' Wait end with an error (none reports success) within the
// transfer's deadline and the sidecar's settle grace, and after the heal
// the same processes hand off again, every byte in place.
func TestHandoffPrefillHostCut(t *testing.T) {
	l := lab.New(t, lab.Options{Hosts: 3, RateMbit: 200})
	sc, out, _ := startRole(t, l.Hosts[2], "sidecar")
	if line, err := out.ReadString('\n'); err != nil || strings.TrimSpace(line) != "ready" {
		t.Fatalf("sidecar: %q %v (%v)", line, err, sc.Err())
	}
	sidecarAddr := net.JoinHostPort(l.Hosts[2].Addr(0), strconv.Itoa(sidecarPort))
	prefill := startKV(t, l.Hosts[0], sidecarAddr, handoffEnv...)
	decode := startKV(t, l.Hosts[1], sidecarAddr, handoffEnv...)
	handoffOK(t, prefill, decode, "warm", 0, 2)

	// 32 blocks: 64 MiB, about 3 s at 200 Mbit.
	const deadline = 10 * time.Second
	bl := blockList(8, 40)
	prefill.do("fill " + bl)
	decode.do("expect cut " + prefill.segment + " " + strconv.Itoa(int(deadline.Milliseconds())) + " " + bl)
	prefill.do("ready cut " + decode.segment + " " + strconv.Itoa(int(deadline.Milliseconds())) + " " + bl)
	start := time.Now()
	prefill.send("wait cut")
	decode.send("wait cut")
	time.Sleep(time.Second) // mid-stream
	l.Partition([]int{0}, []int{1, 2})
	cutAt := time.Since(start)
	for _, p := range []*kvPeer{decode, prefill} {
		a := p.answer(deadline + settleGrace + 2*slack)
		took := time.Since(start)
		t.Logf("%s: Wait ended after %v (cut at %v): %s %s", p.host.NS, took.Round(time.Millisecond), cutAt.Round(time.Millisecond), a.Code, a.Err)
		if a.Err == "" {
			t.Fatalf("%s: the handoff cut mid-stream reported success (%d bytes)", p.host.NS, a.Bytes)
		}
		// Decode may reuse its blocks only once the mover is known to be
		// done: at its deadline plus the sidecar's grace at the latest.
		if took > deadline+settleGrace+slack {
			t.Fatalf("%s: Wait took %v, past the transfer's %v deadline and the %v grace plus %v", p.host.NS, took, deadline, settleGrace, slack)
		}
	}

	// After the heal the same processes hand off again, at the first try:
	// a control connection from before the cut whose TCP retransmissions
	// are still backed off is cut after the progress timeout, and the
	// descriptor fetch goes again on a fresh one within its RPC timeout.
	l.Heal()
	healed := time.Now()
	if err := tryHandoff(t, prefill, decode, "after", 48, 52); err != "" {
		t.Fatalf("handoff after the heal: %s", err)
	}
	t.Logf("handoff after the heal: done %v after it", time.Since(healed).Round(time.Millisecond))
}
