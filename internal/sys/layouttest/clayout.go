package layouttest

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/tecache/te/internal/testexec"
)

// Fact is one pair of numbers the C compiler knows, printed under Key: a
// member's offset and size, a type's size (offset 0), or a constant (0 and
// its value).
type Fact struct {
	Key  string
	Expr string    // C expression for the two values, each a size_t
	Go   [2]uint64 // what the Go side says
}

// Member is the offset and size of member m of ctype.
func Member(ctype, m string, off, size uintptr) Fact {
	return Fact{ctype + "." + m, fmt.Sprintf("offsetof(%s, %s), sizeof(((%s *)0)->%s)", ctype, m, ctype, m),
		[2]uint64{uint64(off), uint64(size)}}
}

// Size is the size of ctype.
func Size(ctype string, size uintptr) Fact {
	return Fact{ctype, fmt.Sprintf("(size_t)0, sizeof(%s)", ctype), [2]uint64{0, uint64(size)}}
}

// Const is the value of the C constant name.
func Const(name string, v uint64) Fact {
	return Fact{name, fmt.Sprintf("(size_t)0, (size_t)(%s)", name), [2]uint64{0, v}}
}

// Program is the C program that prints every fact, one "key a b" line each.
// header names one header, or several separated by spaces (a library whose
// structs live in more than one); a NAME=VALUE among them is a macro defined
// before the headers that follow (HIP's headers refuse to compile without
// __HIP_PLATFORM_AMD__, which hipcc would define).
func Program(header string, facts []Fact) string {
	var b strings.Builder
	b.WriteString("#include <stddef.h>\n#include <stdio.h>\n")
	for _, h := range strings.Fields(header) {
		if name, value, ok := strings.Cut(h, "="); ok {
			fmt.Fprintf(&b, "#define %s %s\n", name, value)
			continue
		}
		fmt.Fprintf(&b, "#include <%s>\n", h)
	}
	b.WriteString("\nint main(void) {\n")
	for _, f := range facts {
		fmt.Fprintf(&b, "\tprintf(\"%%s %%zu %%zu\\n\", %q, %s);\n", f.Key, f.Expr)
	}
	b.WriteString("\treturn 0;\n}\n")
	return b.String()
}

