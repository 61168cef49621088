package tcp

import (
	"net"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/tecache/te/engine/internal/pipe"
	"github.com/tecache/te/engine/segment"
	"github.com/tecache/te/internal/peerauth"
	"github.com/tecache/te/internal/sys/mem"
	"github.com/tecache/te/internal/wire"
)

// mcLoop accepts the data listener's connections when the engine accepts
// Mooncake peers, and serves Mooncake's requests itself: one OS thread, its
// own epoll set and non-blocking sockets, as Mooncake's own target does with
// one asio thread. Mooncake's initiator opens a connection per request by
// default; through Go's netpoller each one cost an accept goroutine's wake-up,
// a hand-off to a serving goroutine, and the scheduler's parking and waking
// around both, which made te's target spend up to twice Mooncake's CPU per
// small request. Here a request costs its socket calls only.
//
// The loop serves only requests it can serve at once: a version 2 READ or
// WRITE inside one registered, remote-accessible host buffer. Everything else
// (te's own connections, refusals, version 1, a bad header) is handed, with
// the bytes read so far, to the goroutine path (server.go, mooncake.go), which
// answers it as before.
type mcLoop struct {
	t    *Transport
	lfd  int // the listening socket (non-blocking)
	ep   int // the loop's epoll set
	wake int // eventfd: Close

	// mu guards conns' membership and stop. The loop is the only writer
	// of conns, and closes an fd only while holding mu, so cut (Quiesce)
	// never shuts down an fd that was closed and reused.
	mu    sync.Mutex
	conns map[int]*mcConn
	stop  bool

	scratch []byte // what a header read takes past the header: mcSmall
	events  []unix.EpollEvent
	iov     [2]unix.Iovec
	free    []*mcConn // closed connections' state, for the next ones
	// ready are connections that used up their turn with bytes still to
	// move (edge-triggered: no event will come for them); spare is the
	// other half of the list.
	ready, spare []*mcConn
	next         time.Time // earliest deadline of a connection, zero: none
	paused       time.Time // accepting resumes then (out of fds)
}

// mcYield is how often the loop yields to the scheduler: well inside the
// runtime's 10 ms time slice.
const mcYield = 5 * time.Millisecond

// mcSteps bounds the reads and writes one connection makes in a turn.
const mcSteps = 64

// mcSmall is how much of a WRITE's payload is read with its header (and
// copied into place); what a hand-off carries is then well within the
// goroutine path's first buffer (firstReadSize).
const mcSmall = 4 << 10

// The states of a connection on the loop.
const (
	mcHeader  = iota // reading a request header
	mcPayload        // reading a WRITE's payload into registered memory
	mcReply          // writing the status (and a READ's payload)
)

// mcConn is one accepted connection on the loop.
type mcConn struct {
	fd      int
	release func() // the connection's slot in the listener's limiter
	state   int
	known   bool // its first 8 bytes said Mooncake
	served  bool // a request was served: the idle timeout applies between requests
	out     bool // registered for EPOLLOUT too
	in      bool // registered in the epoll set
	queued  bool // in the loop's ready list
	hdr     [wire.MooncakeHeaderSize]byte
	nin     int
	pend    []byte // bytes read past a WRITE's payload (a pipelining peer)
	req     wire.MooncakeRequest
	region  *segment.Region
	cur     atomic.Pointer[segment.Region] // region, for Quiesce
	status  [wire.MooncakeStatusSize]byte
	done    uint64 // payload bytes moved (a reply: status bytes included)
	mark    uint64 // done at which the progress deadline is renewed
	openBy  time.Time
	timeout time.Time // zero: none
}

