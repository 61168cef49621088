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
// structs live in more than one).
func Program(header string, facts []Fact) string {
	var b strings.Builder
	b.WriteString("#include <stddef.h>\n#include <stdio.h>\n")
	for _, h := range strings.Fields(header) {
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
// on amd64) and, when a C compiler ($CC, else cc) and header are installed,
// with what the compiler says; TE_UPDATE_GOLDEN=1 rewrites the golden file
// from the compiler, under the comment line note.
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
	} else if runtime.GOARCH == "amd64" {
		t.Fatalf("golden layout missing: %v", err)
	}
	if real == nil {
		t.Logf("not compared with the installed %s: %s", header, why)
		return
	}
	compare(t, header, Parse(t, real), facts)
}

// compile builds and runs Program; nil and the reason without a compiler or
// the header.
func compile(t *testing.T, header string, facts []Fact) ([]byte, string) {
	cc := os.Getenv("CC")
	if cc == "" {
		cc = "cc"
	}
	if _, err := exec.LookPath(cc); err != nil {
		return nil, "no C compiler: " + err.Error()
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "layout.c")
	if err := os.WriteFile(src, []byte(Program(header, facts)), 0o644); err != nil {
		t.Fatal(err)
	}
	exe := filepath.Join(dir, "layout")
	out, err := exec.Command(cc, "-o", exe, src).CombinedOutput()
	if err != nil {
		for _, h := range strings.Fields(header) {
			if bytes.Contains(out, []byte(h)) {
				return nil, h + " not installed"
			}
		}
		t.Fatalf("compiling the layout program: %v\n%s", err, out)
	}
	res, err := exec.Command(exe).Output()
	if err != nil {
		t.Fatalf("running the layout program: %v", err)
	}
	return res, ""
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
