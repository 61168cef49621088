package topo

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/tecache/te/internal/errs"
)

// A tree manifest describes a sysfs tree, one entry per line:
//
//	d PATH           a directory
//	f PATH VALUE     a file holding VALUE and a newline
//	l PATH TARGET    a symbolic link to TARGET (relative, as sysfs writes them)
//
// PATHs are relative to the root and hold no spaces; '#' starts a comment.

// Materialize builds the tree a manifest describes under dir (which it
// creates). A path that would leave dir is an error.
func Materialize(manifest io.Reader, dir string) error {
	sc := bufio.NewScanner(manifest)
	line := 0
	for sc.Scan() {
		line++
		s := strings.TrimSpace(sc.Text())
		if s == "" || s[0] == '#' {
			continue
		}
		f := strings.SplitN(s, " ", 3)
		if len(f) < 2 || (f[0] != "d" && len(f) < 3) {
			return errs.New(errs.InvalidArgument, "topo", "manifest line %d: %q", line, s)
		}
		p := filepath.Clean(f[1])
		if filepath.IsAbs(p) || p == ".." || strings.HasPrefix(p, "../") {
			return errs.New(errs.InvalidArgument, "topo", "manifest line %d: path %q leaves the tree", line, f[1])
		}
		full := filepath.Join(dir, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			return errs.Wrap(errs.Internal, "topo", err, "materialize %s", p)
		}
		var err error
		switch f[0] {
		case "d":
			err = os.MkdirAll(full, 0o755)
		case "f":
			err = os.WriteFile(full, []byte(f[2]+"\n"), 0o644)
		case "l":
			err = os.Symlink(f[2], full)
		default:
			return errs.New(errs.InvalidArgument, "topo", "manifest line %d: unknown kind %q", line, f[0])
		}
		if err != nil {
			return errs.Wrap(errs.Internal, "topo", err, "materialize %s", p)
		}
	}
	if err := sc.Err(); err != nil {
		return errs.Wrap(errs.Internal, "topo", err, "read the manifest")
	}
	return nil
}

// MaterializeFile builds the tree of the manifest file path under dir.
func MaterializeFile(path, dir string) error {
	f, err := os.Open(path)
	if err != nil {
		return errs.Wrap(errs.NotFound, "topo", err, "open manifest")
	}
	defer f.Close()
	return Materialize(f, dir)
}

// Record writes the manifest of what Discover reads under root (a live
// /sys): the RDMA devices and their PCI functions, the NVIDIA display
// functions, every bridge above them with its NUMA node, and the NUMA
// nodes. A bug report can carry it; Materialize rebuilds the tree.
func Record(root string, w io.Writer) error {
	rootReal, err := filepath.EvalSymlinks(root)
	if err != nil {
		return errs.Wrap(errs.NotFound, "topo", err, "sysfs root %q", root)
	}
	lines := map[string]string{}
	dir := func(p string) {
		for d := p; d != "." && d != "/" && d != ""; d = filepath.Dir(d) {
			if _, ok := lines[d]; !ok {
				lines[d] = "d " + d
			}
		}
	}
	file := func(real, name string) {
		b, err := os.ReadFile(filepath.Join(real, name))
		if err != nil {
			return
		}
		rel, _ := filepath.Rel(rootReal, filepath.Join(real, name))
		dir(filepath.Dir(rel))
		lines[rel] = "f " + rel + " " + strings.TrimSpace(string(b))
	}
	// function records a PCI function and the bridges above it.
	function := func(real string) (string, bool) {
		rel, err := filepath.Rel(rootReal, real)
		if err != nil || strings.HasPrefix(rel, "..") || strings.ContainsAny(rel, " \n") {
			return "", false
		}
		dir(rel)
		for d := rel; strings.Count(d, "/") >= 2; d = filepath.Dir(d) {
			if isBusID(filepath.Base(d)) {
				for _, n := range []string{"numa_node", "vendor", "class"} {
					file(filepath.Join(rootReal, d), n)
				}
				link := filepath.Join("bus", "pci", "devices", filepath.Base(d))
				target, _ := filepath.Rel(filepath.Dir(link), d)
				dir(filepath.Dir(link))
				lines[link] = "l " + link + " " + target
			}
		}
		return rel, true
	}
	ibs, _ := os.ReadDir(filepath.Join(rootReal, "class", "infiniband"))
	for _, e := range ibs {
		real, err := filepath.EvalSymlinks(filepath.Join(rootReal, "class", "infiniband", e.Name(), "device"))
		if err != nil || strings.ContainsAny(e.Name(), " \n") {
			continue
		}
		rel, ok := function(real)
		if !ok {
			continue
		}
		link := filepath.Join("class", "infiniband", e.Name(), "device")
		target, _ := filepath.Rel(filepath.Dir(link), rel)
		dir(filepath.Dir(link))
		lines[link] = "l " + link + " " + target
	}
	pcis, _ := os.ReadDir(filepath.Join(rootReal, "bus", "pci", "devices"))
	for _, e := range pcis {
		real, err := filepath.EvalSymlinks(filepath.Join(rootReal, "bus", "pci", "devices", e.Name()))
		if err != nil {
			continue
		}
		v, _ := os.ReadFile(filepath.Join(real, "vendor"))
		c, _ := os.ReadFile(filepath.Join(real, "class"))
		if strings.TrimSpace(string(v)) == "0x10de" && strings.HasPrefix(strings.TrimSpace(string(c)), "0x03") {
			function(real)
		}
	}
	nodes, _ := os.ReadDir(filepath.Join(rootReal, "devices", "system", "node"))
	for _, e := range nodes {
		if strings.HasPrefix(e.Name(), "node") && e.IsDir() {
			dir(filepath.Join("devices", "system", "node", e.Name()))
		}
	}
	out := make([]string, 0, len(lines))
	for _, l := range lines {
		out = append(out, l)
	}
	slices.SortFunc(out, func(a, b string) int { return strings.Compare(strings.Fields(a)[1], strings.Fields(b)[1]) })
	bw := bufio.NewWriter(w)
	fmt.Fprintf(bw, "# sysfs tree recorded by topo.Record from %s\n", root)
	for _, l := range out {
		fmt.Fprintln(bw, l)
	}
	if err := bw.Flush(); err != nil {
		return errs.Wrap(errs.Internal, "topo", err, "write the manifest")
	}
	return nil
}