// startLoop takes over ln's socket: a duplicate outside Go's netpoller, so
// a connection wakes only the loop's thread.
func (t *Transport) startLoop(ln net.Listener) (*mcLoop, error) {
	rc, err := ln.(*net.TCPListener).SyscallConn()
	if err != nil {
		return nil, err
	}
	lfd := -1
	var derr error
	if err := rc.Control(func(fd uintptr) { lfd, derr = unix.FcntlInt(fd, unix.F_DUPFD_CLOEXEC, 0) }); err != nil {
		return nil, err
	}
	if derr != nil {
		return nil, derr
	}
	l := &mcLoop{t: t, lfd: lfd, ep: -1, wake: -1, conns: map[int]*mcConn{},
		scratch: make([]byte, mcSmall), events: make([]unix.EpollEvent, 128)}
	fail := func(err error) (*mcLoop, error) {
		for _, fd := range []int{l.lfd, l.ep, l.wake} {
			if fd >= 0 {
				unix.Close(fd)
			}
		}
		return nil, err
	}
	// Accepted sockets inherit TCP_NODELAY from the listener: no
	// setsockopt per connection.
	if err := unix.SetsockoptInt(lfd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1); err != nil {
		return fail(err)
	}
	if l.ep, err = unix.EpollCreate1(unix.EPOLL_CLOEXEC); err != nil {
		return fail(err)
	}
	if l.wake, err = unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK); err != nil {
		return fail(err)
	}
	// The listener level-triggered: connections left unaccepted by one
	// round are reported again.
	for _, fd := range []int{lfd, l.wake} {
		if err := unix.EpollCtl(l.ep, unix.EPOLL_CTL_ADD, fd, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(fd)}); err != nil {
			return fail(err)
		}
	}
	return l, nil
}

// close stops the loop; the caller waits for t.wg.
func (l *mcLoop) close() {
	l.mu.Lock()
	l.stop = true
	l.mu.Unlock()
	var one [8]byte
	one[0] = 1 // host order is little-endian on every platform te builds for
	unix.Write(l.wake, one[:])
}

// cut shuts down the connections holding accesses to r: the loop then sees
// them fail and releases what they hold.
func (l *mcLoop) cut(r *segment.Region) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for fd, c := range l.conns {
		if c.cur.Load().Within(r) {
			unix.Shutdown(fd, unix.SHUT_RDWR)
		}
	}
}

func (l *mcLoop) run() {
	defer l.t.wg.Done()
	// The loop sleeps in epoll_wait, not in the scheduler, so it never
	// yields by itself: after 10 ms on one scheduling tick the runtime
	// would preempt it with a signal and take its P away in every
	// syscall, waking sysmon every 20 µs. A yield every mcYield avoids
	// that for the cost of one pass through the scheduler. (A locked
	// thread would make that yield a hand-off between threads.)
	yielded := time.Now()
	for {
		wait := -1
		now := time.Now()
		if now.Sub(yielded) >= mcYield {
			runtime.Gosched()
			yielded = now
		}
		if !l.next.IsZero() {
			wait = int((l.next.Sub(now) + time.Millisecond - 1) / time.Millisecond)
			wait = max(wait, 0)
		}
		if !l.paused.IsZero() {
			wait = 10
		}
		if len(l.ready) > 0 {
			wait = 0
		}
		n, err := unix.EpollWait(l.ep, l.events, wait)
		if err != nil && err != unix.EINTR {
			l.t.mc.note(l.t, "epoll", "te: tcp: epoll_wait: %v", err)
			time.Sleep(10 * time.Millisecond)
			continue
		}
		for i := 0; i < n; i++ {
			ev := l.events[i]
			fd := int(ev.Fd)
			switch fd {
			case l.lfd:
				l.accept()
			case l.wake:
				l.mu.Lock()
				stop := l.stop
				l.mu.Unlock()
				if stop {
					l.shutdown()
					return
				}
			default:
				c := l.conns[fd]
				if c == nil {
					continue
				}
				// Writable only: of use to a reply alone.
				if ev.Events&^unix.EPOLLOUT == 0 && c.state != mcReply {
					continue
				}
				l.serve(c)
			}
		}
		if len(l.ready) > 0 {
			ready := l.ready
			l.ready = l.spare[:0]
			for _, c := range ready {
				// c may have been closed since, its state reused.
				if c.queued && l.conns[c.fd] == c {
					c.queued = false
					l.serve(c)
				}
			}
			clear(ready)
			l.spare = ready
		}
		now = time.Now()
		if !l.paused.IsZero() && !now.Before(l.paused) {
			l.paused = time.Time{}
			unix.EpollCtl(l.ep, unix.EPOLL_CTL_MOD, l.lfd, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(l.lfd)})
		}
		if !l.next.IsZero() && !now.Before(l.next) {
			l.expire(now)
		}
	}
}

