package testexec

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCommand runs a script as "the emulator": it receives the program and
// its arguments, in order.
func TestCommand(t *testing.T) {
	emu := filepath.Join(t.TempDir(), "emu")
	if err := os.WriteFile(emu, []byte("#!/bin/sh\necho \"emu $*\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv(Env, emu)
	out, err := Command("/some/prog", "-a", "b c").Output()
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(string(out)); got != "emu /some/prog -a b c" {
		t.Fatalf("emulator got %q", got)
	}
	t.Setenv(Env, "")
	if c := Command("/bin/echo", "x"); c.Path != "/bin/echo" || len(c.Args) != 2 {
		t.Fatalf("native command is %v %v", c.Path, c.Args)
	}
}