// Check compares facts with golden (testdata/layout_GOARCH.golden, required
// on amd64 and arm64) and, when a C compiler ($CC with $CFLAGS, else cc) and
// header are installed, with what the compiler says; TE_UPDATE_GOLDEN=1
// rewrites the golden file from the compiler, under the comment line note.
// make test-arm64 runs it in an arm64 test binary under qemu-user with the
// cross compiler as $CC: the program is built for arm64 and run under the
// same emulator (testexec), so each architecture's Go mirrors meet that
// architecture's headers.
func Check(t *testing.T, header, note string, facts []Fact) {
	t.Helper()
	golden := filepath.Join("testdata", "layout_"+runtime.GOARCH+".golden")
	real, why := compile(t, header, facts)
	if real != nil && os.Getenv("TE_UPDATE_GOLDEN") == "1" {
		if err := os.WriteFile(golden, append([]byte("# "+note+"\n"), real...), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if g, err := os.ReadFile(golden); err == nil {
		compare(t, golden, Parse(t, g), facts)
	} else if runtime.GOARCH == "amd64" || runtime.GOARCH == "arm64" {
		t.Fatalf("golden layout missing: %v", err)
	}
	if real == nil {
		t.Logf("not compared with the installed %s: %s", header, why)
		return
	}
	compare(t, header, Parse(t, real), facts)
}

// compile builds and runs Program with $CC and $CFLAGS; nil and the
// reason without a compiler or the header.
func compile(t *testing.T, header string, facts []Fact) ([]byte, string) {
	cc := os.Getenv("CC")
	if cc == "" {
		cc = "cc"
	}
	// $CFLAGS: a cross compiler may need them to find headers that are
	// the same for every architecture (-idirafter /usr/include for verbs.h).
	// The program is built for GOARCH: under make test-arm64 it runs under
	// qemu-user as the test binary does (testexec).
	return build(t, cc, strings.Fields(os.Getenv("CFLAGS")), testexec.Command, header, facts)
}

func build(t *testing.T, cc string, cflags []string, run func(string, ...string) *exec.Cmd, header string, facts []Fact) ([]byte, string) {
	t.Helper()
	if _, err := exec.LookPath(cc); err != nil {
		return nil, "no C compiler: " + err.Error()
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "layout.c")
	if err := os.WriteFile(src, []byte(Program(header, facts)), 0o644); err != nil {
		t.Fatal(err)
	}
	exe := filepath.Join(dir, "layout")
	out, err := exec.Command(cc, append(cflags, "-o", exe, src)...).CombinedOutput()
	if err != nil {
		for _, h := range strings.Fields(header) {
			if !strings.Contains(h, "=") && bytes.Contains(out, []byte(h)) {
				return nil, h + " not installed"
			}
		}
		t.Fatalf("compiling the layout program: %v\n%s", err, out)
	}
	res, err := run(exe).Output()
	if err != nil {
		t.Fatalf("running the layout program: %v", err)
	}
	return res, ""
}

// crossTools are the Debian cross compiler, user-mode emulator and target
// library directory of each architecture te is built for.
var crossTools = map[string]struct{ cc, emu, sysroot string }{
	"amd64": {"x86_64-linux-gnu-gcc", "qemu-x86_64-static", "/usr/x86_64-linux-gnu"},
	"arm64": {"aarch64-linux-gnu-gcc", "qemu-aarch64-static", "/usr/aarch64-linux-gnu"},
}

// CheckArch compares the golden file of another architecture
// (testdata/layout_GOARCH.golden of goarch) with what that architecture's
// headers say: Program built with its cross compiler and run under
// qemu-user. On x86-64 it keeps the arm64 golden file honest in make
// test-go; the arm64 Go mirrors meet the same file in make test-arm64. It
// skips, naming what is missing, without the cross compiler, the emulator
// or the header, and on goarch itself (Check covers that).
func CheckArch(t *testing.T, goarch, header string, facts []Fact) {
	t.Helper()
	if runtime.GOARCH == goarch {
		t.Skipf("this is %s: Check compares with its headers", goarch)
	}
	x, ok := crossTools[goarch]
	if !ok {
		t.Fatalf("no cross tools known for %s", goarch)
	}
	for _, tool := range []string{x.cc, x.emu} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s layouts not checked: %s is not installed (make deps: .ci/deps.d/arm64.pkgs)", goarch, tool)
		}
	}
	golden := filepath.Join("testdata", "layout_"+goarch+".golden")
	g, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("golden layout missing: %v", err)
	}
	emulate := func(name string, arg ...string) *exec.Cmd {
		c := exec.Command(x.emu, append([]string{name}, arg...)...)
		c.Env = append(os.Environ(), "QEMU_LD_PREFIX="+x.sysroot)
		return c
	}
	// The cross compiler searches its own headers first; -idirafter adds
	// the ones that are the same for every architecture (verbs.h).
	real, why := build(t, x.cc, []string{"-idirafter", "/usr/include"}, emulate, header, facts)
	if real == nil {
		t.Skipf("%s layouts not checked: %s", goarch, why)
	}
	want, have := Parse(t, g), Parse(t, real)
	for _, f := range facts {
		w, ok1 := want[f.Key]
		h, ok2 := have[f.Key]
		switch {
		case !ok1:
			t.Errorf("%s: %s has no entry", golden, f.Key)
		case !ok2:
			t.Errorf("%s for %s: %s has no entry", header, goarch, f.Key)
		case w != h:
			t.Errorf("%s: %s: %s's C has (%d, %d), the golden file (%d, %d)", golden, f.Key, goarch, h[0], h[1], w[0], w[1])
		}
	}
}

// Parse reads the program's output (or a golden file: lines starting with
// # are comments).
func Parse(t testing.TB, data []byte) map[string][2]uint64 {
	t.Helper()
	m := map[string][2]uint64{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		j := -1
		if i > 0 {
			j = strings.LastIndexByte(line[:i], ' ')
		}
		if j < 0 {
			t.Fatalf("bad layout line %q", line)
		}
		a, err1 := strconv.ParseUint(line[j+1:i], 10, 64)
		b, err2 := strconv.ParseUint(line[i+1:], 10, 64)
		if err1 != nil || err2 != nil {
			t.Fatalf("bad layout line %q", line)
		}
		m[line[:j]] = [2]uint64{a, b}
	}
	return m
}

func compare(t *testing.T, source string, c map[string][2]uint64, facts []Fact) {
	t.Helper()
	for _, f := range facts {
		got, ok := c[f.Key]
		if !ok {
			t.Errorf("%s: %s has no entry", source, f.Key)
			continue
		}
		if got != f.Go {
			t.Errorf("%s: %s: C has (%d, %d), Go has (%d, %d)", source, f.Key, got[0], got[1], f.Go[0], f.Go[1])
		}
	}
}