// shutdown closes every connection and the loop's own descriptors.
func (l *mcLoop) shutdown() {
	for _, c := range l.conns {
		l.drop(c)
	}
	for _, fd := range []int{l.lfd, l.ep, l.wake} {
		unix.Close(fd)
	}
}

// expire cuts the connections past their deadline and finds the next one.
func (l *mcLoop) expire(now time.Time) {
	l.next = time.Time{}
	for _, c := range l.conns {
		if c.timeout.IsZero() {
			continue
		}
		if !now.Before(c.timeout) {
			l.t.slowClosed.Add(1)
			l.drop(c)
			continue
		}
		if l.next.IsZero() || c.timeout.Before(l.next) {
			l.next = c.timeout
		}
	}
}

func (l *mcLoop) deadline(c *mcConn, at time.Time) {
	c.timeout = at
	if !at.IsZero() && (l.next.IsZero() || at.Before(l.next)) {
		l.next = at
	}
}

// accept takes the listener's pending connections, a bounded number per
// round so the connections being served get their turn.
func (l *mcLoop) accept() {
	t := l.t
	for range 64 {
		fd, remote, err := l.accept4()
		switch err {
		case nil:
		case unix.EAGAIN:
			return
		case unix.EINTR, unix.ECONNABORTED:
			continue
		default:
			// Out of fds or similar: stop accepting for a moment
			// instead of spinning on a listener that stays readable.
			t.mc.note(t, "accept", "te: tcp accept: %v", err)
			l.paused = time.Now().Add(10 * time.Millisecond)
			unix.EpollCtl(l.ep, unix.EPOLL_CTL_MOD, l.lfd, &unix.EpollEvent{Events: 0, Fd: int32(l.lfd)})
			return
		}
		release, err := t.limiter.Admit(remote)
		if err != nil {
			// Told why (a few bytes into an empty socket buffer), then
			// dropped without reading anything.
			peerauth.Refuse(rawConn(fd), time.Time{})
			unix.Close(fd)
			continue
		}
		var c *mcConn
		if k := len(l.free); k > 0 {
			c, l.free = l.free[k-1], l.free[:k-1]
		} else {
			c = new(mcConn)
		}
		c.fd, c.release, c.openBy = fd, release, time.Now().Add(t.opt.Header)
		l.mu.Lock()
		if l.stop {
			l.mu.Unlock()
			unix.Close(fd)
			release()
			return
		}
		l.conns[fd] = c
		l.mu.Unlock()
		l.deadline(c, c.openBy)
		l.serve(c)
	}
}

// serve advances c as far as its socket allows.
func (l *mcLoop) serve(c *mcConn) {
	for step := 0; ; step++ {
		if step == mcSteps {
			// A peer that keeps its socket busy (requests sent
			// without waiting for answers) gets its next turn after
			// the others'.
			if !c.queued {
				c.queued = true
				l.ready = append(l.ready, c)
			}
			return
		}
		var ok bool
		switch c.state {
		case mcHeader:
			ok = l.readHeader(c)
		case mcPayload:
			ok = l.readPayload(c)
		default:
			ok = l.reply(c)
		}
		if !ok {
			return
		}
	}
}

