package lab

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tecache/te/internal/sys/proc"
)

// Options shape a lab.
type Options struct {
	// Hosts is the number of hosts (1 to 250).
	Hosts int
	// Rails is the number of NICs per host, one bridge each (default 1,
	// at most 8).
	Rails int
	// RateMbit, when positive, limits every link to this rate in each
	// direction (tbf on both ends of each veth).
	RateMbit int
}

// Lab is a set of hosts joined by one bridge per rail.
type Lab struct {
	t      testing.TB
	id     string
	sw     string // the switch namespace
	rails  int
	Hosts  []*Host
	mu     sync.Mutex
	cut    map[[2]int]bool // x cannot reach y (Partition)
	downed map[[2]int]bool // host, rail links taken down
}

// Host is one namespace of the lab.
type Host struct {
	lab *Lab
	// Index is the host's number, from 0.
	Index int
	// NS is the name of its network namespace (ip netns).
	NS string
}

// cmdTimeout bounds each ip/tc/bridge command.
const cmdTimeout = 20 * time.Second

// New builds a lab for t and removes it when t ends. It skips t where
// network namespaces cannot be made (not root, no ip netns), unless CI=true
// and the test runs as root.
func New(t testing.TB, o Options) *Lab {
	t.Helper()
	if o.Rails == 0 {
		o.Rails = 1
	}
	if o.Hosts < 1 || o.Hosts > 250 || o.Rails < 1 || o.Rails > 8 || o.RateMbit < 0 {
		t.Fatalf("lab: bad options %+v (1-250 hosts, 1-8 rails, rate >= 0)", o)
	}
	var sfx [4]byte
	if _, err := rand.Read(sfx[:]); err != nil {
		t.Fatal(err)
	}
	l := &Lab{t: t, id: "tel" + hex.EncodeToString(sfx[:]), rails: o.Rails,
		cut: map[[2]int]bool{}, downed: map[[2]int]bool{}}
	l.sw = l.id + "-sw"
	if err := needNetns(l.sw); err != nil {
		if os.Getenv("CI") == "true" && os.Geteuid() == 0 {
			t.Fatalf("lab: network namespaces refused in CI as root: %v", err)
		}
		t.Skipf("lab: network namespaces unavailable (needs root and ip netns): %v", err)
	}
	t.Cleanup(func() { l.teardown() })
	for i := 0; i < o.Hosts; i++ {
		h := &Host{lab: l, Index: i, NS: fmt.Sprintf("%s-h%d", l.id, i)}
		l.must("ip", "netns", "add", h.NS)
		l.Hosts = append(l.Hosts, h)
		l.must("ip", "-n", h.NS, "link", "set", "lo", "up")
	}
	for r := 0; r < o.Rails; r++ {
		br := brName(r)
		l.must("ip", "-n", l.sw, "link", "add", br, "type", "bridge")
		l.must("ip", "-n", l.sw, "link", "set", br, "up")
		for _, h := range l.Hosts {
			port, nic := portName(h.Index, r), nicName(r)
			l.must("ip", "-n", l.sw, "link", "add", port, "type", "veth", "peer", "name", nic, "netns", h.NS)
			l.must("ip", "-n", l.sw, "link", "set", port, "master", br)
			l.must("ip", "-n", h.NS, "addr", "add", h.Addr(r)+"/24", "dev", nic)
			if o.RateMbit > 0 {
				// Both ends: tbf shapes what leaves a device.
				l.shape(h.NS, nic, o.RateMbit)
				l.shape(l.sw, port, o.RateMbit)
			}
			l.must("ip", "-n", l.sw, "link", "set", port, "up")
			l.must("ip", "-n", h.NS, "link", "set", nic, "up")
		}
	}
	return l
}

func (l *Lab) shape(ns, dev string, mbit int) {
	// burst: a few milliseconds at the rate, at least 64 KiB so that a
	// timer tick does not starve the link.
	burst := max(64<<10, mbit*1000*1000/8/200)
	l.must("tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "tbf",
		"rate", strconv.Itoa(mbit)+"mbit", "burst", strconv.Itoa(burst), "latency", "100ms")
}

func brName(rail int) string         { return "br" + strconv.Itoa(rail) }
func nicName(rail int) string        { return "r" + strconv.Itoa(rail) }
func portName(host, rail int) string { return fmt.Sprintf("h%dr%d", host, rail) }

// needNetns checks that ip netns works by making the switch namespace.
func needNetns(name string) error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("not root (euid %d)", os.Geteuid())
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return err
	}
	if _, err := exec.LookPath("bridge"); err != nil {
		return err
	}
	return run("ip", "netns", "add", name)
}

