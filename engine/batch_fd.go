package engine

import (
	"golang.org/x/sys/unix"

	"github.com/tecache/te/internal/errs"
)

// EventFD returns an eventfd that becomes readable each time every submitted
// task of the batch has finished, for callers with an event loop (epoll,
// asyncio's add_reader). Reading it (8 bytes) resets it. The batch owns the
// fd and closes it in Free. It is created on first use.
func (b *Batch) EventFD() (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.freed {
		return -1, errs.New(errs.InvalidArgument, "eventfd", "batch was freed")
	}
	if b.efd > 0 {
		return b.efd, nil
	}
	fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return -1, errs.Wrap(errs.NoMemory, "eventfd", err, "create eventfd")
	}
	b.efd = fd
	if b.settled && b.n > 0 {
		signalFD(fd)
	}
	return fd, nil
}

func signalFD(fd int) {
	var one = [8]byte{1}
	unix.Write(fd, one[:]) // EAGAIN only when the counter is saturated: still readable
}

func (b *Batch) closeFD() {
	if b.efd > 0 {
		unix.Close(b.efd)
		b.efd = 0
	}
}