// again registers c for its next event after a call would have blocked;
// false: c is gone.
func (l *mcLoop) again(c *mcConn, out bool) bool {
	ev := unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLRDHUP | unix.EPOLLET, Fd: int32(c.fd)}
	switch {
	case !c.in:
		// Writable is reported only once a reply needs it: a socket is
		// writable when it is added, and a request waits on reading.
		if out {
			ev.Events |= unix.EPOLLOUT
			c.out = true
		}
		c.in = true
		if unix.EpollCtl(l.ep, unix.EPOLL_CTL_ADD, c.fd, &ev) != nil {
			l.drop(c)
		}
	case out && !c.out:
		ev.Events |= unix.EPOLLOUT
		c.out = true
		if unix.EpollCtl(l.ep, unix.EPOLL_CTL_MOD, c.fd, &ev) != nil {
			l.drop(c)
		}
	}
	return false
}

// readHeader reads the rest of a request header and starts the request;
// false when c waits or is gone.
func (l *mcLoop) readHeader(c *mcConn) bool {
	var b []byte
	fromPend := len(c.pend) > 0
	// Past the first request the next header's first byte may take the
	// idle timeout; the rest is due within the header timeout.
	first := c.nin == 0 && c.served
	if fromPend {
		b, c.pend = c.pend, nil
		k := copy(c.hdr[c.nin:], b)
		c.nin += k
		b = b[k:]
	} else {
		// The header, and up to mcSmall of a WRITE's payload after it,
		// copied from there (cheaper than a second read for a small
		// payload); the rest of a larger one is read straight into
		// memory.
		h := c.hdr[c.nin:]
		iov := &l.iov
		iov[0] = unix.Iovec{Base: &h[0]}
		iov[0].SetLen(len(h))
		iov[1] = unix.Iovec{Base: &l.scratch[0]}
		iov[1].SetLen(len(l.scratch))
		r, _, errno := unix.Syscall(unix.SYS_READV, uintptr(c.fd), uintptr(unsafe.Pointer(&iov[0])), 2)
		if errno == unix.EAGAIN {
			return l.again(c, false)
		}
		if errno != 0 || r == 0 {
			l.drop(c)
			return false
		}
		n := int(r)
		k := min(n, len(h))
		c.nin += k
		b = l.scratch[:n-k]
	}
	if first && c.nin > 0 {
		l.deadline(c, time.Now().Add(l.t.opt.Header))
	}
	if !c.known && c.nin >= wire.DataPrefaceSize {
		if !wire.LooksLikeMooncake(c.hdr[:wire.DataPrefaceSize]) {
			l.handOff(c, b) // te's preface
			return false
		}
		c.known = true
	}
	if c.nin < len(c.hdr) {
		return true
	}
	t := l.t
	req, err := wire.DecodeMooncakeRequest(c.hdr[:])
	if err != nil || !req.V2 || !t.opt.AcceptMooncake {
		l.handOff(c, b)
		return false
	}
	// Key 0 skips the key check: reachable only with AcceptMooncake on.
	region, err := t.reg.Acquire(req.Addr, req.Size, 0, true, segment.Anyone)
	if err != nil {
		l.handOff(c, b)
		return false
	}
	if isDevice(region) || segment.StorageOf(region) != nil {
		// Device memory and registered files are te's to serve.
		region.Release()
		l.handOff(c, b)
		return false
	}
	c.region, c.req, c.nin, c.done = region, req, 0, 0
	c.cur.Store(region)
	now := time.Now()
	if req.Op == wire.MooncakeWrite {
		c.state = mcPayload
		c.done = uint64(copy(mem.Bytes(req.Addr, req.Size), b))
		b = b[c.done:]
		c.mark = 0
		l.progress(c, now, req.Size)
	} else {
		c.state = mcReply
		wire.PutMooncakeStatus(c.status[:], wire.MooncakeOK)
		c.mark = 0
		l.progress(c, now, req.Size+wire.MooncakeStatusSize)
	}
	if len(b) > 0 {
		// A peer that sent its next request before this one's answer.
		if !fromPend {
			b = append([]byte(nil), b...)
		}
		c.pend = b
	}
	return true
}

