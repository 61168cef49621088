package engine

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/tecache/te/internal/errs"
)

// mapEnv is an environment for applyEnv: getenv and environ of a map.
func mapEnv(m map[string]string) (func(string) string, []string) {
	var environ []string
	for k, v := range m {
		environ = append(environ, k+"="+v)
	}
	return func(k string) string { return m[k] }, environ
}

// TestApplyEnvEveryField: each variable reaches its field.
func TestApplyEnvEveryField(t *testing.T) {
	getenv, environ := mapEnv(map[string]string{
		EnvSegmentName: "seg", EnvMetadata: "mem://x", EnvListenAddr: "127.0.0.1:0", EnvHostname: "127.0.0.1",
		EnvTransports: "local, tcp", EnvForceTransport: "TCP", EnvTransferTimeout: "off", EnvRPCTimeout: "2s",
		EnvMaxNotifies: "10", EnvAcceptMooncakePeers: "yes", EnvAllowMooncakeWithSecret: "1",
		EnvUnregisterGrace: "500ms", EnvMetricsAddr: ":0", EnvMaxConns: "7", EnvMaxConnsPerHost: "3",
		EnvIdleTimeout: "1m", EnvHandshakeTimeout: "3s", EnvProgressTimeout: "4s", EnvMaxFrame: "64KiB",
		EnvMaxCallsPerConn: "5", EnvMaxCalls: "50", EnvNotifyBytes: "1MiB", EnvNotifyBytesPerSender: "65536",
		EnvPeerIdleTimeout: "never", EnvTCPListen: "127.0.0.1:0", "TE_PARAM_TCP_CONNS": "4",
		EnvTCPDevices:            "127.0.0.1,127.0.0.2",
		"TE_PARAM_shm_job_bytes": "1MiB", EnvIntegrity: "Headers",
	})
	var c Config
	params, _, err := c.applyEnv(getenv, environ)
	if err != nil {
		t.Fatal(err)
	}
	l := c.Limits
	switch {
	case c.SegmentName != "seg", c.Metadata != "mem://x", c.ListenAddr != "127.0.0.1:0", c.Hostname != "127.0.0.1":
		t.Fatalf("strings: %+v", c)
	case len(c.Transports) != 2 || c.Transports[1] != "tcp", c.ForceTransport != "tcp", c.MetricsAddr != ":0":
		t.Fatalf("transports: %+v", c)
	case c.TransferTimeout != -1, c.RPCTimeout != 2*time.Second, c.UnregisterGrace != 500*time.Millisecond:
		t.Fatalf("timeouts: %+v", c)
	case c.MaxNotifies != 10, !c.AcceptMooncakePeers, !c.AllowMooncakeWithSecret, !c.HeadersOnly:
		t.Fatalf("notifies, mooncake: %+v", c)
	case l.MaxConns != 7, l.MaxConnsPerHost != 3, l.IdleTimeout != time.Minute, l.HandshakeTimeout != 3*time.Second,
		l.ProgressTimeout != 4*time.Second, l.MaxFrame != 64<<10, l.MaxCallsPerConn != 5, l.MaxCalls != 50,
		l.NotifyBytes != 1<<20, l.NotifyBytesPerSender != 65536, l.PeerIdleTimeout != -1:
		t.Fatalf("limits: %+v", l)
	case c.Params["tcp.conns"] != "4", c.Params["tcp.listen"] != "127.0.0.1:0", c.Params["shm.job_bytes"] != "1MiB":
		t.Fatalf("params: %v", c.Params)
	case c.Params["tcp.devices"] != "127.0.0.1,127.0.0.2", params["tcp.devices"] != EnvTCPDevices:
		t.Fatalf("tcp.devices: %v from %v", c.Params, params)
	case params["tcp.conns"] != "TE_PARAM_TCP_CONNS", params["tcp.listen"] != EnvTCPListen:
		t.Fatalf("param sources: %v", params)
	}
}

// TestApplyEnvCallerWins: a field the caller set keeps its value, and the
// caller's Params map is not written to.
func TestApplyEnvCallerWins(t *testing.T) {
	getenv, environ := mapEnv(map[string]string{EnvSegmentName: "env", EnvMaxConns: "7", EnvRPCTimeout: "9s",
		"TE_PARAM_tcp_conns": "4", "TE_PARAM_tcp_slice": "1MiB"})
	mine := map[string]string{"tcp.conns": "2"}
	c := Config{SegmentName: "mine", Limits: Limits{MaxConns: 1}, RPCTimeout: time.Second, Params: mine}
	if _, _, err := c.applyEnv(getenv, environ); err != nil {
		t.Fatal(err)
	}
	if c.SegmentName != "mine" || c.Limits.MaxConns != 1 || c.RPCTimeout != time.Second || c.Params["tcp.conns"] != "2" ||
		c.Params["tcp.slice"] != "1MiB" {
		t.Fatalf("%+v", c)
	}
	if len(mine) != 1 {
		t.Fatalf("the caller's map was written: %v", mine)
	}
}

