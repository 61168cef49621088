package cxl

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/sys/mem"
	"github.com/tecache/te/internal/sys/topo"
)

// Environment variables naming the device. te's own win over Mooncake's.
const (
	EnvDevice   = "TE_CXL_DEVICE"   // path of the DAX device (or a file standing in for it)
	EnvSize     = "TE_CXL_SIZE"     // bytes to map; default: the device's size
	EnvID       = "TE_CXL_ID"       // the device's identity across hosts (see Identity)
	EnvMCDevice = "MC_CXL_DEV_PATH" // Mooncake's name for the path
	EnvMCSize   = "MC_CXL_DEV_SIZE" // Mooncake's name for the size
)

// Config says which device to map. Zero fields are read from the
// environment (EnvDevice, else EnvMCDevice; EnvSize, else EnvMCSize; EnvID).
type Config struct {
	Path string
	Size uint64
	ID   string
}

// FromEnv returns the configuration the environment gives.
func FromEnv() Config {
	c := Config{Path: os.Getenv(EnvDevice), ID: os.Getenv(EnvID)}
	if c.Path == "" {
		c.Path = os.Getenv(EnvMCDevice)
	}
	s := os.Getenv(EnvSize)
	if s == "" {
		s = os.Getenv(EnvMCSize)
	}
	if s != "" {
		c.Size, _ = strconv.ParseUint(s, 10, 64) // 0 (bad) is refused in Open
		if c.Size == 0 {
			c.Size = ^uint64(0)
		}
	}
	return c
}

var daxName = regexp.MustCompile(`dax\d+\.\d+`)

// deviceSize finds how large the device at path is: a regular file's size,
// or for a DAX character device the size sysfs reports under
// bus/dax/devices/<daxX.Y>/size (TE_SYSFS_ROOT replaces /sys).
func deviceSize(path string, st *unix.Stat_t) (uint64, error) {
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		return uint64(st.Size), nil
	case unix.S_IFCHR:
		name := daxName.FindString(filepath.Base(path))
		if name == "" {
			if t, err := filepath.EvalSymlinks(path); err == nil {
				name = daxName.FindString(filepath.Base(t))
			}
		}
		if name == "" {
			return 0, errs.New(errs.InvalidArgument, "cxl", "%s is a character device but not named daxX.Y: set %s", path, EnvSize)
		}
		f := filepath.Join(topo.Root(), "bus", "dax", "devices", name, "size")
		b, err := os.ReadFile(f)
		if err != nil {
			return 0, errs.Wrap(errs.NotSupported, "cxl", err, "read the size of %s", name).WithHint("set " + EnvSize)
		}
		n, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
		if err != nil {
			return 0, errs.Wrap(errs.NotSupported, "cxl", err, "%s holds no size", f)
		}
		return n, nil
	}
	return 0, errs.New(errs.InvalidArgument, "cxl", "%s is neither a DAX device nor a regular file", path)
}

// mapping is one device mapped into this process, shared by every engine of
// the process that names the same device.
type mapping struct {
	path string
	id   string
	base uint64
	size uint64
	mem  []byte
	refs int
}

var (
	mapsMu sync.Mutex
	maps   = map[string]*mapping{} // by identity
)

// bootID names this boot of this host.
func bootID() string {
	b, _ := os.ReadFile("/proc/sys/kernel/random/boot_id")
	return strings.TrimSpace(string(b))
}

// open maps the device c names (once per process and device) and returns
// it with a reference taken; release gives it back.
func open(c Config) (*mapping, error) {
	if c.Path == "" {
		return nil, errs.New(errs.NotSupported, "cxl", "no CXL device: set %s (or %s) to the DAX device", EnvDevice, EnvMCDevice)
	}
	var st unix.Stat_t
	if err := unix.Stat(c.Path, &st); err != nil {
		return nil, errs.Wrap(errs.NotSupported, "cxl", err, "CXL device %s", c.Path)
	}
	size := c.Size
	if size == 0 {
		n, err := deviceSize(c.Path, &st)
		if err != nil {
			return nil, err
		}
		size = n
	}
	if size == 0 || size == ^uint64(0) || size > 1<<50 {
		return nil, errs.New(errs.InvalidArgument, "cxl", "CXL device %s: no usable size (set %s to the bytes to map)", c.Path, EnvSize)
	}
	if st.Mode&unix.S_IFMT == unix.S_IFREG && uint64(st.Size) < size {
		// Touching a page past a file's end raises SIGBUS: refuse it here.
		return nil, errs.New(errs.InvalidArgument, "cxl", "%s holds %d bytes, fewer than the %d to map", c.Path, st.Size, size)
	}
	id := c.ID
	if id == "" {
		// Same file on the same boot, or the same DAX device name and
		// size: hosts that share a pooled device see it under one name
		// (set TE_CXL_ID where they do not).
		if st.Mode&unix.S_IFMT == unix.S_IFREG {
			id = fmt.Sprintf("file:%s:%d:%d", bootID(), st.Dev, st.Ino)
		} else {
			id = fmt.Sprintf("dax:%s:%d", daxName.FindString(c.Path), size)
		}
	}
	mapsMu.Lock()
	defer mapsMu.Unlock()
	if m := maps[id]; m != nil {
		if m.size != size {
			return nil, errs.New(errs.InvalidArgument, "cxl", "%s is mapped already with %d bytes, not %d", c.Path, m.size, size)
		}
		m.refs++
		return m, nil
	}
	fd, err := unix.Open(c.Path, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, errs.Wrap(errs.AccessDenied, "cxl", err, "open %s", c.Path)
	}
	b, err := unix.Mmap(fd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	unix.Close(fd)
	if err != nil {
		return nil, errs.Wrap(errs.NoMemory, "cxl", err, "map %d bytes of %s", size, c.Path)
	}
	m := &mapping{path: c.Path, id: id, size: size, mem: b, refs: 1}
	m.base = mem.Addr(b)
	maps[id] = m
	return m, nil
}

// release drops a reference; the last one unmaps the device.
func (m *mapping) release() {
	mapsMu.Lock()
	defer mapsMu.Unlock()
	m.refs--
	if m.refs == 0 {
		delete(maps, m.id)
		unix.Munmap(m.mem)
	}
}

// inside reports whether [addr, addr+n) lies in the mapping, overflow checked.
func (m *mapping) inside(addr, n uint64) bool {
	return addr >= m.base && addr+n >= addr && addr+n <= m.base+m.size
}
