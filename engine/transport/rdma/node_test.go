package rdma_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"io"
	"math/rand"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tecache/te/engine"
	"github.com/tecache/te/internal/sys/cuda"
	"github.com/tecache/te/internal/sys/cuda/cudatest"
	"github.com/tecache/te/internal/sys/hip"
	"github.com/tecache/te/internal/sys/hip/hiptest"
	"github.com/tecache/te/internal/sys/ibv/ibvtest"
	"github.com/tecache/te/internal/sys/mem"
	"github.com/tecache/te/internal/sys/topo"
	"github.com/tecache/te/internal/sys/topo/topotest"
	"github.com/tecache/te/internal/testexec"
)

// Two processes on the fake fabric: each test node is this test binary run
// again as a child with one engine, driven over stdin/stdout, so that each
// process loads the fake libibverbs and CUDA driver with its own
// environment (the fabric directory, the sysfs tree) as a deployment would.

const (
	envNode       = "TE_RDMA_TEST_NODE"
	envTransports = "TE_RDMA_TEST_TRANSPORTS"
	envParams     = "TE_RDMA_TEST_PARAMS"
)

// fabricSetup is one fake fabric: the fake libraries, a recorded sysfs tree
// and the fabric directory every process of the test shares.
type fabricSetup struct {
	t                  testing.TB
	verbs, cuda, sysfs string
	hip                string // the fake HIP runtime ("" where it does not build)
	dir                string
	pids               []int // of the nodes started
}

func newFabricSetup(t testing.TB, tree string) *fabricSetup {
	t.Helper()
	f := &fabricSetup{t: t, verbs: ibvtest.Build(t), dir: t.TempDir()}
	var err error
	if f.cuda, err = cudatest.BuildFake(); err != nil {
		t.Skipf("the fake CUDA driver does not build here: %v", err)
	}
	f.hip, _ = hiptest.BuildFake() // tests that need it skip without
	if tree != "" {
		f.sysfs = topotest.Tree(t, tree)
	}
	return f
}

// newRealSetup is a setup for a machine with a GPU and an RDMA NIC: the
// nodes load the real libibverbs and CUDA driver (bench/gpu/check.sh).
func newRealSetup(t testing.TB, kind string) *fabricSetup {
	t.Helper()
	env := cudatest.EnvReal
	if kind == "hip" {
		env = hiptest.EnvReal
	}
	if os.Getenv(env) != "1" {
		t.Skipf("a GPU check: %s=1 on a machine with a GPU and an RDMA NIC", env)
	}
	return &fabricSetup{t: t}
}

// env is what points a process at the fakes.
func (f *fabricSetup) env() []string {
	if f.verbs == "" {
		return nil // the real libraries
	}
	e := []string{"TE_IBV_LIBRARY=" + f.verbs, cuda.EnvLibrary + "=" + f.cuda, ibvtest.EnvFabric + "=" + f.dir}
	if f.hip != "" {
		e = append(e, hip.EnvLibrary+"="+f.hip)
	}
	if f.sysfs != "" {
		e = append(e, topo.EnvSysfsRoot+"="+f.sysfs)
	}
	return e
}

// control replaces the fabric's control file and waits until every node
// follows it.
func (f *fabricSetup) control(rules ...string) {
	f.t.Helper()
	ibvtest.WriteControl(f.t, f.dir, f.pids, rules...)
}

// node is one child process with an engine.
type node struct {
	t    testing.TB
	cmd  *exec.Cmd
	in   io.WriteCloser
	out  *bufio.Reader
	mu   sync.Mutex
	name string
	pid  int
}

// startNode starts a node on the fabric; extra adds environment (knobs of
// the fakes, the engine's transports and parameters).
func (f *fabricSetup) startNode(extra ...string) *node {
	t := f.t
	t.Helper()
	cmd := testexec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append(append(os.Environ(), envNode+"=1"), f.env()...), extra...)
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
	n := &node{t: t, cmd: cmd, in: in, out: bufio.NewReader(out)}
	t.Cleanup(func() {
		in.Close()
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	})
	n.name = n.do("name")
	n.pid, _ = strconv.Atoi(n.do("pid"))
	f.pids = append(f.pids, n.pid)
	return n
}

// do sends one command and returns the answer; an error answer fails the
// test.
func (n *node) do(format string, args ...any) string {
	n.t.Helper()
	s, err := n.try(format, args...)
	if err != nil {
		n.t.Fatal(err)
	}
	return s
}

func (n *node) try(format string, args ...any) (string, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	line := fmt.Sprintf(format, args...)
	if _, err := fmt.Fprintln(n.in, line); err != nil {
		return "", fmt.Errorf("node: %s: %v", line, err)
	}
	ch := make(chan string, 1)
	go func() {
		s, _ := n.out.ReadString('\n')
		ch <- strings.TrimSpace(s)
	}()
	select {
	case s := <-ch:
		if s == "" {
			return "", fmt.Errorf("node exited on %q", line)
		}
		if e, ok := strings.CutPrefix(s, "error "); ok {
			return "", fmt.Errorf("node: %s: %s", line, e)
		}
		return s, nil
	case <-time.After(90 * time.Second):
		return "", fmt.Errorf("node: no answer to %q in 90s", line)
	}
}

