package engine_test

import (
	"bufio"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/tecache/te/engine"
	"github.com/tecache/te/internal/errs"
)

// TestControlPlaneAcrossProcesses builds a helper binary and drives the
// control plane against it: descriptor fetch, probe, notify both ways, and a
// clean failure once the process is gone.
func TestControlPlaneAcrossProcesses(t *testing.T) {
	cmd := exec.Command(ctrlpeerBin(t))
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	name, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	name = strings.TrimSpace(name)

	e := newEngine(t, func(c *engine.Config) { c.RPCTimeout = 2 * time.Second })
	s, err := e.OpenSegment(name)
	if err != nil {
		t.Fatal(err)
	}
	d, err := s.Descriptor()
	if err != nil || d.Name != name || len(d.Buffers) != 1 || d.Buffers[0].Length != 1<<20 || d.Buffers[0].Key == 0 {
		t.Fatalf("descriptor %+v %v", d, err)
	}
	p, err := e.Probe(name)
	if err != nil || p.Instance != d.Instance {
		t.Fatalf("probe %+v %v", p, err)
	}
	if err := e.SendNotify(name, "echo", e.Name()); err != nil {
		t.Fatal(err)
	}
	waitNotify(t, e, engine.Notification{Name: "echo-reply", Msg: e.Name()})

	stdin.Close()
	cmd.Wait()
	_, err = e.Probe(name)
	code(t, "probe after exit", err, errs.PeerUnreachable)
	_, err = e.OpenSegment(name + "0") // a different, absent name
	if err == nil {
		t.Fatal("opened an absent segment")
	}
	code(t, "notify after exit", e.SendNotify(name, "x", "y"), errs.PeerUnreachable)
	if err := e.CloseSegment(s); err != nil {
		t.Fatal(err)
	}
}
