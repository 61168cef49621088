package tebench_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/tecache/te/bench/tebench"
	"github.com/tecache/te/engine"
)

// envTarget makes the re-executed test binary act as te-bench itself, so
// loopback can start it as its target process.
const envTarget = "TE_BENCH_AS_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(envTarget) != "" {
		os.Exit(tebench.Main(context.Background(), os.Args[0], os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
	}
	goleak.VerifyTestMain(m)
}

func run(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	var out, errb bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	code := tebench.Main(ctx, os.Args[0], args, strings.NewReader(""), &out, &errb)
	return out.String(), errb.String(), code
}

func results(t *testing.T, out string) []map[string]any {
	t.Helper()
	var rs []map[string]any
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("not JSON: %q: %v", sc.Text(), err)
		}
		rs = append(rs, m)
	}
	return rs
}

// TestLoopback runs te-bench loopback end to end: a real target process, a
// matrix of runs, one JSON object each with every documented field.
func TestLoopback(t *testing.T) {
	t.Setenv(envTarget, "1")
	out, errOut, code := run(t, "loopback", "--op", "read,write", "--block", "4KiB,64KiB", "--batch", "8",
		"--threads", "1,2", "--duration", "200ms", "--json", "--buffer", "16MiB")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	rs := results(t, out)
	if len(rs) != 8 {
		t.Fatalf("%d results, want 8:\n%s", len(rs), out)
	}
	for _, r := range rs {
		for _, f := range []string{"gbps", "req_per_s", "p50_us", "p99_us", "ref_tcp_gbps", "ref_memcpy_gbps", "ratio_tcp", "bytes"} {
			if v, ok := r[f].(float64); !ok || v <= 0 {
				t.Errorf("%s = %v in %v", f, r[f], r)
			}
		}
		if r["transport"] != "tcp" || r["batch"].(float64) != 8 {
			t.Errorf("fields: %v", r)
		}
		if m, _ := r["machine"].(map[string]any); m == nil || m["logical_cores"].(float64) < 1 {
			t.Errorf("machine not named: %v", r["machine"])
		}
	}
}

// TestInitiator drives a target of this process with the initiator mode and
// the text output.
func TestInitiator(t *testing.T) {
	tg, err := tebench.StartTarget(tebench.TargetOptions{Buffer: 8 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer tg.Close()
	out, errOut, code := run(t, "initiator", "--segment_id", tg.Info.Segment, "--ref", tg.Info.Ref, "--protocol", "tcp",
		"--operation", "write", "--block_size", "1MiB", "--batch_size", "4", "--duration", "200ms", "--conns", "3", "--slice", "256KiB")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if !strings.Contains(out, "machine: ") || !strings.Contains(out, "tcp.conns 3, tcp.slice 256KiB") ||
		!strings.Contains(out, "tcp   write block 1MiB") || !strings.Contains(out, "ref tcp ") {
		t.Fatalf("output:\n%s", out)
	}
}

// TestLocal: the local transport needs the target in the same process.
func TestLocal(t *testing.T) {
	out, errOut, code := run(t, "loopback", "--transport", "local", "--block", "64KiB", "--batch", "4", "--duration", "100ms", "--json", "--buffer", "4MiB")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	rs := results(t, out)
	if len(rs) != 1 || rs[0]["transport"] != "local" || rs[0]["gbps"].(float64) <= 0 {
		t.Fatalf("%v", rs)
	}
}

// TestFile runs the local file mode (with fio beside it when installed) and a
// loopback whose target also serves a file: each run is reported for the
// target's memory and for its file, with the ratio.
func TestFile(t *testing.T) {
	dir := t.TempDir()
	args := []string{"file", "--path", filepath.Join(dir, "f"), "--size", "8MiB", "--op", "write,read", "--block", "4KiB,1MiB",
		"--depth", "4", "--pattern", "seq,rand", "--direct", "on,off", "--duration", "100ms", "--json"}
	if _, err := exec.LookPath("fio"); err == nil {
		args = append(args, "--fio")
	}
	out, errOut, code := run(t, args...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	rs := results(t, out)
	if len(rs) != 16 {
		t.Fatalf("%d results, want 16:\n%s", len(rs), out)
	}
	for _, r := range rs {
		if r["gbps"].(float64) <= 0 || r["iops"].(float64) <= 0 || r["mode"] == "" {
			t.Errorf("%v", r)
		}
		if slices.Contains(args, "--fio") && r["ratio_fio"].(float64) <= 0 {
			t.Errorf("no fio ratio: %v", r)
		}
	}

	t.Setenv(envTarget, "1")
	out, errOut, code = run(t, "loopback", "--op", "write,read", "--block", "1MiB", "--batch", "4", "--duration", "200ms",
		"--json", "--buffer", "16MiB", "--file", filepath.Join(dir, "remote"))
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	rs = results(t, out)
	if len(rs) != 4 || rs[0]["target"] != "memory" || rs[1]["target"] != "file" || rs[1]["ratio_memory"].(float64) <= 0 {
		t.Fatalf("%d results:\n%s", len(rs), out)
	}
	if _, _, code := run(t, "file"); code != 2 {
		t.Errorf("file without --path: exit %d", code)
	}
}

func TestBadArguments(t *testing.T) {
	for _, args := range [][]string{
		{},
		{"nonsense"},
		{"initiator"},
		{"initiator", "--segment", "x", "--op", "copy"},
		{"loopback", "--block", "big"},
		{"loopback", "--block", "0"},
		{"loopback", "--batch", "-1"},
		{"loopback", "--threads", "x"},
		{"loopback", "--transport", "carrier-pigeon"},
		{"loopback", "--duration", "soon"},
		{"target", "--buffer", "lots"},
	} {
		if _, _, code := run(t, args...); code != 2 {
			t.Errorf("%q: exit %d, want 2", args, code)
		}
	}
	// A segment nobody serves fails, with status 1.
	if _, errOut, code := run(t, "initiator", "--segment", "127.0.0.1:1", "--duration", "100ms"); code != 1 {
		t.Errorf("unreachable segment: exit %d: %s", code, errOut)
	}
}

func TestRefs(t *testing.T) {
	s, err := tebench.NewRefServer("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, op := range []string{"read", "write"} {
		g, err := tebench.RawTCP(s.Addr(), op, 64<<10, 1<<20, 2, 100*time.Millisecond)
		if err != nil || g <= 0 {
			t.Fatalf("%s: %v GB/s, %v", op, g, err)
		}
	}
	if g, err := tebench.Memcpy(1<<20, 50*time.Millisecond); err != nil || g <= 0 {
		t.Fatalf("memcpy: %v, %v", g, err)
	}
	if tebench.ThisMachine().LogicalCores < 1 {
		t.Fatal("no cores")
	}
}

func ExampleFormatSize() {
	for _, n := range []uint64{4096, 64 << 10, 1 << 20, 3 << 30, 1000} {
		os.Stdout.WriteString(tebench.FormatSize(n) + " ")
	}
	// Output: 4KiB 64KiB 1MiB 3GiB 1000B
}

// TestVersion: te-bench -version prints engine.Version, which the build
// stamps into every binary and library alike.
func TestVersion(t *testing.T) {
	for _, flag := range []string{"-version", "--version", "version"} {
		out, _, code := run(t, flag)
		if code != 0 || out != "te-bench "+engine.Version+"\n" {
			t.Errorf("%s: exit %d, %q", flag, code, out)
		}
	}
}
