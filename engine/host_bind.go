package engine

import "net"

// BindIP returns the IP the RPC listener is bound to (possibly 0.0.0.0), so a
// transport that opens its own listener binds the same interface.
func (h host) BindIP() string {
	if a, ok := h.e.ctrl.Addr().(*net.TCPAddr); ok {
		return a.IP.String()
	}
	return ""
}