// progress renews c's deadline each ProgressChunk of a payload of total
// bytes moved, as the goroutine path's deadlines do.
func (l *mcLoop) progress(c *mcConn, now time.Time, total uint64) {
	if c.done >= c.mark && c.done < total {
		c.mark = c.done + pipe.ProgressChunk
		l.deadline(c, now.Add(l.t.opt.Progress))
	}
}

// readPayload reads a WRITE's payload straight into registered memory.
func (l *mcLoop) readPayload(c *mcConn) bool {
	size := c.req.Size
	if c.done == size { // all of it came with the header
		return l.acknowledge(c)
	}
	dst := mem.Bytes(c.req.Addr+c.done, size-c.done)
	var n int
	if len(c.pend) > 0 {
		n = copy(dst, c.pend)
		c.pend = c.pend[n:]
		if len(c.pend) == 0 {
			c.pend = nil
		}
	} else {
		var err error
		n, err = unix.Read(c.fd, dst)
		if err == unix.EAGAIN {
			return l.again(c, false)
		}
		if err != nil || n == 0 {
			l.drop(c)
			return false
		}
	}
	c.done += uint64(n)
	if c.done < size {
		l.progress(c, time.Now(), size)
		return true
	}
	return l.acknowledge(c)
}

// acknowledge ends a WRITE whose payload is in memory: its status is next.
func (l *mcLoop) acknowledge(c *mcConn) bool {
	c.cur.Store(nil)
	c.region.Release()
	c.region = nil
	// Acknowledged only now that the payload is in memory.
	wire.PutMooncakeStatus(c.status[:], wire.MooncakeOK)
	c.state, c.done, c.mark = mcReply, 0, 0
	l.progress(c, time.Now(), wire.MooncakeStatusSize)
	return true
}

// reply writes the status, and a READ's payload from registered memory, in
// one writev.
func (l *mcLoop) reply(c *mcConn) bool {
	total := uint64(wire.MooncakeStatusSize)
	read := c.req.Op == wire.MooncakeRead
	if read {
		total += c.req.Size
	}
	iov := l.iov[:0]
	if c.done < wire.MooncakeStatusSize {
		s := c.status[c.done:]
		iov = append(iov, unix.Iovec{Base: &s[0]})
		iov[len(iov)-1].SetLen(len(s))
	}
	if read {
		off := max(c.done, wire.MooncakeStatusSize) - wire.MooncakeStatusSize
		p := mem.Bytes(c.req.Addr+off, c.req.Size-off)
		iov = append(iov, unix.Iovec{Base: &p[0]})
		iov[len(iov)-1].SetLen(len(p))
	}
	n, _, errno := unix.Syscall(unix.SYS_WRITEV, uintptr(c.fd), uintptr(unsafe.Pointer(&iov[0])), uintptr(len(iov)))
	if errno == unix.EAGAIN {
		return l.again(c, true)
	}
	if errno != 0 {
		l.drop(c)
		return false
	}
	c.done += uint64(n)
	if c.done < total {
		l.progress(c, time.Now(), total)
		return true
	}
	if c.region != nil {
		c.cur.Store(nil)
		c.region.Release()
		c.region = nil
	}
	l.t.mc.served.Add(1)
	c.state, c.done, c.served = mcHeader, 0, true
	// Between requests: the idle timeout.
	var idle time.Time
	if o := l.t.opt.Idle; o > 0 {
		idle = time.Now().Add(o)
	}
	l.deadline(c, idle)
	return true
}

// drop closes c and gives back what it holds.
func (l *mcLoop) drop(c *mcConn) {
	if c.region != nil {
		c.cur.Store(nil)
		c.region.Release()
		c.region = nil
	}
	l.mu.Lock()
	delete(l.conns, c.fd)
	unix.Close(c.fd) // leaves the epoll set with it
	l.mu.Unlock()
	c.release()
	l.recycle(c)
}

