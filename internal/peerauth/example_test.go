package peerauth_test

import (
	"fmt"
	"net"
	"time"

	"github.com/tecache/te/internal/peerauth"
	"github.com/tecache/te/internal/session"
)

// Example authenticates one connection both ways: the server learns the
// initiator's instance, the initiator the server's, each proven by the
// shared secret.
func Example() {
	secret, err := peerauth.ParseSecret("a cluster secret of 32 bytes...\n")
	if err != nil {
		panic(err)
	}
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	defer ln.Close()
	served := make(chan string)
	go func() {
		conn, _ := ln.Accept()
		defer conn.Close()
		peer, err := peerauth.Server(conn, secret, "server-1", time.Now().Add(10*time.Second))
		if err != nil {
			served <- err.Error()
			return
		}
		served <- peer
	}()
	conn, _ := net.Dial("tcp", ln.Addr().String())
	defer conn.Close()
	peer, err := peerauth.Client(conn, secret, "client-1", time.Now().Add(10*time.Second))
	fmt.Println("initiator talks to", peer, err)
	fmt.Println("server talks to", <-served)
	// Output:
	// initiator talks to server-1 <nil>
	// server talks to client-1
}

// ExampleLoadSecret reads the secret the way an engine does: the
// configuration first, then a file, then TE_AUTH_SECRET_FILE and
// TE_AUTH_SECRET.
func ExampleLoadSecret() {
	env := map[string]string{peerauth.EnvSecret: "new secret, 16+ bytes\nold secret, 16+ bytes"}
	s, source, err := peerauth.LoadSecret("", "", func(k string) string { return env[k] })
	fmt.Println(len(s.KeyIDs()), "keys from", source, err)
	// Output: 2 keys from TE_AUTH_SECRET <nil>
}

// ExampleClientSession opens an authenticated session: after the exchange
// every frame is sealed by its sender and opened by its receiver, so a
// party on the path can neither inject nor alter one.
func ExampleClientSession() {
	secret, _ := peerauth.ParseSecret("a cluster secret of 32 bytes...")
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	defer ln.Close()
	opt := peerauth.SessionOptions{Channel: session.Data}
	served := make(chan string)
	go func() {
		conn, _ := ln.Accept()
		defer conn.Close()
		o, err := peerauth.ServerSession(conn, secret, "target-1", time.Now().Add(10*time.Second), opt)
		if err != nil {
			served <- err.Error()
			return
		}
		// The reader opens each frame header before it uses it.
		hdr, err := o.Session.Recv.ReadRecord(conn, make([]byte, 64), len("READ 4096 bytes"))
		served <- fmt.Sprintf("%s from %s (%v)", hdr, o.PeerInstance, err)
	}()
	conn, _ := net.Dial("tcp", ln.Addr().String())
	defer conn.Close()
	o, err := peerauth.ClientSession(conn, secret, "initiator-1", time.Now().Add(10*time.Second), opt)
	if err != nil {
		panic(err)
	}
	rec, _ := o.Session.Send.Seal(nil, []byte("READ 4096 bytes"))
	conn.Write(rec)
	fmt.Println(o.Session.Mode, "session with", o.PeerInstance)
	fmt.Println(<-served)
	// Output:
	// integrity session with target-1
	// READ 4096 bytes from initiator-1 (<nil>)
}