// TestApplyEnvRefuses: a value that does not parse is an InvalidArgument
// error naming the variable and the value.
func TestApplyEnvRefuses(t *testing.T) {
	for name, v := range map[string]string{
		EnvAcceptMooncakePeers: "maybe", EnvAllowMooncakeWithSecret: "2", EnvTransferTimeout: "soon",
		EnvRPCTimeout: "off", EnvUnregisterGrace: "-1s", EnvMaxNotifies: "many", EnvMaxConns: "0",
		EnvMaxConnsPerHost: "-3", EnvIdleTimeout: "5", EnvHandshakeTimeout: "0s", EnvProgressTimeout: "x",
		EnvMaxFrame: "16 parsecs", EnvMaxCallsPerConn: "1.5", EnvMaxCalls: "99999999999", EnvNotifyBytes: "0",
		EnvNotifyBytesPerSender: "-1", EnvPeerIdleTimeout: "later", "TE_PARAM_tcpconns": "4",
		"TE_PARAM_bogus_x": "1", "TE_PARAM_limits_max_conns": "1",
	} {
		getenv, environ := mapEnv(map[string]string{name: v})
		var c Config
		_, _, err := c.applyEnv(getenv, environ)
		if !errors.Is(err, errs.ErrInvalidArgument) || !strings.Contains(err.Error(), name) {
			t.Errorf("%s=%q: %v", name, v, err)
		}
	}
}

// TestApplyEnvRefusesOutOfRange: values that parse but cannot work (a
// timeout of 1ns, a frame bound of 2^63-1 bytes) are refused naming the
// variable and the range it takes.
func TestApplyEnvRefusesOutOfRange(t *testing.T) {
	for _, c := range []struct{ name, v, want string }{
		{EnvTransferTimeout, "1ns", "from 1ms to 24h0m0s"},
		{EnvRPCTimeout, "1ns", "from 10ms to 1h0m0s"},
		{EnvUnregisterGrace, "1ns", "from 1ms to 1h0m0s"},
		{EnvIdleTimeout, "1ns", "from 1s to 24h0m0s"},
		{EnvHandshakeTimeout, "1ns", "from 10ms to 1h0m0s"},
		{EnvProgressTimeout, "1ns", "from 10ms to 1h0m0s"},
		{EnvProgressTimeout, "9000h", "from 10ms to 1h0m0s"},
		{EnvPeerIdleTimeout, "1ns", "from 1s to 24h0m0s"},
		{EnvMaxFrame, "9223372036854775807", "from 4KiB to 1GiB"},
		{EnvMaxFrame, "1KiB", "from 4KiB to 1GiB"},
	} {
		getenv, environ := mapEnv(map[string]string{c.name: c.v})
		var cfg Config
		_, _, err := cfg.applyEnv(getenv, environ)
		if !errors.Is(err, errs.ErrInvalidArgument) || !strings.Contains(err.Error(), c.name) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s=%s: %v, want invalid argument naming it and %q", c.name, c.v, err, c.want)
		}
	}
	// The edges are accepted.
	getenv, environ := mapEnv(map[string]string{EnvProgressTimeout: "10ms", EnvMaxFrame: "1GiB", EnvTransferTimeout: "off"})
	var cfg Config
	if _, _, err := cfg.applyEnv(getenv, environ); err != nil || cfg.Limits.ProgressTimeout != 10*time.Millisecond || cfg.Limits.MaxFrame != 1<<30 {
		t.Fatalf("edges refused: %v %+v", err, cfg.Limits)
	}
}

// TestCheckHostname: an advertised host with a port, brackets or a name that
// does not resolve is refused, naming TE_HOSTNAME; addresses and names that
// resolve are taken.
func TestCheckHostname(t *testing.T) {
	for _, c := range []struct{ h, want string }{
		{"127.0.0.1:5", "has a port"}, {"[::1]:5", "has a port"}, {"[::1]", "brackets"},
		{"nowhere.invalid", "does not resolve"}, {"a b", "neither an IP address nor a host name"},
	} {
		err := checkHostname(c.h, time.Second)
		if !errors.Is(err, errs.ErrInvalidArgument) || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), EnvHostname) {
			t.Errorf("%q: %v, want invalid argument: %s", c.h, err, c.want)
		}
	}
	for _, h := range []string{"", "127.0.0.1", "::1", "localhost"} {
		if err := checkHostname(h, 5*time.Second); err != nil {
			t.Errorf("%q refused: %v", h, err)
		}
	}
}
