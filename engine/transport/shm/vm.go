package shm

import (
	"errors"
	"os"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/tecache/te/engine/segment"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/sys/mem"
)

// IOVMax is the most iovecs one process_vm_readv/writev call takes on either
// side (the kernel's UIO_MAXIOV).
const IOVMax = 1024

// hostID reads this process's identity: the boot id tells one boot of one
// machine from every other, the pid namespace tells which pids we can name.
func hostID() (segment.HostID, error) {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return segment.HostID{}, errs.Wrap(errs.NotSupported, "shm", err, "read the boot id")
	}
	ns, err := os.Readlink("/proc/self/ns/pid")
	if err != nil {
		return segment.HostID{}, errs.Wrap(errs.NotSupported, "shm", err, "read the pid namespace")
	}
	return segment.HostID{BootID: strings.TrimSpace(string(b)), PidNS: ns, Pid: os.Getpid()}, nil
}

// Span is one contiguous piece of a transfer: N bytes between Local (this
// process) and Remote (the owner's address).
type Span struct {
	Local, Remote, N uint64
}

// span is the package's own name for Span.
type span = Span

// vm moves spans with process_vm_readv/writev, many per call. It is not safe
// for concurrent use: each worker owns one and reuses its iovec arrays.
type vm struct {
	liov  []unix.Iovec
	riov  []unix.RemoteIovec
	inc   []int  // indices of the spans in the current call
	calls uint64 // syscalls made
	short uint64 // calls that moved fewer bytes than asked
}

func newVM() *vm {
	return &vm{liov: make([]unix.Iovec, IOVMax), riov: make([]unix.RemoteIovec, IOVMax), inc: make([]int, 0, IOVMax)}
}

// move copies every span (write: local -> remote, else remote -> local) in
// calls of up to IOVMax spans. When the kernel stops short it continues where
// it stopped; a span the kernel refuses fails alone (fail is called with its
// index) and the next span goes on. An error that concerns the whole process
// (gone, permission withdrawn) fails every span left. skip says whether a
// span is to be left out (its request failed already); check runs before each
// call and, when it returns an error, fails every span left.
func (v *vm) move(pid int, write bool, spans []span, skip func(int) bool, check func() error, fail func(i int, err error)) {
	pos, off := 0, uint64(0) // next span and how much of it has moved
	for {
		for pos < len(spans) && off == 0 && skip(pos) {
			pos++
		}
		if pos == len(spans) {
			return
		}
		if err := check(); err != nil {
			for ; pos < len(spans); pos++ {
				fail(pos, err)
			}
			return
		}
		// Gather spans from (pos, off) onwards. Which spans went into the
		// call is recorded: skip may change under us (another worker failed
		// a request), and the count the kernel returns follows the iovecs.
		v.inc = v.inc[:0]
		var want uint64
		kl, kr := 0, 0
		for j := pos; j < len(spans); j++ {
			o := uint64(0)
			if j == pos {
				o = off
			} else if skip(j) {
				continue
			}
			s := spans[j]
			l, r, n := s.Local+o, s.Remote+o, s.N-o
			// Spans that continue the previous one on a side share its
			// iovec: the kernel walks both sides independently, and each
			// remote iovec costs it a page-pinning call.
			ml := kl > 0 && uint64(uintptr(unsafe.Pointer(v.liov[kl-1].Base)))+v.liov[kl-1].Len == l
			mr := kr > 0 && uint64(v.riov[kr-1].Base)+uint64(v.riov[kr-1].Len) == r
			if (!ml && kl == IOVMax) || (!mr && kr == IOVMax) {
				break
			}
			if ml {
				v.liov[kl-1].Len += n
			} else {
				v.liov[kl] = unix.Iovec{Base: &mem.Bytes(l, n)[0]}
				v.liov[kl].SetLen(int(n))
				kl++
			}
			if mr {
				v.riov[kr-1].Len += int(n)
			} else {
				v.riov[kr] = unix.RemoteIovec{Base: uintptr(r), Len: int(n)}
				kr++
			}
			v.inc = append(v.inc, j)
			want += n
		}
		var got int
		var err error
		for {
			if write {
				got, err = unix.ProcessVMWritev(pid, v.liov[:kl], v.riov[:kr], 0)
			} else {
				got, err = unix.ProcessVMReadv(pid, v.liov[:kl], v.riov[:kr], 0)
			}
			if err != unix.EINTR && err != unix.EAGAIN {
				break
			}
		}
		v.calls++
		// The addresses are foreign memory; leave no pointer to them for
		// the garbage collector to find after the range is unmapped.
		clear(v.liov[:kl])
		if err == nil && got == 0 && want > 0 {
			err = unix.EFAULT // no progress and no error: do not spin
		}
		if err != nil {
			e := vmError(err, pid, spans[pos].Remote+off, write)
			if errors.Is(err, unix.EFAULT) {
				// The kernel reports a fault only when nothing moved, so
				// it is at the first byte asked: that span fails alone.
				fail(pos, e)
				pos, off = pos+1, 0
				continue
			}
			for ; pos < len(spans); pos++ {
				fail(pos, e)
			}
			return
		}
		if uint64(got) < want {
			v.short++
		}
		// Continue where the kernel stopped.
		left := uint64(got)
		for x, j := range v.inc {
			base := uint64(0)
			if x == 0 {
				base = off
			}
			if r := spans[j].N - base; left >= r {
				left -= r
				pos, off = j+1, 0
				continue
			}
			pos, off = j, base+left
			break
		}
	}
}

// vmError turns an errno of process_vm_readv/writev into a te error.
func vmError(err error, pid int, at uint64, write bool) error {
	call := "process_vm_readv"
	if write {
		call = "process_vm_writev"
	}
	switch {
	case errors.Is(err, unix.EPERM):
		return errs.Wrap(errs.AccessDenied, "shm", err, "%s to pid %d refused by the kernel", call, pid).
			WithHint("needs the same uid and a dumpable target, or CAP_SYS_PTRACE, and Yama ptrace_scope 0")
	case errors.Is(err, unix.ESRCH):
		return errs.Wrap(errs.PeerUnreachable, "shm", err, "process %d is gone", pid)
	case errors.Is(err, unix.EFAULT):
		return errs.Wrap(errs.AddressNotRegistered, "shm", err, "%s: memory at %#x of pid %d is not mapped", call, at, pid)
	case errors.Is(err, unix.ENOMEM):
		return errs.Wrap(errs.NoMemory, "shm", err, "%s", call)
	case errors.Is(err, unix.ENOSYS):
		return errs.Wrap(errs.NotSupported, "shm", err, "%s is not available in this kernel", call)
	}
	return errs.Wrap(errs.Internal, "shm", err, "%s", call)
}
