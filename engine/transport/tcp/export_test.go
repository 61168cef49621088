package tcp

import "net"

// OnStart makes f see every transport that starts until the returned
// function is called.
func OnStart(f func(*Transport)) (restore func()) {
	testStarted = f
	return func() { testStarted = nil }
}

// CutDevice kills the NIC at ip on the target side: its listener closes
// (new connections are refused) and every connection accepted on it is
// closed under its peer.
func (t *Transport) CutDevice(ip string) int {
	n := 0
	for _, ln := range t.extra {
		if ln.Addr().(*net.TCPAddr).IP.String() == ip {
			ln.Close()
		}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for s := range t.served {
		if a, ok := s.nc.LocalAddr().(*net.TCPAddr); ok && a.IP.String() == ip {
			s.nc.Close()
			n++
		}
	}
	return n
}
