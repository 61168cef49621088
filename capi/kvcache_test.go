package main

import (
	"bytes"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tecache/te/capi/internal/glue"
)

// TestHeaderKVConstants checks te.h's handoff and plan numbers against the
// Go constants they mirror.
func TestHeaderKVConstants(t *testing.T) {
	want := map[string]int{
		"TE_PLAN_ALL_LAYERS":      -1,
		"TE_HANDOFF_MODE_DEFAULT": glue.ModeDefault,
		"TE_HANDOFF_MODE_PUSH":    glue.ModePush,
		"TE_HANDOFF_MODE_PULL":    glue.ModePull,
		"TE_HANDOFF_WAITING":      int(glue.StateNumber("waiting")),
		"TE_HANDOFF_TRANSFERRING": int(glue.StateNumber("transferring")),
		"TE_HANDOFF_DONE":         int(glue.StateNumber("done")),
		"TE_HANDOFF_FAILED":       int(glue.StateNumber("failed")),
		"TE_HANDOFF_ABORTED":      int(glue.StateNumber("aborted")),
		"TE_HANDOFF_EXPIRED":      int(glue.StateNumber("expired")),
	}
	got := defines(t, "TE_")
	for name, v := range want {
		if g, ok := got[name]; !ok {
			t.Errorf("te.h does not define %s", name)
		} else if g != v {
			t.Errorf("te.h: %s = %d, Go says %d", name, g, v)
		}
	}
	if got["TE_ABI_VERSION_MINOR"] < 1 {
		t.Errorf("TE_ABI_VERSION_MINOR is %d; the kvcache and handoff calls came with 1.1", got["TE_ABI_VERSION_MINOR"])
	}
}

// compileC builds one C test program against lib.
func compileC(t *testing.T, lib, dir, src string) string {
	t.Helper()
	cc, err := exec.LookPath("cc")
	if err != nil {
		t.Skip("no C compiler (cc) on PATH")
	}
	bin := filepath.Join(dir, src)
	build := exec.Command(cc, "-std=c11", "-D_GNU_SOURCE", "-Wall", "-Wextra", "-Werror", "-I../include", "-I../tests/c",
		"../tests/c/"+src+".c", "-o", bin, "-L"+filepath.Dir(lib), "-lte", "-Wl,-rpath,"+filepath.Dir(lib), "-lpthread")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("compiling %s: %v\n%s", src, err, out)
	}
	return bin
}

func runC(t *testing.T, bin string, args ...string) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Errorf("%s %v: %v\n%s", filepath.Base(bin), args, err, out.String())
	} else {
		t.Logf("%s: %s", filepath.Base(bin), strings.TrimSpace(out.String()))
	}
}

// TestCKVCache runs tests/c/kvcache.c: the layout, plan and handoff error
// paths and a plan submitted layer by layer, every byte checked.
func TestCKVCache(t *testing.T) {
	if testing.Short() {
		t.Skip("builds libte.so")
	}
	lib := buildLib(t)
	runC(t, compileC(t, lib, t.TempDir(), "kvcache"))
}

// TestCHandoff runs tests/c/handoff.c: a real te-sidecar, a C prefill
// process and a C decode process, push (layer by layer) and pull, an abort,
// every byte checked; once with the transport the engines pick and once
// over tcp.
func TestCHandoff(t *testing.T) {
	if testing.Short() {
		t.Skip("builds libte.so and te-sidecar")
	}
	lib := buildLib(t)
	dir := t.TempDir()
	bin := compileC(t, lib, dir, "handoff")
	sidecar := filepath.Join(dir, "te-sidecar")
	if out, err := exec.Command("go", "build", "-o", sidecar, "../cmd/te-sidecar").CombinedOutput(); err != nil {
		t.Fatalf("building te-sidecar: %v\n%s", err, out)
	}
	runC(t, bin, sidecar)
	runC(t, bin, sidecar, "tcp")
}
