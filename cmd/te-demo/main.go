// Command te-demo runs a prefill-to-decode KV-cache handoff on this machine:
// it starts te-sidecar and two processes, prefill and decode, each with its
// own engine and a Llama-3-8B-shaped KV cache (32 layers, 8 KV heads, head
// dim 128, bf16, 16-token blocks). Prefill fills the blocks of a 4096-token
// prompt (non-contiguous block ids) with a known pattern and hands them off
// through the sidecar; decode checks every byte of its cache. It prints the
// bytes moved, the requests before and after coalescing, the time, GB/s and
// the transport, and exits non-zero on any mismatch or failure.
//
// Metadata is peer-to-peer: no metadata server. The sidecar and both
// processes run with a cluster secret (a random one, or the one in
// TE_AUTH_SECRET_FILE or TE_AUTH_SECRET), as a deployment should, and
// te-demo checks that the sidecar refuses a request without its token;
// -secret=false runs without one. `make demo` builds and runs it; run
// te-demo -h for the flags.
package main

import (
	_ "github.com/tecache/te/engine/std"

	"bufio"
	"context"
	crand "crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/tecache/te/engine"
	"github.com/tecache/te/internal/authsecret"
	"github.com/tecache/te/internal/sys/mem"
	"github.com/tecache/te/internal/tlog"
	"github.com/tecache/te/kvcache/handoff"
	"github.com/tecache/te/kvcache/kvtest"
)

type options struct {
	role       string
	sidecarBin string
	sidecar    string
	transport  string
	modes      string
	layered    bool
	tokens     int
	layers     int
	seed       uint64
	id         string
	corrupt    bool
	secret     bool
}

func main() {
	var o options
	flag.StringVar(&o.role, "role", "", "internal: run as the prefill or decode process")
	flag.StringVar(&o.sidecarBin, "sidecar-bin", "", "te-sidecar binary (default: next to te-demo, else on PATH)")
	flag.StringVar(&o.sidecar, "sidecar", "", "internal: the sidecar's host:port")
	flag.StringVar(&o.transport, "transport", "", "force a transport (shm or tcp); default: the engine's choice")
	flag.StringVar(&o.modes, "modes", "push,pull", "handoff modes to run, in order: push (prefill writes) and/or pull (decode reads)")
	flag.BoolVar(&o.layered, "layered", true, "push layer by layer, overlapping the transfer with the (simulated) prefill")
	flag.IntVar(&o.tokens, "tokens", 4096, "prompt length in tokens")
	flag.IntVar(&o.layers, "layers", 32, "layers (32 for Llama-3-8B; fewer for a quick run)")
	flag.Uint64Var(&o.seed, "seed", 1, "seed of the block id choice")
	flag.StringVar(&o.id, "id", "", "internal: transfer id")
	flag.BoolVar(&o.corrupt, "corrupt", false, "flip one byte on decode before the check (shows that a mismatch fails)")
	flag.BoolVar(&o.secret, "secret", true, "run with a random cluster secret (unless "+authsecret.EnvSecretFile+" or "+
		authsecret.EnvSecret+" gives one), which te-sidecar and both processes read from "+authsecret.EnvSecretFile)
	version := flag.Bool("version", false, "print te's version and exit")
	flag.Parse()
	if *version {
		fmt.Println("te-demo", engine.Version)
		return
	}
	var err error
	switch o.role {
	case "":
		err = drive(o)
	case "prefill":
		err = prefill(o)
	case "decode":
		err = decode(o)
	default:
		err = fmt.Errorf("unknown role %q", o.role)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "te-demo%s: %v\n", map[bool]string{true: " " + o.role}[o.role != ""], err)
		os.Exit(1)
	}
}

// plan is what both roles derive from the shared options.
type plan struct {
	prefill, decode kvtest.Shape
	src, dst        []int
}

