package main

import (
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestDemo builds te-sidecar and te-demo and runs the demo on a smaller
// cache (4 layers, 512 tokens) over each transport: it must pass, and it
// must fail (non-zero exit, a WRONG line) when decode's cache is corrupted.
func TestDemo(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs binaries")
	}
	dir := t.TempDir()
	for _, c := range [][]string{{"te-sidecar", "../te-sidecar"}, {"te-demo", "."}} {
		if out, err := exec.Command("go", "build", "-o", filepath.Join(dir, c[0]), c[1]).CombinedOutput(); err != nil {
			t.Fatalf("build %s: %v\n%s", c[0], err, out)
		}
	}
	run := func(args ...string) (string, error) {
		args = append([]string{"-tokens", "512", "-layers", "4"}, args...)
		out, err := exec.Command(filepath.Join(dir, "te-demo"), args...).CombinedOutput()
		return string(out), err
	}
	for _, tr := range []string{"tcp", "shm"} {
		out, err := run("-transport", tr)
		if err != nil {
			t.Fatalf("demo over %s: %v\n%s", tr, err, out)
		}
		for _, want := range []string{"push (prefill WRITEs into decode, layer by layer)", "pull (decode READs from prefill)",
			"moved 8388608 bytes (8.0 MiB) over " + tr, "requests: 256 before coalescing", "every byte correct", "GB/s"} {
			if !strings.Contains(out, want) {
				t.Errorf("demo over %s: no %q in\n%s", tr, want, out)
			}
		}
		// The machine's load stands next to the figures, once per mode.
		if n := len(regexp.MustCompile(`(?m)^    machine:  load average [0-9.]+, [0-9.]+, [0-9.]+ \(1, 5, 15 min\) on \d+ cores`).FindAllString(out, -1)); n != 2 {
			t.Errorf("demo over %s: %d lines with the machine's load, want one per mode:\n%s", tr, n, out)
		}
		if strings.Count(out, "every byte correct") != 2 {
			t.Errorf("demo over %s: both modes should check out:\n%s", tr, out)
		}
	}
	out, err := run("-corrupt", "-modes", "push")
	if err == nil || !strings.Contains(out, "WRONG") {
		t.Fatalf("a corrupted cache passed: %v\n%s", err, out)
	}
}
