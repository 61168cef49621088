package engine_test

import (
	"errors"
	"net"
	"strings"
	"testing"

	"github.com/tecache/te/engine"
	"github.com/tecache/te/internal/errs"
)

// TestEnvRefusedAtNew: a variable with a value that does not parse makes
// New fail with InvalidArgument, naming it.
func TestEnvRefusedAtNew(t *testing.T) {
	for name, v := range map[string]string{
		engine.EnvAcceptMooncakePeers: "maybe",
		engine.EnvMaxConns:            "lots",
		"TE_LOG_LEVEL":                "chatty",
		"TE_LOG_FORMAT":               "xml",
		"TE_PARAM_tcp_conn":           "4",      // no such tcp parameter
		"TE_PARAM_tcp_conns":          "banana", // tcp refuses the value
		engine.EnvTCPListen:           "nowhere",
		engine.EnvTCPDevices:          "no-such-nic0",
		engine.EnvMetricsAddr:         "no port",
		engine.EnvIntegrity:           "none",
	} {
		t.Run(name, func(t *testing.T) {
			t.Setenv(name, v)
			e, err := engine.New(engine.Config{ListenAddr: "127.0.0.1:0", Transports: []string{"local", "tcp"}})
			if err == nil {
				e.Close()
				t.Fatalf("%s=%q accepted", name, v)
			}
			if !errors.Is(err, errs.ErrInvalidArgument) {
				t.Fatalf("%s=%q: %v, want invalid argument", name, v, err)
			}
			if !strings.Contains(err.Error(), name) {
				t.Fatalf("%s=%q: the error does not name the variable: %v", name, v, err)
			}
			t.Log(err)
		})
	}
}

// TestEnvMooncakeWithSecret: the refusal of Mooncake peers with a secret
// names the variable a drop-in user can set, and setting it lets them in.
func TestEnvMooncakeWithSecret(t *testing.T) {
	t.Setenv("TE_AUTH_SECRET", "0123456789abcdef0123")
	t.Setenv(engine.EnvAcceptMooncakePeers, "1")
	_, err := engine.New(engine.Config{ListenAddr: "127.0.0.1:0", Transports: []string{"local", "tcp"}})
	if !errors.Is(err, errs.ErrInvalidArgument) || !strings.Contains(err.Error(), engine.EnvAllowMooncakeWithSecret+"=1") {
		t.Fatalf("want a refusal naming %s: %v", engine.EnvAllowMooncakeWithSecret, err)
	}
	t.Setenv(engine.EnvAllowMooncakeWithSecret, "1")
	e, err := engine.New(engine.Config{ListenAddr: "127.0.0.1:0", Transports: []string{"local", "tcp"}})
	if err != nil {
		t.Fatal(err)
	}
	e.Close()
}

// TestEnvPinsTCPListener: TE_TCP_LISTEN and TE_PARAM_tcp_conns reach the
// tcp transport, which a drop-in user cannot configure otherwise.
func TestEnvPinsTCPListener(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	t.Setenv(engine.EnvTCPListen, addr)
	t.Setenv("TE_PARAM_TCP_CONNS", "2")
	e, err := engine.New(engine.Config{ListenAddr: "127.0.0.1:0", Transports: []string{"local", "tcp"}})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if got := e.Descriptor().Endpoints["tcp"]; got != addr {
		t.Fatalf("tcp endpoint %q, want %q from %s", got, addr, engine.EnvTCPListen)
	}
}
