package fabric

import (
	"os"
	"runtime"
	"sync"
	"unsafe"

	"github.com/ebitengine/purego"

	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/sys/mem"
	"github.com/tecache/te/internal/sys/sigkeep"
)

// DefaultLibrary is the soname Load opens; the environment variable
// TE_FABRIC_LIBRARY names another file (a provider build of AWS's
// libfabric, say).
const DefaultLibrary = "libfabric.so.1"

// Lib is an opened libfabric. It is never closed: libfabric keeps its
// providers loaded for the life of the process.
type Lib struct {
	Path string
	// Defaults are the ProviderDefaults this process got from te
	// ("NAME=value"); the others were set already.
	Defaults []string

	getinfo  uintptr // fi_getinfo
	freeinfo uintptr // fi_freeinfo
	dupinfo  uintptr // fi_dupinfo
	fabric   uintptr // fi_fabric
	malloc   uintptr // libc's, for fields of an fi_info te replaces
	free     uintptr
	version  func() uint32
	strerror func(errnum int32) string
}

// Supported reports whether this platform's struct layouts were checked
// against libfabric's headers (LP64 Linux on amd64 or arm64).
func Supported() bool {
	return runtime.GOOS == "linux" && (runtime.GOARCH == "amd64" || runtime.GOARCH == "arm64")
}

var (
	loadOnce sync.Once
	loaded   *Lib
	loadErr  error
)

// Load opens libfabric once per process (TE_FABRIC_LIBRARY or
// DefaultLibrary) and returns it, or a NotSupported error that says why it
// cannot be used.
func Load() (*Lib, error) {
	loadOnce.Do(func() {
		path := os.Getenv("TE_FABRIC_LIBRARY")
		if path == "" {
			path = DefaultLibrary
		}
		loaded, loadErr = Open(path)
	})
	return loaded, loadErr
}

// Open loads the library at path and resolves every entry point te uses. A
// missing library or symbol is a NotSupported error naming it.
func Open(path string) (*Lib, error) {
	if !Supported() {
		return nil, errs.New(errs.NotSupported, "fabric", "libfabric layouts are not checked for %s/%s", runtime.GOOS, runtime.GOARCH)
	}
	h, err := sigkeep.Dlopen(path, purego.RTLD_NOW|purego.RTLD_GLOBAL)
	if err != nil {
		return nil, errs.Wrap(errs.NotSupported, "fabric", err, "cannot load %s", path).
			WithHint("install libfabric (Debian: apt-get install libfabric1; on AWS the EFA installer's /opt/amazon/efa/lib/libfabric.so.1, named by TE_FABRIC_LIBRARY)")
	}
	l := &Lib{Path: path, Defaults: setDefaults(h, ProviderDefaults)}
	var missing []string
	sym := func(name string) uintptr {
		a, err := purego.Dlsym(h, name)
		if err != nil || a == 0 {
			missing = append(missing, name)
			return 0
		}
		return a
	}
	l.getinfo = sym("fi_getinfo")
	l.freeinfo = sym("fi_freeinfo")
	l.dupinfo = sym("fi_dupinfo")
	l.fabric = sym("fi_fabric")
	l.malloc = sym("malloc")
	l.free = sym("free")
	if a := sym("fi_version"); a != 0 {
		purego.RegisterFunc(&l.version, a)
	}
	if a := sym("fi_strerror"); a != 0 {
		purego.RegisterFunc(&l.strerror, a)
	}
	if len(missing) > 0 {
		return nil, errs.New(errs.NotSupported, "fabric", "%s lacks %v", path, missing).
			WithHint("libfabric 1.12 or newer is needed")
	}
	if v := l.version(); v < APIVersion {
		return nil, errs.New(errs.NotSupported, "fabric", "%s is libfabric %d.%d, te needs 1.12 or newer", path, v>>16, v&0xffff)
	}
	return l, nil
}

// Version returns the library's version as "major.minor".
func (l *Lib) Version() (major, minor int) {
	v := l.version()
	return int(v >> 16), int(v & 0xffff)
}

// StrError is fi_strerror of a (positive) libfabric error number.
func (l *Lib) StrError(code int) string { return l.strerror(int32(code)) }

// Error is a failed libfabric call: Code is the positive error number it
// returned (negated, as libfabric returns them).
type Error struct {
	Op   string
	Code int
	Msg  string
}

func (e *Error) Error() string { return e.Msg }

// fail turns a negative return of a libfabric call into a te error whose
// code says what the caller can do about it.
func (l *Lib) fail(op string, rc int64) error {
	code := int(-rc)
	if code < 0 {
		code = -code
	}
	fe := &Error{Op: op, Code: code, Msg: l.strerror(int32(code))}
	c := errs.Internal
	switch code {
	case 12: // ENOMEM
		c = errs.NoMemory
	case 22: // EINVAL
		c = errs.InvalidArgument
	case 1, 13: // EPERM, EACCES
		c = errs.AccessDenied
	case 38, 95, 61: // ENOSYS, EOPNOTSUPP, ENODATA (no matching provider)
		c = errs.NotSupported
	case 111, 113, 110, 104, 112, 107: // ECONNREFUSED, EHOSTUNREACH, ETIMEDOUT, ECONNRESET, EHOSTDOWN, ENOTCONN
		c = errs.PeerUnreachable
	case errCanceled:
		c = errs.Canceled
	case 5: // EIO
		c = errs.IO
	}
	return errs.Wrap(c, "fabric", fe, "%s", op)
}

// call calls fn with args and returns its result as a C int.
func call(fn uintptr, args ...uintptr) int64 {
	r, _, _ := purego.SyscallN(fn, args...)
	return int64(int32(r))
}

// callSize calls fn with args and returns its result as a ssize_t.
func callSize(fn uintptr, args ...uintptr) int64 {
	r, _, _ := purego.SyscallN(fn, args...)
	return int64(r)
}

// scratch is memory outside the Go heap for the structs and out-parameters
// libfabric reads and writes.
type scratch struct{ b []byte }

func newScratch(n int) (*scratch, error) {
	b, err := mem.Alloc(n)
	if err != nil {
		return nil, err
	}
	return &scratch{b: b}, nil
}

func (s *scratch) addr(off uintptr) uintptr { return uintptr(mem.Addr(s.b)) + off }

func (s *scratch) clear(n uintptr) { clear(s.b[:n]) }

func (s *scratch) free() {
	if s != nil && s.b != nil {
		_ = mem.Free(s.b)
		s.b = nil
	}
}

// cstring writes s NUL-terminated at off and returns its address.
func (s *scratch) cstring(off uintptr, str string) uintptr {
	n := copy(s.b[off:len(s.b)-1], str)
	s.b[int(off)+n] = 0
	return s.addr(off)
}

// at returns a *T over the C memory at addr.
func at[T any](addr uintptr) *T { return (*T)(cptr(addr)) }

// cptr turns the address of C memory into an unsafe.Pointer. The integer's
// storage is reinterpreted, as in package mem: the memory is not a Go
// object, so there is nothing for the garbage collector to track.
func cptr(addr uintptr) unsafe.Pointer { return *(*unsafe.Pointer)(unsafe.Pointer(&addr)) }

func loadPtr(addr uintptr) uintptr { return *at[uintptr](addr) }

// gostring copies the NUL-terminated C string at p.
func gostring(p uintptr) string {
	if p == 0 {
		return ""
	}
	n := 0
	for *at[byte](p + uintptr(n)) != 0 && n < 4096 {
		n++
	}
	return string(unsafe.Slice(at[byte](p), n))
}
