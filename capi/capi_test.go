package main

import (
	"bytes"
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"

	"go.uber.org/goleak"

	"github.com/tecache/te/capi/internal/glue"
	"github.com/tecache/te/engine"
	"github.com/tecache/te/internal/errs"
)

var (
	libOnce sync.Once
	libDir  string
	libErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if libDir != "" {
		os.RemoveAll(libDir)
	}
	if code == 0 {
		if err := goleak.Find(goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*workerPool).Start.func2"),
			goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.updateServerDate.func1")); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// buildLib builds libte.so from this package once per test binary.
func buildLib(tb testing.TB) string {
	tb.Helper()
	libOnce.Do(func() {
		libDir, libErr = os.MkdirTemp("", "te-capi-test-")
		if libErr != nil {
			return
		}
		// The flags of the release build (Makefile, CMakeLists.txt): the
		// version script is what keeps the Go exports out of sight.
		script, err := filepath.Abs("libte.map")
		if err != nil {
			libErr = err
			return
		}
		cmd := exec.Command("go", "build", "-buildmode=c-shared", "-trimpath",
			"-ldflags=-s -w -extldflags '-Wl,-soname,libte.so.1 -Wl,--version-script="+script+"'",
			"-o", filepath.Join(libDir, "libte.so"), ".")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=1")
		if out, err := cmd.CombinedOutput(); err != nil {
			libErr = &buildError{err, out}
			return
		}
		// Programs linked with -lte look for the soname.
		libErr = os.Symlink("libte.so", filepath.Join(libDir, "libte.so.1"))
	})
	if libErr != nil {
		tb.Fatalf("building libte.so: %v", libErr)
	}
	return filepath.Join(libDir, "libte.so")
}

type buildError struct {
	err error
	out []byte
}

func (e *buildError) Error() string { return e.err.Error() + "\n" + string(e.out) }

func readHeader(t testing.TB) string {
	b, err := os.ReadFile("../include/te.h")
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestHeaderMatchesLibrary checks that every function te.h declares is
// exported by libte.so and that libte.so exports no other function: not the
// Go exports behind te.h's functions (tego_*), not the cgo glue or the Go
// runtime.
func TestHeaderMatchesLibrary(t *testing.T) {
	if testing.Short() {
		t.Skip("builds libte.so")
	}
	declared := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^int (te_\w+)\(`).FindAllStringSubmatch(readHeader(t), -1) {
		declared[m[1]] = true
	}
	if len(declared) < 20 {
		t.Fatalf("found only %d declarations in te.h: %v", len(declared), declared)
	}
	f, err := elf.Open(buildLib(t))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	syms, err := f.DynamicSymbols()
	if err != nil {
		t.Fatal(err)
	}
	exported := map[string]bool{}
	for _, s := range syms {
		if elf.ST_TYPE(s.Info) == elf.STT_FUNC && s.Section != elf.SHN_UNDEF {
			exported[s.Name] = true
		}
	}
	var missing, extra []string
	for n := range declared {
		if !exported[n] {
			missing = append(missing, n)
		}
	}
	for n := range exported {
		if !declared[n] {
			extra = append(extra, n)
		}
	}
	sort.Strings(missing)
	sort.Strings(extra)
	if len(missing) > 0 {
		t.Errorf("declared in te.h but not exported by libte.so: %v", missing)
	}
	if len(extra) > 0 {
		t.Errorf("exported by libte.so but not declared in te.h: %v", extra)
	}
	if soname, _ := f.DynString(elf.DT_SONAME); len(soname) != 1 || soname[0] != "libte.so.1" {
		t.Errorf("soname %v, want libte.so.1", soname)
	}
}

func defines(t *testing.T, prefix string) map[string]int {
	out := map[string]int{}
	re := regexp.MustCompile(`(?m)^#define (` + prefix + `\w+) \(?(-?\d+)\)?`)
	for _, m := range re.FindAllStringSubmatch(readHeader(t), -1) {
		v, err := strconv.Atoi(m[2])
		if err != nil {
			t.Fatal(err)
		}
		out[m[1]] = v
	}
	return out
}

// TestHeaderConstants checks te.h's numbers against the Go constants they
// mirror: error codes, opcodes, task states and log levels.
func TestHeaderConstants(t *testing.T) {
	want := map[string]int{
		"TE_OK":                         0,
		"TE_ERR_INVALID_ARGUMENT":       -int(errs.InvalidArgument),
		"TE_ERR_ADDRESS_NOT_REGISTERED": -int(errs.AddressNotRegistered),
		"TE_ERR_ADDRESS_OVERLAPPED":     -int(errs.AddressOverlapped),
		"TE_ERR_BATCH_BUSY":             -int(errs.BatchBusy),
		"TE_ERR_SEGMENT_NOT_FOUND":      -int(errs.SegmentNotFound),
		"TE_ERR_TRANSPORT_UNAVAILABLE":  -int(errs.TransportUnavailable),
		"TE_ERR_PEER_UNREACHABLE":       -int(errs.PeerUnreachable),
		"TE_ERR_TIMEOUT":                -int(errs.Timeout),
		"TE_ERR_METADATA":               -int(errs.Metadata),
		"TE_ERR_NOT_SUPPORTED":          -int(errs.NotSupported),
		"TE_ERR_CLOSED":                 -int(errs.Closed),
		"TE_ERR_STALE_DESCRIPTOR":       -int(errs.StaleDescriptor),
		"TE_ERR_ACCESS_DENIED":          -int(errs.AccessDenied),
		"TE_ERR_TOO_LARGE":              -int(errs.TooLarge),
		"TE_ERR_PROTOCOL":               -int(errs.Protocol),
		"TE_ERR_CANCELED":               -int(errs.Canceled),
		"TE_ERR_NO_MEMORY":              -int(errs.NoMemory),
		"TE_ERR_INTERNAL":               -int(errs.Internal),
		"TE_ERR_NOT_FOUND":              -int(errs.NotFound),
		"TE_ERR_BUFFER_TOO_SMALL":       -int(errs.BufferTooSmall),
		"TE_ERR_TRANSFER_LOST":          -int(errs.TransferLost),
		"TE_ERR_AUTH":                   -int(errs.Unauthenticated),
		"TE_ERR_FORKED":                 -int(errs.Forked),
		"TE_ERR_RESOURCE_EXHAUSTED":     -int(errs.ResourceExhausted),
		"TE_ERR_IO":                     -int(errs.IO),
		"TE_ERR_NO_SPACE":               -int(errs.NoSpace),
		"TE_READ":                       int(engine.Read),
		"TE_WRITE":                      int(engine.Write),
		"TE_TASK_WAITING":               int(engine.Waiting),
		"TE_TASK_PENDING":               int(engine.Pending),
		"TE_TASK_INVALID":               int(engine.Invalid),
		"TE_TASK_CANCELED":              int(engine.Canceled),
		"TE_TASK_COMPLETED":             int(engine.Completed),
		"TE_TASK_TIMEOUT":               int(engine.Timeout),
		"TE_TASK_FAILED":                int(engine.Failed),
		"TE_LOG_DEFAULT":                glue.LogDefault,
		"TE_LOG_DEBUG":                  glue.LogDebug,
		"TE_LOG_INFO":                   glue.LogInfo,
		"TE_LOG_WARN":                   glue.LogWarn,
		"TE_LOG_ERROR":                  glue.LogError,
		"TE_LOG_OFF":                    glue.LogOff,
	}
	got := defines(t, "TE_")
	for name, v := range want {
		if g, ok := got[name]; !ok {
			t.Errorf("te.h does not define %s", name)
		} else if g != v {
			t.Errorf("te.h: %s = %d, Go says %d", name, g, v)
		}
	}
	// Every stable code has its TE_ERR_ name.
	n := 0
	for name := range got {
		if strings.HasPrefix(name, "TE_ERR_") {
			n++
		}
	}
	for c := errs.Code(1); c.String() != "code("+strconv.Itoa(int(c))+")"; c++ {
		n--
	}
	if n != 0 {
		t.Errorf("te.h has %d TE_ERR_ codes more than package errs (negative: fewer)", n)
	}
}

// TestCPrograms compiles the C test programs against a fresh libte.so and
// runs them: the error-path walk, the two-process transfer over tcp and over
// the transport the engines choose, the fork rules, the per-thread last
// error, te_destroy's release of batches and requests under windows. ctest runs the same programs.
func TestCPrograms(t *testing.T) {
	if testing.Short() {
		t.Skip("builds libte.so")
	}
	cc, err := exec.LookPath("cc")
	if err != nil {
		t.Skip("no C compiler (cc) on PATH")
	}
	lib := buildLib(t)
	dir := t.TempDir()
	for _, prog := range []struct {
		src  string
		args [][]string
	}{
		{"errors", [][]string{nil}},
		{"two_process", [][]string{{"tcp"}, {"auto"}, {"tcp", "encrypt"}}},
		{"fork", [][]string{nil}},
		{"fork_fresh", [][]string{{lib}}},
		{"lifecycle", [][]string{nil}},
		{"file", [][]string{{t.TempDir()}}},
		{"window", [][]string{{"tcp"}, {"local"}}},
	} {
		bin := filepath.Join(dir, prog.src)
		link := []string{"-L" + filepath.Dir(lib), "-lte", "-Wl,-rpath," + filepath.Dir(lib), "-lpthread"}
		if prog.src == "fork_fresh" {
			link = []string{"-ldl"} // loads libte itself, in its child
		}
		build := exec.Command(cc, append([]string{"-std=c11", "-D_GNU_SOURCE", "-Wall", "-Wextra", "-Werror", "-I../include",
			"-I../tests/c", "../tests/c/" + prog.src + ".c", "-o", bin}, link...)...)
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("compiling %s: %v\n%s", prog.src, err, out)
		}
		for _, args := range prog.args {
			cmd := exec.Command(bin, args...)
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			if err := cmd.Run(); err != nil {
				t.Errorf("%s %v: %v\n%s", prog.src, args, err, out.String())
			} else {
				t.Logf("%s %v: %s", prog.src, args, strings.TrimSpace(out.String()))
			}
		}
	}
}
