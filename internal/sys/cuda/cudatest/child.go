package cudatest

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/ebitengine/purego"

	"github.com/tecache/te/internal/sys/cuda"
	"github.com/tecache/te/internal/testexec"
)

// Child is the test binary re-executed as a peer process: it answers one line
// per command on stdout. The GPU tests of several packages drive their peer
// this way; each package's TestMain runs the child side when env is set.
type Child struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Scanner
	// Ready holds the fields of the child's first line after "READY".
	Ready []string
}

// StartChild starts os.Args[0] with env=1 and waits for its "READY" line of
// want fields (READY included). The child ends when the test does.
func StartChild(t testing.TB, env string, want int) *Child {
	t.Helper()
	cmd := testexec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), env+"=1")
	cmd.Stderr = os.Stderr
	in, _ := cmd.StdinPipe()
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &Child{cmd: cmd, in: in, out: bufio.NewScanner(out)}
	t.Cleanup(func() { in.Close(); cmd.Wait() })
	f := strings.Fields(c.Line(t))
	if len(f) != want || f[0] != "READY" {
		t.Fatalf("child: %v", f)
	}
	c.Ready = f[1:]
	return c
}

// Line reads the child's next line.
func (c *Child) Line(t testing.TB) string {
	t.Helper()
	if !c.out.Scan() {
		t.Fatal("child exited")
	}
	return c.out.Text()
}

// Do sends one command line and returns the child's answer.
func (c *Child) Do(t testing.TB, line string) string {
	t.Helper()
	fmt.Fprintln(c.in, line)
	return c.Line(t)
}

// Counter reads one of the fake driver's int64 counters by symbol name
// (fakecuda_open_handles, fakecuda_streams, fakecuda_events).
func Counter(t testing.TB, name string) int64 {
	t.Helper()
	h, err := purego.Dlopen(os.Getenv(cuda.EnvLibrary), purego.RTLD_NOW)
	if err != nil {
		t.Fatal(err)
	}
	sym, err := purego.Dlsym(h, name)
	if err != nil {
		t.Fatal(err)
	}
	var f func() int64
	purego.RegisterFunc(&f, sym)
	return f()
}
