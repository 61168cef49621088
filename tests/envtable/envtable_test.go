package envtable_test

import (
	_ "github.com/tecache/te/engine/std"

	"bufio"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/tecache/te/cmd/te-sidecar/sidecar"
	"github.com/tecache/te/engine"
)

const root = "../.."

type row struct {
	name, readBy, refused string
}

// table parses README.md's "Environment" table.
func table(t *testing.T) []row {
	t.Helper()
	f, err := os.Open(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var rows []row
	in := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "## ") {
			in = line == "## Environment"
			continue
		}
		if !in || !strings.HasPrefix(line, "| `") {
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		if len(cells) != 4 {
			t.Fatalf("README.md: a row of the Environment table has %d cells: %q", len(cells), line)
		}
		name := strings.Trim(strings.TrimSpace(cells[0]), "`")
		// The refused example is the first `quoted` span of the cell; a
		// cell without one ("—") has none.
		refused := "—"
		if parts := strings.Split(cells[3], "`"); len(parts) >= 3 {
			refused = parts[1]
		}
		rows = append(rows, row{name: name, readBy: strings.TrimSpace(cells[1]), refused: refused})
	}
	if len(rows) < 30 {
		t.Fatalf("README.md's Environment table has %d rows", len(rows))
	}
	return rows
}

// key turns a table name into what the code names: TE_PARAM_<transport>_<parameter>
// is the prefix TE_PARAM_.
func key(name string) string {
	if i := strings.IndexByte(name, '<'); i >= 0 {
		return name[:i]
	}
	return name
}

var (
	// A Go call whose function name says env (os.Getenv, getenv, envInt,
	// LookupEnv) with a te variable as its first argument, and constants
	// named Env... holding one.
	goCall  = regexp.MustCompile(`(?i)\b[a-z_.]*env[a-z_]*\(\s*"((?:TE|MC|NIXL)_[A-Z0-9_]*)"`)
	goConst = regexp.MustCompile(`(?m)^\s*(?:const\s+)?[Ee]nv\w*\s*=\s*"((?:TE|MC|NIXL)_[A-Z0-9_]*)"`)
	// Python: os.environ.get("X"), os.environ["X"], os.getenv("X"), and
	// the drop-in's _env_bool("X").
	pyRead = regexp.MustCompile(`(?:environ(?:\.get)?[\[(]|getenv\(|_env_bool\()\s*["']((?:TE|MC|NIXL)_[A-Z0-9_]*)["']`)
	// Shell: ${TE_X...} or $TE_X.
	shRead = regexp.MustCompile(`\$\{?((?:TE|MC)_[A-Z0-9_]+)`)
)

// read returns the te variables the code reads, with a file that reads
// each: Go outside tests and test helpers, the Python packages and build
// backend, and the build scripts.
func read(t *testing.T) map[string]string {
	t.Helper()
	out, err := exec.Command("git", "-C", root, "ls-files").Output()
	if err != nil {
		t.Skipf("git ls-files: %v", err)
	}
	found := map[string]string{}
	add := func(re *regexp.Regexp, path string, b []byte) {
		for _, m := range re.FindAllSubmatch(b, -1) {
			v := string(m[1])
			// One parameter spelled out (te-bench hands its flag to a
			// child that way) is the TE_PARAM_ row.
			if strings.HasPrefix(v, "TE_PARAM_") {
				v = "TE_PARAM_"
			}
			if _, ok := found[v]; !ok {
				found[v] = path
			}
		}
	}
	for _, path := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if testOnly(path) {
			continue
		}
		b, err := os.ReadFile(filepath.Join(root, path))
		if err != nil {
			continue // deleted in the work tree
		}
		switch {
		case strings.HasSuffix(path, ".go"):
			add(goCall, path, b)
			add(goConst, path, b)
		case strings.HasSuffix(path, ".py") && strings.HasPrefix(path, "python/"):
			add(pyRead, path, b)
		case path == "mk/version.sh":
			add(shRead, path, b)
		}
	}
	return found
}

