package mk_test

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

func repo(t *testing.T) string {
	t.Helper()
	r, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func needMake(t *testing.T) string {
	t.Helper()
	m, err := exec.LookPath("make")
	if err != nil {
		t.Skip("no make")
	}
	return m
}

// scratch writes a makefile that includes the real Makefile (so the real
// test-suites rule runs) and adds fake suites.
func scratch(t *testing.T) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), "scratch.mk")
	body := "include " + filepath.Join(repo(t), "Makefile") + "\n" +
		".PHONY: fake-ok fake-fail fake-ok2 fake-skip\n" +
		"fake-ok: ; @echo ran-fake-ok\n" +
		"fake-skip: ; @mk/skip.sh nothing to run here\n" +
		"fake-fail: ; @echo ran-fake-fail; exit 3\n" +
		"fake-ok2: ; @echo ran-fake-ok2\n"
	if err := os.WriteFile(f, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return f
}

func runMake(t *testing.T, args ...string) (string, int) {
	t.Helper()
	// Under make test this runs inside make: a sub-make there would say
	// "Entering/Leaving directory" around the output the tests read.
	cmd := exec.Command(needMake(t), append([]string{"--no-print-directory"}, args...)...)
	cmd.Dir = repo(t)
	cmd.Env = append(os.Environ(), "MAKEFLAGS=", "MAKELEVEL=")
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return string(out), 0
	case errors.As(err, &ee):
		return string(out), ee.ExitCode()
	}
	t.Fatalf("make: %v", err)
	return "", 0
}

// TestSuitesRunAllAndSummarize: a failing suite does not stop the ones
// after it; the summary has a line per suite and the total, and the run
// fails.
func TestSuitesRunAllAndSummarize(t *testing.T) {
	mf := scratch(t)
	out, code := runMake(t, "-f", mf, "test-suites", "TEST_SUITES=fake-ok fake-fail fake-ok2")
	if code == 0 {
		t.Fatalf("a failing suite, yet make exited 0:\n%s", out)
	}
	for _, want := range []string{"ran-fake-ok\n", "ran-fake-fail\n", "ran-fake-ok2\n",
		"==> suite 3/3: fake-ok2", "==> summary"} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q in:\n%s", want, out)
		}
	}
	summary := out[strings.Index(out, "==> summary"):]
	for _, re := range []string{`(?m)^PASS fake-ok +\d+s  \(exit 0\)$`, `(?m)^FAIL fake-fail +\d+s  \(exit \d+\)$`,
		`(?m)^PASS fake-ok2 +\d+s  \(exit 0\)$`, `(?m)^total: 3 suites, 2 passed, 1 failed, 0 skipped, \d+s$`} {
		if !regexp.MustCompile(re).MatchString(summary) {
			t.Errorf("summary lacks %s:\n%s", re, summary)
		}
	}
	// The order of the summary is the order of the suites.
	if strings.Index(summary, "fake-ok ") > strings.Index(summary, "fake-fail") {
		t.Errorf("summary out of order:\n%s", summary)
	}

	out, code = runMake(t, "-f", mf, "test-suites", "TEST_SUITES=fake-ok fake-ok2")
	if code != 0 || !strings.Contains(out, "total: 2 suites, 2 passed, 0 failed, 0 skipped") {
		t.Fatalf("all passing: exit %d:\n%s", code, out)
	}
}