// recycle keeps c's memory for a later connection (a Mooncake initiator
// connects per request): none of it is reachable from elsewhere once c left
// conns.
func (l *mcLoop) recycle(c *mcConn) {
	if len(l.free) < 64 {
		c.reset()
		l.free = append(l.free, c)
	}
}

func (c *mcConn) reset() {
	c.cur.Store(nil)
	c.fd, c.release, c.state, c.known, c.served, c.out, c.in, c.queued = -1, nil, mcHeader, false, false, false, false, false
	c.nin, c.pend, c.req, c.region, c.done, c.mark = 0, nil, wire.MooncakeRequest{}, nil, 0, 0
	c.openBy, c.timeout = time.Time{}, time.Time{}
}

// handOff gives c to the goroutine path, with the bytes read so far: its
// header bytes, then rest.
func (l *mcLoop) handOff(c *mcConn, rest []byte) {
	t := l.t
	pre := make([]byte, 0, c.nin+len(rest)+len(c.pend))
	pre = append(append(append(pre, c.hdr[:c.nin]...), rest...), c.pend...)
	if c.in {
		unix.EpollCtl(l.ep, unix.EPOLL_CTL_DEL, c.fd, nil)
	}
	l.mu.Lock()
	delete(l.conns, c.fd)
	l.mu.Unlock()
	// Blocking until net.FileConn's duplicate makes it non-blocking
	// again: os.NewFile then keeps it out of Go's poller.
	unix.SetNonblock(c.fd, false)
	f := os.NewFile(uintptr(c.fd), "")
	nc, err := net.FileConn(f)
	f.Close()
	if err != nil || len(pre) > firstReadSize {
		if nc != nil {
			nc.Close()
		}
		c.release()
		return
	}
	// No keepalive, as on connections the Go listener accepts.
	if tc, ok := nc.(*net.TCPConn); ok {
		tc.SetKeepAlive(false)
	}
	s := &serverConn{t: t, nc: nc, release: c.release, pre: pre, openBy: c.openBy}
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		nc.Close()
		c.release()
		return
	}
	t.served[s] = struct{}{}
	t.mu.Unlock()
	if !t.hand(s) {
		s.end()
	}
}

// accept4 accepts a connection, non-blocking, and returns its peer's
// address for the limiter. (unix.Accept4 asks the listener's protocol with a
// getsockopt per call.)
func (l *mcLoop) accept4() (int, net.Addr, error) {
	var rsa unix.RawSockaddrAny
	n := uint32(unix.SizeofSockaddrAny)
	fd, _, errno := unix.Syscall6(unix.SYS_ACCEPT4, uintptr(l.lfd), uintptr(unsafe.Pointer(&rsa)), uintptr(unsafe.Pointer(&n)),
		unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0, 0)
	if errno != 0 {
		return -1, nil, errno
	}
	a := &net.TCPAddr{}
	switch rsa.Addr.Family {
	case unix.AF_INET:
		p := (*unix.RawSockaddrInet4)(unsafe.Pointer(&rsa))
		a.IP = net.IPv4(p.Addr[0], p.Addr[1], p.Addr[2], p.Addr[3])
		a.Port = int(p.Port>>8 | p.Port<<8)
	case unix.AF_INET6:
		p := (*unix.RawSockaddrInet6)(unsafe.Pointer(&rsa))
		a.IP = append(net.IP(nil), p.Addr[:]...)
		a.Port = int(p.Port>>8 | p.Port<<8)
	}
	return int(fd), a, nil
}

// rawConn writes to a non-blocking socket, for peerauth.Refuse.
type rawConn int

func (c rawConn) Read(p []byte) (int, error) {
	n, err := unix.Read(int(c), p)
	return max(n, 0), err
}

func (c rawConn) Write(p []byte) (int, error) {
	n, err := unix.Write(int(c), p)
	return max(n, 0), err
}

func (rawConn) SetDeadline(time.Time) error { return nil }