// testOnly reports whether path is test code: its variables (CI,
// TE_TRANSPORTTEST_PEER, ...) are not settings.
func testOnly(path string) bool {
	if strings.HasSuffix(path, "_test.go") || strings.HasPrefix(path, "tests/") || strings.HasPrefix(path, "python/tests/") ||
		strings.HasPrefix(path, "examples/") {
		return true
	}
	for _, d := range strings.Split(filepath.Dir(path), "/") {
		if strings.HasSuffix(d, "test") || d == "testdata" || d == "testexec" {
			return true
		}
	}
	return false
}

// TestTableMatchesCode: every variable the code reads is in the table, and
// every variable in the table is read.
func TestTableMatchesCode(t *testing.T) {
	rows := table(t)
	code := read(t)
	inTable := map[string]bool{}
	for _, r := range rows {
		if inTable[key(r.name)] {
			t.Errorf("%s is in the table twice", r.name)
		}
		inTable[key(r.name)] = true
	}
	var missing, stale []string
	for v, path := range code {
		if !inTable[v] {
			missing = append(missing, v+" ("+path+")")
		}
	}
	for v := range inTable {
		if _, ok := code[v]; !ok {
			stale = append(stale, v)
		}
	}
	sort.Strings(missing)
	sort.Strings(stale)
	if len(missing) > 0 {
		t.Errorf("read by the code but not in README.md's Environment table: %v", missing)
	}
	if len(stale) > 0 {
		t.Errorf("in README.md's Environment table but read nowhere: %v", stale)
	}
}

// TestEngineRefuses: each engine variable's refused example fails engine
// creation with a message naming the variable.
func TestEngineRefuses(t *testing.T) {
	for _, r := range table(t) {
		if r.refused == "—" || !strings.HasPrefix(r.readBy, "engine") {
			continue
		}
		name, value := r.name, r.refused
		if strings.Contains(name, "<") { // TE_PARAM_<...>: the example is NAME=VALUE
			var ok bool
			if name, value, ok = strings.Cut(r.refused, "="); !ok {
				t.Fatalf("%s: the example %q is not NAME=VALUE", r.name, r.refused)
			}
		}
		t.Run(name, func(t *testing.T) {
			if name != engine.EnvListenAddr && name != engine.EnvHostname {
				t.Setenv(engine.EnvListenAddr, "127.0.0.1:0") // loopback, as every test
			}
			t.Setenv(name, value)
			e, err := engine.New(engine.Config{Logger: discard})
			if err == nil {
				e.Close()
				t.Fatalf("%s=%q accepted", name, value)
			}
			if !strings.Contains(err.Error(), name) {
				t.Fatalf("%s=%q: refused without naming the variable: %v", name, value, err)
			}
		})
	}
}

// TestSidecarRefuses: te-sidecar's rows, through its option parsing. The
// message must name the variable or quote the value (te-sidecar reads some
// variables as its flags' defaults and reports the flag's value).
func TestSidecarRefuses(t *testing.T) {
	for _, r := range table(t) {
		if r.refused == "—" || !slices.Contains(strings.Split(r.readBy, ", "), "te-sidecar") {
			continue
		}
		t.Run(r.name, func(t *testing.T) {
			getenv := func(k string) string {
				if k == r.name {
					return r.refused
				}
				return ""
			}
			_, err := sidecar.ParseOptions(nil, getenv, io.Discard)
			if err == nil {
				t.Fatalf("%s=%q accepted", r.name, r.refused)
			}
			if !strings.Contains(err.Error(), r.name) && !strings.Contains(err.Error(), r.refused) {
				t.Fatalf("%s=%q: refused without naming the variable or the value: %v", r.name, r.refused, err)
			}
		})
	}
}

var discard = slog.New(slog.DiscardHandler)