func run(name string, args ...string) error {
	ctx, cancel := context.WithTimeout(context.Background(), cmdTimeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %v: %s", name, strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return nil
}

func (l *Lab) must(name string, args ...string) {
	l.t.Helper()
	if err := run(name, args...); err != nil {
		l.t.Fatalf("lab: %v", err)
	}
}

// teardown deletes the namespaces; their veths and bridges go with them.
func (l *Lab) teardown() {
	for _, h := range l.Hosts {
		if err := run("ip", "netns", "del", h.NS); err != nil {
			l.t.Errorf("lab cleanup: %v", err)
		}
	}
	if err := run("ip", "netns", "del", l.sw); err != nil {
		l.t.Errorf("lab cleanup: %v", err)
	}
}

// Addr is the host's IPv4 address on a rail.
func (h *Host) Addr(rail int) string { return fmt.Sprintf("198.18.%d.%d", rail, h.Index+1) }

// Proc is a process running in a host.
type Proc struct {
	Cmd  *exec.Cmd
	done chan struct{}
	err  error
}

// Start runs cmd inside the host's namespace (through ip netns exec, which
// execs the program itself, so Cmd.Process is the program). The process is
// killed when t ends if it is still running.
func (h *Host) Start(t testing.TB, cmd *exec.Cmd) *Proc {
	t.Helper()
	args := append([]string{"netns", "exec", h.NS}, cmd.Args...)
	args[3] = cmd.Path
	ipPath, err := exec.LookPath("ip")
	if err != nil {
		t.Fatal(err)
	}
	cmd.Path, cmd.Args = ipPath, append([]string{"ip"}, args...)
	if err := cmd.Start(); err != nil {
		t.Fatalf("lab: start in %s: %v", h.NS, err)
	}
	p := &Proc{Cmd: cmd, done: make(chan struct{})}
	go func() { p.err = cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		p.Kill() // SIGKILL ends a stopped process too
	})
	return p
}

// Freeze stops the process (SIGSTOP) and returns once every thread of it is
// stopped: its sockets stay open and nothing answers, like a hung host.
func (p *Proc) Freeze() error { return proc.Stop(p.Cmd.Process.Pid, 10*time.Second) }

// Thaw continues a frozen process.
func (p *Proc) Thaw() error { return proc.Continue(p.Cmd.Process.Pid) }

// Kill kills the process and waits (at most 10 s) until it is reaped.
func (p *Proc) Kill() {
	p.Cmd.Process.Signal(syscall.SIGKILL)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
	}
}

// Done is closed once the process exited; Err is then its Wait error.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Err is the process's Wait error, once Done is closed.
func (p *Proc) Err() error { return p.err }

// LinkDown takes a host's link on a rail down at the switch, like a pulled
// cable: the host's frames on that rail vanish.
func (l *Lab) LinkDown(host, rail int) {
	l.t.Helper()
	l.must("ip", "-n", l.sw, "link", "set", portName(host, rail), "down")
	l.mu.Lock()
	l.downed[[2]int{host, rail}] = true
	l.mu.Unlock()
}

// LinkUp brings it back.
func (l *Lab) LinkUp(host, rail int) {
	l.t.Helper()
	l.must("ip", "-n", l.sw, "link", "set", portName(host, rail), "up")
	l.mu.Lock()
	delete(l.downed, [2]int{host, rail})
	l.mu.Unlock()
}

// nowhere is a MAC address no port of the lab has: frames sent to it
// cross the switch and are dropped by every host.
const nowhere = "02:de:ad:00:00:01"

// Partition cuts every host of a off from every host of b, on every rail,
// in both directions: each side's neighbour entry for the other points at
// a MAC address nobody has, so their frames vanish at layer 2 without a
// word to either side (established connections included: the kernel
// resolves the neighbour for every packet). Hosts in neither set are
// unaffected.
func (l *Lab) Partition(a, b []int) {
	l.t.Helper()
	for _, x := range a {
		for _, y := range b {
			if x == y {
				l.t.Fatalf("lab: host %d on both sides of a partition", x)
			}
			l.blind(x, y, true)
			l.blind(y, x, true)
		}
	}
}

// blind makes host x unable to reach host y on every rail, or (on false)
// lets x resolve y again.
func (l *Lab) blind(x, y int, on bool) {
	l.t.Helper()
	k := [2]int{x, y}
	l.mu.Lock()
	was := l.cut[k]
	if on {
		l.cut[k] = true
	} else {
		delete(l.cut, k)
	}
	l.mu.Unlock()
	if was == on && !on {
		return
	}
	hx, hy := l.Hosts[x], l.Hosts[y]
	for r := 0; r < l.rails; r++ {
		if on {
			l.must("ip", "-n", hx.NS, "neigh", "replace", hy.Addr(r), "lladdr", nowhere, "dev", nicName(r), "nud", "permanent")
		} else {
			l.must("ip", "-n", hx.NS, "neigh", "del", hy.Addr(r), "dev", nicName(r))
		}
	}
}

// Heal undoes every Partition and LinkDown.
func (l *Lab) Heal() {
	l.t.Helper()
	l.mu.Lock()
	var cut, downed [][2]int
	for k := range l.cut {
		cut = append(cut, k)
	}
	for k := range l.downed {
		downed = append(downed, k)
	}
	l.mu.Unlock()
	for _, k := range cut {
		l.blind(k[0], k[1], false)
	}
	for _, k := range downed {
		l.LinkUp(k[0], k[1])
	}
}
