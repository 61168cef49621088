package nvml_test

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/sys/nvml"
	"github.com/tecache/te/internal/sys/nvml/nvmltest"
)

func fake(t *testing.T, flags ...string) *nvml.Lib {
	t.Helper()
	p, err := nvmltest.BuildFake(flags...)
	if err != nil {
		t.Skipf("no C compiler for the fake NVML: %v", err)
	}
	l, err := nvml.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// TestFabricDomain reads the fabric registration through both calls (the
// versioned one of R550 drivers, and the older one alone) and derives the
// domain only from a completed, successful registration with a cluster.
func TestFabricDomain(t *testing.T) {
	for _, build := range []struct {
		name  string
		flags []string
	}{{"V", nil}, {"v1-only", []string{"-DFAKENVML_V1_ONLY"}}} {
		t.Run(build.name, func(t *testing.T) {
			l := fake(t, build.flags...)
			const bus = "0000:19:00.0"
			for _, c := range []struct {
				name           string
				env            map[string]string
				domain, reason string
			}{
				{"no fabric", map[string]string{"FAKECUDA_FABRIC_DOMAIN": ""}, "", "not on a multi-node NVLink fabric"},
				{"rack", map[string]string{"FAKECUDA_FABRIC_DOMAIN": "nvl72-a", "FAKENVML_CLIQUE": "7"}, "6e766c37322d61000000000000000000:7", ""},
				{"other clique", map[string]string{"FAKECUDA_FABRIC_DOMAIN": "nvl72-a", "FAKENVML_CLIQUE": "8"}, "6e766c37322d61000000000000000000:8", ""},
				{"in progress", map[string]string{"FAKECUDA_FABRIC_DOMAIN": "nvl72-a", "FAKENVML_STATE": "2"}, "", "has not finished"},
				{"failed", map[string]string{"FAKECUDA_FABRIC_DOMAIN": "nvl72-a", "FAKENVML_STATUS": "999"}, "", "registration failed"},
			} {
				for _, k := range []string{"FAKECUDA_FABRIC_DOMAIN", "FAKENVML_CLIQUE", "FAKENVML_STATE", "FAKENVML_STATUS"} {
					t.Setenv(k, c.env[k])
				}
				f, err := l.FabricOf(bus)
				if err != nil {
					t.Fatalf("%s: %v", c.name, err)
				}
				d, why := f.Domain()
				if d != c.domain || !strings.Contains(why, c.reason) || (c.reason == "") != (why == "") {
					t.Errorf("%s: domain %q (%q), want %q (%q)", c.name, d, why, c.domain, c.reason)
				}
			}
			if _, err := l.FabricOf(strings.Repeat("0", 40)); errs.CodeOf(err) != errs.InvalidArgument {
				t.Errorf("an over-long bus id: %v, want InvalidArgument", err)
			}
			if _, err := l.FabricOf("0:1"); err == nil || !strings.Contains(err.Error(), "Invalid Argument") {
				t.Errorf("a bus id the library refuses: %v, want its error string", err)
			}
		})
	}
}

// TestOpenRefusals: a missing library and one whose nvmlInit_v2 fails are
// NotSupported errors that say which.
func TestOpenRefusals(t *testing.T) {
	if _, err := nvml.Open("/no/such/libnvidia-ml.so.1"); errs.CodeOf(err) != errs.NotSupported || !strings.Contains(err.Error(), "/no/such") {
		t.Errorf("missing library: %v", err)
	}
	p, err := nvmltest.BuildFake()
	if err != nil {
		t.Skipf("no C compiler for the fake NVML: %v", err)
	}
	t.Setenv("FAKENVML_INIT", "12")
	if _, err := nvml.Open(p); errs.CodeOf(err) != errs.NotSupported || !strings.Contains(err.Error(), "Driver Not Loaded") {
		t.Errorf("nvmlInit_v2 failing: %v", err)
	}
}

// TestHeaderFacts checks the layouts package nvml mirrors against
// testdata/nvml_h_facts.txt (TestFacts, inside the package) and, where
// TE_NVML_HEADER names an nvml.h, that header against the facts.
func TestHeaderFacts(t *testing.T) {
	h := os.Getenv("TE_NVML_HEADER")
	if h == "" {
		t.Skip("TE_NVML_HEADER names no nvml.h (the facts file is checked by TestFacts)")
	}
	bin := filepath.Join(t.TempDir(), "facts")
	if out, err := exec.Command("cc", "-I", filepath.Dir(h), "-o", bin, "testdata/facts.c").CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	out, err := exec.Command(bin).Output()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]uint64{}
	for _, l := range factLines(t) {
		want[l[0]], _ = strconv.ParseUint(l[1], 10, 64)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		k, v, _ := strings.Cut(line, " ")
		if n, _ := strconv.ParseUint(v, 10, 64); want[k] != n {
			t.Errorf("%s: %s says %d, the facts %d", k, h, n, want[k])
		}
	}
}