func (n *node) addr(format string, args ...any) uint64 {
	n.t.Helper()
	v, err := strconv.ParseUint(n.do(format, args...), 10, 64)
	if err != nil {
		n.t.Fatal(err)
	}
	return v
}

// stats returns the node's rdma transport counters.
func (n *node) stats() map[string]uint64 {
	n.t.Helper()
	var m map[string]uint64
	if err := json.Unmarshal([]byte(n.do("stats")), &m); err != nil {
		n.t.Fatal(err)
	}
	return m
}

// result is what "wait" reports about a batch.
type result struct {
	State      string
	Completed  int
	Tasks      int
	Transports []string
	Err        string
}

func (n *node) wait(id string) result {
	n.t.Helper()
	var r result
	if err := json.Unmarshal([]byte(n.do("wait %s", id)), &r); err != nil {
		n.t.Fatal(err)
	}
	return r
}

// diff is b - a for every counter.
func diff(a, b map[string]uint64) map[string]uint64 {
	out := map[string]uint64{}
	for k, v := range b {
		if d := v - a[k]; d != 0 {
			out[k] = d
		}
	}
	return out
}

// streamResult is what "stream" reports: each batch's latency and when it
// ended (microseconds from the start), and the bytes moved.
type streamResult struct {
	LatUS, EndUS []int64
	Bytes        uint64
	Seconds      float64
}

func (n *node) stream(seg string, local, remote, block uint64, k int, d time.Duration) streamResult {
	n.t.Helper()
	var r streamResult
	if err := json.Unmarshal([]byte(n.do("stream %s %d %d %d %d %d", seg, local, remote, block, k, d.Milliseconds())), &r); err != nil {
		n.t.Fatal(err)
	}
	return r
}

// ---- the child side --------------------------------------------------------

type nodeAlloc struct {
	addr, size uint64
	dev        int // -1: host
	kind       string
	host       []byte
}