func makePlan(o options) (plan, error) {
	if o.tokens <= 0 || o.layers <= 0 {
		return plan{}, errors.New("tokens and layers must be positive")
	}
	n := (o.tokens + 15) / 16
	p := plan{prefill: kvtest.Llama3_8B(n + n/4 + 1), decode: kvtest.Llama3_8B(2*n + 1)}
	p.prefill.Layers, p.decode.Layers = o.layers, o.layers
	r := rand.New(rand.NewPCG(o.seed, 7))
	p.src = kvtest.Blocks(n, p.prefill.Blocks, r)
	p.dst = kvtest.Blocks(n, p.decode.Blocks, r)
	if len(p.src) != n || len(p.dst) != n {
		return plan{}, errors.New("not enough blocks")
	}
	return p, nil
}

// report is what a role prints as its last stdout line.
type report struct {
	Role      string         `json:"role"`
	Result    handoff.Result `json:"result"`
	Start     int64          `json:"start_unix_ns"` // prefill: Ready called
	End       int64          `json:"end_unix_ns"`   // decode: Wait returned
	Checked   uint64         `json:"checked_bytes"`
	Bad       int            `json:"bad_words"`
	First     string         `json:"first_bad,omitempty"`
	Segment   string         `json:"segment"`
	Compute   time.Duration  `json:"compute_ns"`         // prefill: writing the layers (the simulated prefill)
	LastLayer int64          `json:"last_layer_unix_ns"` // prefill: last layer submitted
}

func newEngine(o options) (*engine.Engine, error) {
	// Warnings only unless TE_LOG_LEVEL says otherwise: which transports
	// could not start is not the demo's business.
	lo, _, err := tlog.FromEnv(os.Getenv, tlog.Options{Level: slog.LevelWarn})
	if err != nil {
		return nil, err
	}
	log := tlog.New(os.Stderr, lo)
	return engine.New(engine.Config{ListenAddr: "127.0.0.1:0", Hostname: "127.0.0.1", ForceTransport: o.transport,
		TransferTimeout: 30 * time.Second, Logger: log})
}

// role is what each side of the demo sets up the same way: the plan, an
// engine, a registered cache in use, and a handoff client.
type role struct {
	p     plan
	e     *engine.Engine
	c     *kvtest.Cache
	cl    *handoff.Client
	close func()
}

func setup(o options, decode bool) (*role, error) {
	p, err := makePlan(o)
	if err != nil {
		return nil, err
	}
	e, err := newEngine(o)
	if err != nil {
		return nil, err
	}
	shape := p.prefill
	if decode {
		shape = p.decode
	}
	c, err := kvtest.New(shape)
	if err != nil {
		e.Close()
		return nil, err
	}
	c.Clear(0) // a serving cache is in use: its pages exist before any KV
	if err := c.Register(e); err != nil {
		e.Close()
		c.Free()
		return nil, err
	}
	cl, err := handoff.New(e, handoff.Options{Sidecar: o.sidecar})
	if err != nil {
		c.Unregister(e)
		e.Close()
		c.Free()
		return nil, err
	}
	return &role{p: p, e: e, c: c, cl: cl, close: func() {
		cl.Close()
		c.Unregister(e)
		e.Close()
		c.Free()
	}}, nil
}

func prefill(o options) error {
	r, err := setup(o, false)
	if err != nil {
		return err
	}
	defer r.close()
	p, e, c, cl := r.p, r.e, r.c, r.cl
	ctx := context.Background()
	mode := handoff.Mode(o.modes)
	layered := o.layered && mode == handoff.Push
	if !layered {
		c.Fill(p.src) // pull: the KV is complete before Ready
	}
	start := time.Now()
	tx, err := cl.Ready(ctx, handoff.Request{ID: o.id, Layout: &c.Layout, Blocks: p.src, Timeout: 60 * time.Second})
	if err != nil {
		return err
	}
	var compute time.Duration
	if layered {
		// Each layer goes out as soon as it is "computed" (written), so the
		// transfer of layer i overlaps the computation of layer i+1.
		for l := range p.prefill.Layers {
			t0 := time.Now()
			c.FillLayer(l, p.src)
			compute += time.Since(t0)
			if err := tx.SendLayer(ctx, l); err != nil {
				return err
			}
		}
	}
	last := time.Now()
	res, err := tx.Send(ctx)
	if err != nil {
		return err
	}
	return emit(report{Role: "prefill", Result: res, Start: start.UnixNano(), Segment: e.Name(), Compute: compute,
		LastLayer: last.UnixNano()})
}