// TestSuiteThatRanNothingIsSkip: a suite that ran nothing (mk/skip.sh) is
// SKIP in the summary and counted apart, CI's "N passed, N failed" still
// opens the total, and skips alone do not fail the run.
func TestSuiteThatRanNothingIsSkip(t *testing.T) {
	mf := scratch(t)
	out, code := runMake(t, "-f", mf, "test-suites", "TEST_SUITES=fake-ok fake-skip fake-ok2")
	if code != 0 {
		t.Fatalf("only a skip, yet make exited %d:\n%s", code, out)
	}
	summary := out[strings.Index(out, "==> summary"):]
	for _, re := range []string{`(?m)^PASS fake-ok +\d+s  \(exit 0\)$`,
		`(?m)^SKIP fake-skip +\d+s  \(exit 0\): nothing to run here$`,
		`(?m)^total: 3 suites, 2 passed, 0 failed, 1 skipped, \d+s$`} {
		if !regexp.MustCompile(re).MatchString(summary) {
			t.Errorf("summary lacks %s:\n%s", re, summary)
		}
	}
	// The form CI reads: "N passed, N failed" in the closing line.
	last := strings.TrimSpace(summary[strings.LastIndex(strings.TrimSpace(summary), "\n")+1:])
	if !regexp.MustCompile(`^total: \d+ suites, \d+ passed, \d+ failed(, \d+ skipped)?, \d+s$`).MatchString(last) {
		t.Errorf("closing line %q is not in the form CI reads", last)
	}
	// A skip next to a failure: the failure still fails the run.
	out, code = runMake(t, "-f", mf, "test-suites", "TEST_SUITES=fake-skip fake-fail")
	if code == 0 || !strings.Contains(out, "total: 2 suites, 0 passed, 1 failed, 1 skipped") {
		t.Fatalf("skip and fail: exit %d:\n%s", code, out)
	}
}

// TestDefaultSuites: make test runs every suite, each also a target of its
// own.
func TestDefaultSuites(t *testing.T) {
	out, code := runMake(t, "-s", "list-suites")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, out)
	}
	got := strings.Fields(out)
	for _, want := range []string{"test-go", "test-c", "test-examples", "test-python", "test-pip-install"} {
		found := false
		for _, g := range got {
			found = found || g == want
		}
		if !found {
			t.Errorf("make test does not run %s (suites: %v)", want, got)
		}
	}
	// make -n shows each suite's own rule: they stay runnable alone.
	for _, s := range got {
		if out, code := runMake(t, "-n", s); code != 0 {
			t.Errorf("make -n %s: exit %d: %s", s, code, out)
		}
	}
}

// TestHeartbeat: a long step says it is still running, and its exit status
// comes through.
func TestHeartbeat(t *testing.T) {
	cmd := exec.Command(filepath.Join(repo(t), "mk", "heartbeat.sh"), "step", "sh", "-c", "sleep 2.5; echo done; exit 7")
	cmd.Env = append(os.Environ(), "HEARTBEAT=1")
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 7 {
		t.Fatalf("exit: %v, want 7", err)
	}
	// The count is whole seconds of bash's SECONDS, which ticks on its own
	// clock: the first line may say 1s or 2s, later on a busy machine.
	if !regexp.MustCompile(`(?m)^step: still running \([0-9]+s\)$`).Match(out) || !strings.Contains(string(out), "done") {
		t.Fatalf("output %q", out)
	}
}

// TestVersionScript: mk/version.sh prints te.h's version, with the commit
// in a git checkout, or TE_VERSION when set.
func TestVersionScript(t *testing.T) {
	h, err := os.ReadFile(filepath.Join(repo(t), "include", "te.h"))
	if err != nil {
		t.Fatal(err)
	}
	maj := regexp.MustCompile(`(?m)^#define TE_ABI_VERSION_MAJOR (\d+)`).FindSubmatch(h)
	min := regexp.MustCompile(`(?m)^#define TE_ABI_VERSION_MINOR (\d+)`).FindSubmatch(h)
	base := string(maj[1]) + "." + string(min[1]) + ".0"
	script := filepath.Join(repo(t), "mk", "version.sh")
	cmd := exec.Command(script)
	cmd.Env = append(os.Environ(), "TE_VERSION=")
	out, err := cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	v := strings.TrimSpace(string(out))
	if !regexp.MustCompile(`^` + regexp.QuoteMeta(base) + `(\+g[0-9a-f]{12}(\.dirty)?|\+dev)?$`).MatchString(v) {
		t.Fatalf("version %q, want %s[+g<commit>[.dirty]]", v, base)
	}
	cmd = exec.Command(script)
	cmd.Env = append(os.Environ(), "TE_VERSION=9.9.9+test")
	if out, err := cmd.Output(); err != nil || strings.TrimSpace(string(out)) != "9.9.9+test" {
		t.Fatalf("TE_VERSION: %q %v", out, err)
	}
}
