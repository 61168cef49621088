package fabric

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// Regions that killed te processes of this pid namespace left behind are
// removed; those of live processes, of other namespaces, of this process
// and of anything else are not. Names are unique per process, domain and
// random part.
func TestReapShm(t *testing.T) {
	dir := t.TempDir()
	old := shmDir
	shmDir = dir
	t.Cleanup(func() { shmDir = old })
	ns := pidNS()
	if ns == "0" {
		t.Skip("no /proc/self/ns/pid here")
	}
	// A pid that existed and is gone: a child that exited.
	c := exec.Command("true")
	if err := c.Run(); err != nil {
		t.Fatal(err)
	}
	dead := c.Process.Pid
	files := map[string]bool{ // name: removed
		"te-" + ns + "-" + strconv.Itoa(dead) + "-1-00aa:0:0":         true,
		"te-" + ns + "-" + strconv.Itoa(os.Getppid()) + "-1-00bb:0:0": false, // alive
		"te-" + ns + "-" + strconv.Itoa(os.Getpid()) + "-2-00cc:0:0":  false, // this process
		"te-4026531999-" + strconv.Itoa(dead) + "-1-00dd:0:0":         false, // another namespace
		"te-" + strconv.Itoa(dead) + "-1:0:0":                         false, // an older te's name: not judged
		"fi_shm-" + strconv.Itoa(dead):                                false,
		"te-" + ns + "-notapid-1-00ee:0:0":                            false,
	}
	for f := range files {
		if err := os.WriteFile(filepath.Join(dir, f), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if n := reapShm(ns); n != 1 {
		t.Errorf("removed %d regions, want 1", n)
	}
	for f, removed := range files {
		_, err := os.Stat(filepath.Join(dir, f))
		if gone := os.IsNotExist(err); gone != removed {
			t.Errorf("%s: removed %v, want %v", f, gone, removed)
		}
	}
	a, b := shmName(), shmName()
	if a == b || !strings.HasPrefix(a, "te-"+ns+"-"+strconv.Itoa(os.Getpid())+"-") {
		t.Fatalf("names %q and %q", a, b)
	}
}