func factLines(t *testing.T) [][2]string {
	t.Helper()
	f, err := os.Open("testdata/nvml_h_facts.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out [][2]string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, _ := strings.Cut(line, " ")
		out = append(out, [2]string{k, v})
	}
	return out
}

// TestDomain: the domain of a process's GPUs through Load (the fake, by
// TE_NVML_LIBRARY), with the error's code telling no fabric from a fabric
// that is not ready.
func TestDomain(t *testing.T) {
	p, err := nvmltest.BuildFake()
	if err != nil {
		t.Skipf("no C compiler for the fake NVML: %v", err)
	}
	t.Setenv(nvml.EnvLibrary, p)
	gpus := []string{"0000:19:00.0", "0000:3b:00.0"}
	t.Setenv("FAKECUDA_FABRIC_DOMAIN", "rack-b")
	t.Setenv("FAKENVML_CLIQUE", "3")
	if d, err := nvml.Domain(gpus); err != nil || d != "7261636b2d6200000000000000000000:3" {
		t.Errorf("domain %q, %v", d, err)
	}
	t.Setenv("FAKENVML_STATE", "1")
	if d, err := nvml.Domain(gpus); d != "" || errs.CodeOf(err) != errs.TransportUnavailable {
		t.Errorf("registration not started: %q, %v; want TransportUnavailable", d, err)
	}
	t.Setenv("FAKECUDA_FABRIC_DOMAIN", "")
	if d, err := nvml.Domain(gpus); d != "" || errs.CodeOf(err) != errs.NotSupported {
		t.Errorf("no fabric: %q, %v; want NotSupported", d, err)
	}
	if d, err := nvml.Domain(nil); d != "" || errs.CodeOf(err) != errs.NotSupported {
		t.Errorf("no GPU: %q, %v; want NotSupported", d, err)
	}
}

// TestRealFabric reads the fabric registration of the GPUs at the PCI
// addresses TE_NVML_TEST_BUSES lists (comma-separated) from the real
// library, where TE_NVML_REAL=1 (the GPU device check): every call must
// answer, and a completed registration must make a domain.
func TestRealFabric(t *testing.T) {
	if os.Getenv(nvmltest.EnvReal) != "1" {
		t.Skip("TE_NVML_REAL=1 runs it against the real library")
	}
	l, err := nvml.Open(nvml.DefaultLibrary)
	if err != nil {
		t.Fatal(err)
	}
	buses := strings.FieldsFunc(os.Getenv("TE_NVML_TEST_BUSES"), func(r rune) bool { return r == ',' || r == ' ' })
	if len(buses) == 0 {
		t.Fatal("TE_NVML_TEST_BUSES lists no GPU")
	}
	for _, b := range buses {
		f, err := l.FabricOf(strings.ToLower(b))
		if err != nil {
			t.Fatalf("%s: %v", b, err)
		}
		d, why := f.Domain()
		t.Logf("%s: fabric state %d, status %d, clique %d: domain %q %s", b, f.State, f.Status, f.Clique, d, why)
		if f.State == nvml.StateCompleted && f.Status == 0 && d == "" {
			t.Errorf("%s: a completed registration made no domain: %s", b, why)
		}
	}
}