func decode(o options) error {
	r, err := setup(o, true)
	if err != nil {
		return err
	}
	defer r.close()
	p, e, c, cl := r.p, r.e, r.c, r.cl
	ctx := context.Background()
	tx, err := cl.Expect(ctx, handoff.Request{ID: o.id, Layout: &c.Layout, Blocks: p.dst, Mode: handoff.Mode(o.modes),
		Timeout: 60 * time.Second})
	if err != nil {
		return err
	}
	fmt.Println("expecting") // the driver starts prefill now
	res, err := tx.Wait(ctx)
	end := time.Now()
	if err != nil {
		return err
	}
	if o.corrupt {
		b := c.Layout.Bases[0] + uint64(p.dst[len(p.dst)/2])*p.decode.BlockBytes() + 12345
		flip(b)
	}
	bad, first := c.Check(p.src, p.dst, 0)
	return emit(report{Role: "decode", Result: res, End: end.UnixNano(), Checked: c.Bytes(), Bad: bad, First: first, Segment: e.Name()})
}

// flip inverts one byte of registered memory.
func flip(addr uint64) { mem.Bytes(addr, 1)[0] ^= 0xff }

func emit(r report) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	fmt.Println("REPORT " + string(b))
	return nil
}

// drive starts te-sidecar, then decode and prefill for each mode, and prints
// what happened.
func drive(o options) error {
	bin := o.sidecarBin
	self, err := os.Executable()
	if err != nil {
		return err
	}
	if bin == "" {
		bin = filepath.Join(filepath.Dir(self), "te-sidecar")
		if _, err := os.Stat(bin); err != nil {
			if bin, err = exec.LookPath("te-sidecar"); err != nil {
				return errors.New("no te-sidecar next to te-demo nor on PATH: give -sidecar-bin")
			}
		}
	}
	p, err := makePlan(o)
	if err != nil {
		return err
	}
	if o.secret && os.Getenv(authsecret.EnvSecretFile) == "" && os.Getenv(authsecret.EnvSecret) == "" {
		dir, err := makeSecret()
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
	}
	// te-sidecar and the two processes inherit the environment.
	sec, err := authsecret.Load("", "", os.Getenv)
	if err != nil {
		return err
	}
	addr, stop, err := startSidecar(bin)
	if err != nil {
		return err
	}
	defer stop()
	auth := "no cluster secret"
	if sec != nil {
		if err := refusesWithoutToken(addr); err != nil {
			return err
		}
		auth = "cluster secret: a request without its token is refused with 401"
	}

	blockBytes := p.prefill.BlockBytes()
	fmt.Printf("te demo: Llama-3-8B-shaped KV cache (%d layers, %d KV heads, head dim %d, %s, %d-token blocks)\n",
		p.prefill.Layers, p.prefill.Heads, p.prefill.HeadDim, p.prefill.DType, p.prefill.BlockSize)
	fmt.Printf("  prompt: %d tokens = %d blocks of %d KiB per layer and K/V\n", o.tokens, len(p.src), blockBytes>>10)
	fmt.Printf("  prefill blocks: %s (of %d)\n", sample(p.src), p.prefill.Blocks)
	fmt.Printf("  decode blocks:  %s (of %d)\n", sample(p.dst), p.decode.Blocks)
	fmt.Printf("  te-sidecar on %s (%s); engines on 127.0.0.1 with peer-to-peer metadata (no metadata server)\n", addr, auth)
	failed := false
	for i, mode := range strings.Split(o.modes, ",") {
		mode = strings.TrimSpace(mode)
		if mode != "push" && mode != "pull" {
			return fmt.Errorf("mode %q is neither push nor pull", mode)
		}
		run := o
		run.modes, run.sidecar, run.id = mode, addr, fmt.Sprintf("demo-%d-%s", i, mode)
		if err := runOnce(self, run, p); err != nil {
			fmt.Printf("  %s: FAILED: %v\n", mode, err)
			failed = true
		}
	}
	if failed {
		return errors.New("the handoff failed")
	}
	return nil
}

