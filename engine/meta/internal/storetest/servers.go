// Package storetest runs real metadata servers (etcd, redis, any server
// process) on loopback for tests, and holds the test body every networked
// store passes: engines in this process and in a child process transfer
// through it, a killed engine's segment expires with its TTL, and an outage
// in the middle keeps open segments working, fails new opens with a metadata
// error and is repaired when the server is back.
package storetest

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Need returns path if the binary exists. Otherwise the test is skipped,
// except in CI (CI=true), which installs the servers and must run these
// tests: there it fails.
func Need(t testing.TB, path, pkg string) string {
	t.Helper()
	if _, err := os.Stat(path); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s is missing: CI installs Debian's %s (.ci/deps.d/meta.pkgs)", path, pkg)
		}
		t.Skipf("%s is missing: install Debian's %s to run this test", path, pkg)
	}
	return path
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func FreePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// Server is a server process that a test can stop and start again on the
// same port.
type Server struct {
	t     testing.TB
	name  string
	args  func() []string
	wipe  func()
	ready func() error // nil: accepting connections is enough
	env   []string     // added to the environment
	Port  int
	mu    sync.Mutex
	cmd   *exec.Cmd
	log   *bytes.Buffer
	exitc chan struct{}
}

// Addr is 127.0.0.1:Port.
func (s *Server) Addr() string { return "127.0.0.1:" + strconv.Itoa(s.Port) }

// Start starts the server and waits until it accepts connections.
func (s *Server) Start() {
	s.t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		s.t.Fatalf("%s already running", s.name)
	}
	args := s.args()
	cmd := exec.Command(args[0], args[1:]...)
	if s.env != nil {
		cmd.Env = append(os.Environ(), s.env...)
	}
	s.log = &bytes.Buffer{}
	cmd.Stdout, cmd.Stderr = s.log, s.log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		s.t.Fatalf("starting %s: %v", s.name, err)
	}
	s.cmd = cmd
	s.exitc = make(chan struct{})
	exitc := s.exitc
	go func() { cmd.Wait(); close(exitc) }()
	deadline := time.Now().Add(15 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", s.Addr(), 200*time.Millisecond)
		if err == nil {
			c.Close()
			if s.ready == nil {
				return
			}
			if err = s.ready(); err == nil {
				return
			}
		}
		select {
		case <-exitc:
			s.t.Fatalf("%s exited at start: %s", s.name, s.log.String())
		default:
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("%s does not listen on %s: %s", s.name, s.Addr(), s.log.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Stop kills the server (SIGKILL: an outage, not a clean shutdown) and
// waits for it to exit.
func (s *Server) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	s.cmd.Process.Kill()
	<-s.exitc
	s.cmd = nil
}

// Wipe deletes the server's data (call it while stopped): the next Start is
// a server that never saw this test's keys.
func (s *Server) Wipe() {
	if s.wipe != nil {
		s.wipe()
	}
}

func newServer(t testing.TB, name string, args func(s *Server) []string) *Server {
	s := &Server{t: t, name: name, Port: FreePort(t)}
	s.args = func() []string { return args(s) }
	t.Cleanup(s.Stop)
	return s
}

// Process starts a server process: args gives the command line for the
// server's port, env is added to the environment. The server is ready when it
// accepts connections on 127.0.0.1:port.
func Process(t testing.TB, name string, args func(port int) []string, env ...string) *Server {
	s := newServer(t, name, func(s *Server) []string { return args(s.Port) })
	s.env = env
	s.Start()
	return s
}

// Etcd starts /usr/bin/etcd on free loopback ports with its data in a
// temporary directory.
func Etcd(t testing.TB) *Server { return etcd(t, nil) }

// EtcdTLS starts etcd serving its clients over TLS with p's server
// certificate and requiring client certificates signed by p's CA
// (--client-cert-auth).
func EtcdTLS(t testing.TB, p *PKI) *Server { return etcd(t, p) }

func etcd(t testing.TB, p *PKI) *Server {
	bin := Need(t, "/usr/bin/etcd", "etcd-server")
	dir := t.TempDir()
	peer := FreePort(t)
	data := filepath.Join(dir, "data")
	scheme := "http://"
	if p != nil {
		scheme = "https://"
	}
	s := newServer(t, "etcd", func(s *Server) []string {
		client := scheme + s.Addr()
		peerURL := fmt.Sprintf("http://127.0.0.1:%d", peer)
		args := []string{bin, "--name", "te-test", "--data-dir", data,
			"--listen-client-urls", client, "--advertise-client-urls", client,
			"--listen-peer-urls", peerURL, "--initial-advertise-peer-urls", peerURL,
			"--initial-cluster", "te-test=" + peerURL, "--initial-cluster-state", "new",
			"--log-level", "error", "--logger", "zap"}
		if p != nil {
			args = append(args, "--cert-file", p.ServerCert, "--key-file", p.ServerKey,
				"--trusted-ca-file", p.CA, "--client-cert-auth")
		}
		return args
	})
	s.wipe = func() { os.RemoveAll(data) }
	// The port opens before the member has elected itself leader.
	c := http.Client{Timeout: time.Second}
	if p != nil {
		c.Transport = &http.Transport{TLSClientConfig: p.ClientTLS(t)}
	}
	s.ready = func() error {
		r, err := c.Get(scheme + s.Addr() + "/health")
		if err != nil {
			return err
		}
		defer r.Body.Close()
		b, _ := io.ReadAll(r.Body)
		if !bytes.Contains(b, []byte(`"health":"true"`)) {
			return fmt.Errorf("etcd not healthy: %s", b)
		}
		return nil
	}
	s.Start()
	t.Cleanup(c.CloseIdleConnections)
	return s
}

// Redis starts /usr/bin/redis-server on a free loopback port without
// persistence: a restart forgets every key. Extra arguments are appended
// (e.g. "--requirepass", "x").
func Redis(t testing.TB, extra ...string) *Server { return redis(t, nil, extra) }

// RedisTLS starts redis serving TLS only, with p's server certificate and
// requiring client certificates signed by p's CA.
func RedisTLS(t testing.TB, p *PKI, extra ...string) *Server { return redis(t, p, extra) }

func redis(t testing.TB, p *PKI, extra []string) *Server {
	bin := Need(t, "/usr/bin/redis-server", "redis-server")
	dir := t.TempDir()
	s := newServer(t, "redis", func(s *Server) []string {
		port := []string{"--port", strconv.Itoa(s.Port)}
		if p != nil {
			port = []string{"--port", "0", "--tls-port", strconv.Itoa(s.Port), "--tls-cert-file", p.ServerCert,
				"--tls-key-file", p.ServerKey, "--tls-ca-cert-file", p.CA, "--tls-auth-clients", "yes"}
		}
		return append(append([]string{bin, "--bind", "127.0.0.1",
			"--save", "", "--appendonly", "no", "--dir", dir, "--protected-mode", "no"}, port...), extra...)
	})
	s.Start()
	return s
}
