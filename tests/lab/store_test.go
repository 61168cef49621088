package lab_test

import (
	"bufio"
	"io"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tecache/te/internal/testexec"
	"github.com/tecache/te/tests/lab"
)

// etcdServer is an etcd in a lab host, on the host's address, keeping its
// data in dir across restarts.
type etcdServer struct {
	t    *testing.T
	host *lab.Host
	dir  string
	proc *lab.Proc
}

func (s *etcdServer) url() string { return "http://" + s.host.Addr(0) + ":2379" }

// start runs etcd and returns once it serves clients.
func (s *etcdServer) start() {
	s.t.Helper()
	bin, err := exec.LookPath("etcd")
	if err != nil {
		s.t.Fatalf("etcd is not installed (Debian: etcd-server): %v", err)
	}
	peerURL := "http://" + s.host.Addr(0) + ":2380"
	cmd := testexec.Command(bin, "--name", "lab", "--data-dir", s.dir,
		"--listen-client-urls", s.url(), "--advertise-client-urls", s.url(),
		"--listen-peer-urls", peerURL, "--initial-advertise-peer-urls", peerURL,
		"--initial-cluster", "lab="+peerURL, "--initial-cluster-state", "new",
		"--logger", "zap", "--log-level", "info")
	errOut, err := cmd.StderrPipe()
	if err != nil {
		s.t.Fatal(err)
	}
	s.proc = s.host.Start(s.t, cmd)
	ready := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(errOut)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		said := false
		for sc.Scan() {
			// 3.4's zap logger says the first, other versions the second.
			if l := sc.Text(); !said && (strings.Contains(l, "serving client traffic") || strings.Contains(l, "ready to serve client requests")) {
				said = true
				ready <- true
			}
		}
		if !said {
			ready <- false
		}
		io.Copy(io.Discard, errOut)
	}()
	select {
	case ok := <-ready:
		if !ok {
			s.t.Fatalf("etcd in %s exited before serving: %v", s.host.NS, s.proc.Err())
		}
	case <-time.After(60 * time.Second):
		s.t.Fatalf("etcd in %s not serving within 60 s", s.host.NS)
	}
}

// openSeg has p open (and hold) seg; it returns whether the open succeeded,
// how long it took, and the code and message of a refusal.
func (p *peer) openSeg(seg string) (ok bool, took time.Duration, why string) {
	p.t.Helper()
	f := strings.SplitN(p.do("open "+seg), " ", 3)
	ms, err := strconv.Atoi(f[1])
	if len(f) < 2 || err != nil {
		p.t.Fatalf("peer %s: open answered %q", p.host.NS, f)
	}
	took = time.Duration(ms) * time.Millisecond
	if f[0] == "opened" {
		return true, took, ""
	}
	return false, took, strings.Join(f[2:], " ")
}

// TestStoreDownAcrossHosts runs the metadata store, a real etcd, in a host of
// its own and stops it for 30 s while two engines on other hosts transfer:
// a segment opened before the outage keeps moving bytes, opening a segment
// the engine does not hold fails within the store's timeout with a
// Metadata error, and once etcd is back (with its data) every engine opens
// every segment again and a peer started after the outage is reached,
// without restarting anything.
func TestStoreDownAcrossHosts(t *testing.T) {
	l := lab.New(t, lab.Options{Hosts: 3})
	store := &etcdServer{t: t, host: l.Hosts[2], dir: t.TempDir()}
	store.start()
	// An open bounds its store lookup by the engine's RPC timeout.
	const rpcTimeout = 3 * time.Second
	env := []string{"TE_METADATA=etcd://" + store.host.Addr(0) + ":2379?ttl=5s&timeout=2s",
		"TE_RPC_TIMEOUT=" + rpcTimeout.String()}
	a := startPeer(t, l.Hosts[0], 16*mib, env...)
	b := startPeer(t, l.Hosts[1], 16*mib, env...)
	if ok, _, why := a.openSeg(b.h.Segment); !ok {
		t.Fatalf("open %s through etcd: %s", b.h.Segment, why)
	}
	transfer(t, a, b, 1, 16*mib, mib)

	store.proc.Kill()
	outage := time.Now()
	// Transfers to the open segment go on.
	for i := 2; time.Since(outage) < 30*time.Second; i++ {
		transfer(t, a, b, i, 16*mib, mib)
		time.Sleep(2 * time.Second)
	}
	// Opens of what the engine does not hold fail fast, naming the store.
	ok, took, why := a.openSeg("no-such-segment")
	t.Logf("open during the outage: %v after %v: %s", ok, took, why)
	if ok || !strings.HasPrefix(why, "metadata error") || !strings.Contains(why, "etcd") {
		t.Fatalf("open of an unknown segment with etcd down: ok=%v %s; want a metadata error naming etcd", ok, why)
	}
	if took > rpcTimeout+slack {
		t.Fatalf("open with etcd down took %v, over the RPC timeout (%v) plus %v", took, rpcTimeout, slack)
	}

	store.start()
	t.Logf("etcd back after %v", time.Since(outage).Round(time.Second))
	c := startPeer(t, l.Hosts[2], 16*mib, env...)
	// The engines publish again and read each other's records: b's
	// segment opens afresh, and c (new since the outage) is reached.
	deadline := time.Now().Add(30 * time.Second)
	for _, seg := range []string{b.h.Segment, c.h.Segment} {
		for {
			ok, took, why := a.openSeg(seg)
			if ok {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("open %s 30 s after etcd returned: %s (%v)", seg, why, took)
			}
			time.Sleep(500 * time.Millisecond)
		}
	}
	transfer(t, a, b, 100, 16*mib, mib)
	transfer(t, a, c, 101, 16*mib, mib)
	if ok, _, why := c.openSeg(a.h.Segment); !ok {
		t.Fatalf("the new peer cannot open %s: %s", a.h.Segment, why)
	}
}