func runOnce(self string, o options, p plan) error {
	args := func(role string) []string {
		a := []string{"-role", role, "-sidecar", o.sidecar, "-id", o.id, "-modes", o.modes,
			fmt.Sprintf("-layered=%v", o.layered), fmt.Sprintf("-tokens=%d", o.tokens), fmt.Sprintf("-layers=%d", o.layers),
			fmt.Sprintf("-seed=%d", o.seed), fmt.Sprintf("-corrupt=%v", o.corrupt)}
		if o.transport != "" {
			a = append(a, "-transport", o.transport)
		}
		return a
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dec, decOut, err := startRole(ctx, self, args("decode"))
	if err != nil {
		return err
	}
	decWaited := false
	defer func() {
		if !decWaited {
			cancel()
			dec.Wait()
		}
	}()
	// Decode declares first (as a router would have it), then prefill runs.
	if line, err := decOut.ReadString('\n'); err != nil || strings.TrimSpace(line) != "expecting" {
		cancel()
		return fmt.Errorf("decode did not start: %q %v", line, err)
	}
	pre, preOut, err := startRole(ctx, self, args("prefill"))
	if err != nil {
		cancel()
		return err
	}
	pr, perr := readReport(preOut)
	if werr := pre.Wait(); perr == nil && werr != nil {
		perr = fmt.Errorf("prefill: %v", werr)
	}
	if perr != nil {
		cancel() // decode would otherwise wait until the transfer expires
	}
	dr, derr := readReport(decOut)
	decWaited = true
	if werr := dec.Wait(); derr == nil && werr != nil {
		derr = fmt.Errorf("decode: %v", werr)
	}
	if perr != nil {
		return perr
	}
	if derr != nil {
		return derr
	}
	mover := pr.Result
	who := "prefill WRITEs into decode"
	if o.modes == "pull" {
		mover, who = dr.Result, "decode READs from prefill"
	}
	if o.modes == "push" && o.layered {
		who += ", layer by layer"
	}
	e2e := time.Duration(dr.End - pr.Start)
	gbs := func(d time.Duration) float64 { return float64(mover.Bytes) / d.Seconds() / 1e9 }
	fmt.Printf("\n  %s (%s):\n", o.modes, who)
	fmt.Printf("    moved %d bytes (%.1f MiB) over %s\n", mover.Bytes, float64(mover.Bytes)/(1<<20), mover.Transport)
	fmt.Printf("    requests: %d before coalescing, %d after\n", mover.BlockRequests, mover.Requests)
	fmt.Printf("    transfer: %v = %.2f GB/s (first submit to last byte)\n", mover.Elapsed.Round(time.Microsecond), gbs(mover.Elapsed))
	if pr.Compute > 0 {
		fmt.Printf("              (overlapped with prefill writing the layers, the simulated compute: %v;\n", pr.Compute.Round(time.Microsecond))
		fmt.Printf("               decode was notified %v after the last layer was written)\n", time.Duration(dr.End-pr.LastLayer).Round(time.Microsecond))
	}
	fmt.Printf("    handoff:  %v = %.2f GB/s (prefill ready to decode notified, through te-sidecar)\n", e2e.Round(time.Microsecond), gbs(e2e))
	fmt.Printf("    machine:  %s\n", machineLoad())
	if dr.Bad != 0 {
		fmt.Printf("    decode checked %d bytes: %d 8-byte words WRONG; first: %s\n", dr.Checked, dr.Bad, dr.First)
		return errors.New("decode's cache does not hold what prefill sent")
	}
	fmt.Printf("    decode checked all %d bytes of its cache: every byte correct\n", dr.Checked)
	return nil
}

// machineLoad says how busy the machine was, next to the figures: on a
// machine whose cores are taken by other work, GB/s and latencies say more
// about that work than about te.
func machineLoad() string {
	cores := runtime.NumCPU()
	b, err := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if err != nil || len(f) < 3 {
		return fmt.Sprintf("%d cores (load average unknown)", cores)
	}
	s := fmt.Sprintf("load average %s, %s, %s (1, 5, 15 min) on %d cores", f[0], f[1], f[2], cores)
	if l, err := strconv.ParseFloat(f[0], 64); err == nil && l > float64(cores) {
		s += fmt.Sprintf(": busy (%.1f runnable per core), so the figures above are lower than te's on an idle machine", l/float64(cores))
	}
	return s
}

func sample(b []int) string {
	s := fmt.Sprint(b[:min(12, len(b))])
	if len(b) > 12 {
		s = s[:len(s)-1] + " ...]"
	}
	sorted := slices.IsSorted(b)
	return fmt.Sprintf("%d ids %s, sorted=%v", len(b), s, sorted)
}

func startRole(ctx context.Context, self string, args []string) (*exec.Cmd, *bufio.Reader, error) {
	cmd := exec.CommandContext(ctx, self, args...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, nil, err
	}
	return cmd, bufio.NewReader(out), nil
}

func readReport(r *bufio.Reader) (report, error) {
	var rep report
	for {
		line, err := r.ReadString('\n')
		if s, ok := strings.CutPrefix(strings.TrimSpace(line), "REPORT "); ok {
			return rep, json.Unmarshal([]byte(s), &rep)
		}
		if err != nil {
			if err == io.EOF {
				return rep, errors.New("exited without a report")
			}
			return rep, err
		}
	}
}

// makeSecret writes a random cluster secret to a private file and points
// TE_AUTH_SECRET_FILE at it; the caller removes the returned directory.
func makeSecret() (string, error) {
	dir, err := os.MkdirTemp("", "te-demo-secret")
	if err != nil {
		return "", err
	}
	var b [32]byte
	crand.Read(b[:])
	path := filepath.Join(dir, "secret")
	if err := os.WriteFile(path, []byte(base64.StdEncoding.EncodeToString(b[:])+"\n"), 0o600); err != nil {
		os.RemoveAll(dir)
		return "", err
	}
	os.Setenv(authsecret.EnvSecretFile, path)
	return dir, nil
}

// refusesWithoutToken checks that the sidecar at addr wants the secret's
// token.
func refusesWithoutToken(addr string) error {
	hc := &http.Client{Timeout: 5 * time.Second}
	defer hc.CloseIdleConnections()
	resp, err := hc.Get("http://" + addr + "/handoff/status?id=demo")
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		return fmt.Errorf("te-sidecar answered %d to a request without the token, want 401", resp.StatusCode)
	}
	return nil
}

// startSidecar runs te-sidecar on a free loopback port and waits for
// /healthz.
func startSidecar(bin string) (string, func(), error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	addr := ln.Addr().String()
	ln.Close()
	cmd := exec.Command(bin, "-addr", addr, "-log-level", "warn", "-log-format", "text")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		return "", nil, err
	}
	stop := func() {
		cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	}
	hc := &http.Client{Timeout: time.Second}
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		resp, err := hc.Get("http://" + addr + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return addr, stop, nil
			}
		}
	}
	stop()
	return "", nil, fmt.Errorf("te-sidecar did not become healthy on %s", addr)
}