// runNode is the child: one engine, commands on stdin.
func runNode() int {
	conf := engine.Config{ListenAddr: "127.0.0.1:0", Hostname: "127.0.0.1", TransferTimeout: 20 * time.Second}
	conf.Transports = strings.Split(os.Getenv(envTransports), ",")
	if conf.Transports[0] == "" {
		conf.Transports = []string{"rdma", "tcp"}
	}
	if p := os.Getenv(envParams); p != "" {
		conf.Params = map[string]string{}
		for _, kv := range strings.Split(p, ",") {
			k, v, _ := strings.Cut(kv, "=")
			conf.Params[k] = v
		}
	}
	e, err := engine.New(conf)
	if err != nil {
		fmt.Fprintln(os.Stderr, "node:", err)
		return 1
	}
	var allocs []*nodeAlloc
	segs := map[string]*engine.Segment{}
	batches := map[string]*engine.Batch{}
	var lib *cuda.Lib
	var hl *hip.Lib
	ctxs := map[int]cuda.Context{}
	find := func(addr, n uint64) (*nodeAlloc, error) {
		for _, a := range allocs {
			if addr >= a.addr && addr+n <= a.addr+a.size {
				return a, nil
			}
		}
		return nil, fmt.Errorf("%#x+%d is not allocated here", addr, n)
	}
	onDev := func(dev int, fn func() error) error {
		var err error
		if lib == nil {
			if lib, err = cuda.Load(); err != nil {
				return err
			}
		}
		c, ok := ctxs[dev]
		if !ok {
			d, err := lib.DeviceGet(dev)
			if err != nil {
				return err
			}
			if c, err = lib.PrimaryCtxRetain(d); err != nil {
				return err
			}
			ctxs[dev] = c
		}
		return lib.With(c, fn)
	}
	defer func() {
		e.Close()
		for _, a := range allocs {
			switch {
			case a.dev < 0:
				mem.Free(a.host)
			case a.kind == "hip":
				hl.Free(a.addr)
			default:
				onDev(a.dev, func() error { return lib.MemFree(a.addr) })
			}
		}
	}()
	u := func(s string) uint64 { v, _ := strconv.ParseUint(s, 0, 64); return v }
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 {
			continue
		}
		out, err := "ok", error(nil)
		switch f[0] {
		case "name":
			out = e.Name()
		case "pid":
			out = strconv.Itoa(os.Getpid())
		case "alloc": // alloc cpu SIZE | alloc cuda|hip DEV SIZE
			a := &nodeAlloc{dev: -1, kind: f[1]}
			switch f[1] {
			case "cpu":
				a.size = u(f[2])
				if a.host, err = mem.Alloc(int(a.size)); err == nil {
					a.addr = mem.Addr(a.host)
				}
			case "hip":
				a.dev, a.size = int(u(f[2])), u(f[3])
				if hl, err = hip.Load(); err == nil {
					a.addr, err = hl.Malloc(a.dev, a.size)
				}
			default:
				a.dev, a.size = int(u(f[2])), u(f[3])
				err = onDev(a.dev, func() (err error) { a.addr, err = lib.MemAlloc(a.size); return err })
			}
			if err == nil {
				allocs = append(allocs, a)
				out = strconv.FormatUint(a.addr, 10)
			}
		case "reg": // reg ADDR SIZE LOC
			err = e.RegisterMemory(u(f[1]), u(f[2]), f[3], true)
		case "unreg":
			err = e.UnregisterMemory(u(f[1]))
		case "fill", "crc": // fill ADDR SIZE SEED | crc ADDR SIZE
			addr, n := u(f[1]), u(f[2])
			var a *nodeAlloc
			if a, err = find(addr, n); err != nil {
				break
			}
			var b []byte
			if a.dev < 0 {
				b = a.host[addr-a.addr : addr-a.addr+n]
			} else {
				b = make([]byte, n)
			}
			if f[0] == "fill" {
				rand.New(rand.NewSource(int64(u(f[3])))).Read(b)
				switch {
				case a.kind == "hip":
					err = hl.Memcpy(addr, mem.Addr(b), n)
				case a.dev >= 0:
					err = onDev(a.dev, func() error { return lib.CopyHtoD(addr, mem.Addr(b), n) })
				}
				break
			}
			switch {
			case a.kind == "hip":
				err = hl.Memcpy(mem.Addr(b), addr, n)
			case a.dev >= 0:
				err = onDev(a.dev, func() error { return lib.CopyDtoH(mem.Addr(b), addr, n) })
			}
			out = strconv.FormatUint(uint64(crc32.ChecksumIEEE(b)), 10)
		case "open":
			var s *engine.Segment
			if s, err = e.OpenSegment(f[1]); err == nil {
				segs[f[1]] = s
			}
		case "submit": // submit read|write SEG LOCAL REMOTE LEN BLOCKS
			op := engine.Write
			if f[1] == "read" {
				op = engine.Read
			}
			seg := segs[f[2]]
			local, remote, n, k := u(f[3]), u(f[4]), u(f[5]), u(f[6])
			reqs := make([]engine.Request, k)
			for i := range reqs {
				off := n / k * uint64(i)
				l := n / k
				if i == len(reqs)-1 {
					l = n - off
				}
				reqs[i] = engine.Request{Op: op, Local: local + off, Segment: seg, Remote: remote + off, Length: l}
			}
			var b *engine.Batch
			if b, err = e.AllocateBatch(len(reqs)); err != nil {
				break
			}
			if err = b.Submit(reqs...); err != nil {
				b.Free()
				break
			}
			out = strconv.Itoa(len(batches))
			batches[out] = b
		case "wait": // wait ID
			b := batches[f[1]]
			if b == nil {
				err = fmt.Errorf("no batch %s", f[1])
				break
			}
			st, werr := b.Wait(60 * time.Second)
			r := result{State: st.State.String(), Completed: st.Completed, Tasks: st.Tasks}
			if werr != nil {
				r.Err = werr.Error()
			} else if st.Err != nil {
				r.Err = st.Err.Error()
			}
			seen := map[string]bool{}
			for i := 0; i < st.Tasks; i++ {
				if ts, err := b.TaskStatus(i); err == nil && !seen[ts.Transport] {
					seen[ts.Transport] = true
					r.Transports = append(r.Transports, ts.Transport)
				}
			}
			if werr == nil {
				b.Free()
				delete(batches, f[1])
			}
			j, _ := json.Marshal(r)
			out = string(j)
		case "stream": // stream SEG LOCAL REMOTE BLOCK N MS: write batches back to back
			seg := segs[f[1]]
			local, remote, bs, k, ms := u(f[2]), u(f[3]), u(f[4]), int(u(f[5])), u(f[6])
			reqs := make([]engine.Request, k)
			for i := range reqs {
				off := bs * uint64(i)
				reqs[i] = engine.Request{Op: engine.Write, Local: local + off, Segment: seg, Remote: remote + off, Length: bs}
			}
			var st streamResult
			t0 := time.Now()
			for time.Since(t0) < time.Duration(ms)*time.Millisecond && err == nil {
				var b *engine.Batch
				if b, err = e.AllocateBatch(k); err != nil {
					break
				}
				b0 := time.Now()
				if err = b.Submit(reqs...); err == nil {
					var bst engine.BatchStatus
					if bst, err = b.Wait(60 * time.Second); err == nil && bst.State != engine.Completed {
						err = fmt.Errorf("batch ended %v: %v", bst.State, bst.Err)
					}
				}
				b.Free()
				st.LatUS = append(st.LatUS, time.Since(b0).Microseconds())
				st.EndUS = append(st.EndUS, time.Since(t0).Microseconds())
				st.Bytes += bs * uint64(k)
			}
			st.Seconds = time.Since(t0).Seconds()
			j, _ := json.Marshal(st)
			out = string(j)
		case "stats":
			j, _ := json.Marshal(e.TransportStats()["rdma"])
			out = string(j)
		case "exit":
			return 0
		default:
			err = fmt.Errorf("unknown command %q", f[0])
		}
		if err != nil {
			fmt.Println("error " + strings.ReplaceAll(err.Error(), "\n", " "))
		} else {
			fmt.Println(out)
		}
	}
	return 0
}
