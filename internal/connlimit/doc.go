// Package connlimit caps the connections a listener accepts, in total and
// per remote IP address, and counts what it refused, so that no peer (idle
// or hostile) can make a listener inside a serving process hold unbounded
// sockets, goroutines and buffers.
//
// A listener asks the Limiter before it serves a connection it accepted:
//
//	release, err := lim.Admit(conn.RemoteAddr())
//	if err != nil { // errs.ResourceExhausted: tell the peer, close, go on
//		peerauth.Refuse(conn, time.Now().Add(50*time.Millisecond))
//		conn.Close()
//		continue
//	}
//	go func() { defer release(); serve(conn) }()
//
// The connection stays the caller's own type (a *net.TCPConn keeps its
// fast paths); only the slot is tracked. Policy carries the bounds an engine
// hands its listeners.
package connlimit
