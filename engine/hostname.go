package engine

import (
	"context"
	"net"
	"strings"
	"time"

	"github.com/tecache/te/internal/errs"
)

// checkHostname refuses an advertised host that cannot work: one with a port
// (the port is the listener's: "127.0.0.1:5" was advertised as
// "[127.0.0.1:5]:37893"), brackets, and a name that does not resolve (peers
// would fail to reach the engine later, with a less clear error). An IP
// address is taken as it is.
func checkHostname(h string, within time.Duration) error {
	if h == "" {
		return nil
	}
	bad := func(format string, args ...any) *errs.Error {
		return errs.New(errs.InvalidArgument, "new", "Hostname (%s) %q "+format, append([]any{EnvHostname, h}, args...)...)
	}
	if host, port, err := net.SplitHostPort(h); err == nil {
		return bad("has a port (%s): give the host alone; the port is the listener's (ListenAddr, %s)", port, EnvListenAddr).
			WithHint("e.g. " + EnvHostname + "=" + host + " " + EnvListenAddr + "=:" + port)
	}
	if strings.ContainsAny(h, "[]") {
		return bad("has brackets: give an IPv6 address without them, e.g. ::1")
	}
	if net.ParseIP(h) != nil {
		return nil
	}
	if strings.ContainsAny(h, " /:@?#%") {
		return bad("is neither an IP address nor a host name")
	}
	name := strings.TrimSuffix(strings.ToLower(h), ".")
	if name == "invalid" || strings.HasSuffix(name, ".invalid") {
		return bad("does not resolve: names under .invalid never do (RFC 6761)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	addrs, err := net.DefaultResolver.LookupHost(ctx, h)
	if err != nil || len(addrs) == 0 {
		return errs.Wrap(errs.InvalidArgument, "new", err, "Hostname (%s) %q does not resolve: peers could not reach this engine by it", EnvHostname, h).
			WithHint("advertise an address peers reach (in Kubernetes the pod IP, status.podIP through the downward API), " +
				"or a name that resolves when the engine starts")
	}
	return nil
}
