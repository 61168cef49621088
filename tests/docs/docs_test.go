package docs_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

const root = "../.."

func python(t *testing.T) string {
	t.Helper()
	for _, p := range []string{"/usr/bin/python3", "python3"} {
		if path, err := exec.LookPath(p); err == nil {
			return path
		}
	}
	t.Skip("no python3 to run docs/gen.py")
	return ""
}

// TestReferenceCurrent: docs/c-api.md and docs/python-api.md are what
// docs/gen.py writes from te.h and the docstrings now.
func TestReferenceCurrent(t *testing.T) {
	cmd := exec.Command(python(t), "docs/gen.py", "--check")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
}

// TestReferenceComplete: every function te.h declares has its section in
// docs/c-api.md.
func TestReferenceComplete(t *testing.T) {
	h, err := os.ReadFile(filepath.Join(root, "include", "te.h"))
	if err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile(filepath.Join(root, "docs", "c-api.md"))
	if err != nil {
		t.Fatal(err)
	}
	fns := regexp.MustCompile(`(?m)^int (te_\w+)\(`).FindAllStringSubmatch(string(h), -1)
	if len(fns) < 40 {
		t.Fatalf("%d functions in te.h", len(fns))
	}
	for _, f := range fns {
		if !strings.Contains(string(doc), "\n### "+f[1]+"\n") {
			t.Errorf("docs/c-api.md has no section for %s", f[1])
		}
	}
}

// TestTroubleshootingCoversEveryCode: each TE_ERR_* code of te.h is named
// on the troubleshooting page.
func TestTroubleshootingCoversEveryCode(t *testing.T) {
	h, _ := os.ReadFile(filepath.Join(root, "include", "te.h"))
	page, err := os.ReadFile(filepath.Join(root, "docs", "troubleshooting.md"))
	if err != nil {
		t.Fatal(err)
	}
	codes := regexp.MustCompile(`(?m)^#define (TE_ERR_\w+) \(`).FindAllStringSubmatch(string(h), -1)
	if len(codes) < 20 {
		t.Fatalf("%d codes in te.h", len(codes))
	}
	for _, c := range codes {
		if !strings.Contains(string(page), c[1]) {
			t.Errorf("docs/troubleshooting.md does not name %s", c[1])
		}
	}
}

// TestReadmeLinks: every file README.md names under docs/, examples/,
// deploy/ or at the top level exists.
func TestReadmeLinks(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	seen := 0
	for _, m := range regexp.MustCompile("`((?:docs|examples|deploy)/[\\w./-]+|LICENSE|CHANGELOG\\.md|Dockerfile|SECURITY\\.md)`").FindAllStringSubmatch(string(b), -1) {
		seen++
		if _, err := os.Stat(filepath.Join(root, m[1])); err != nil {
			t.Errorf("README.md names %s: %v", m[1], err)
		}
	}
	if seen < 5 {
		t.Fatalf("found only %d file names in README.md", seen)
	}
}
