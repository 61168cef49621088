package peerauth_test

import (
	"fmt"
	"net"
	"time"

	"github.com/tecache/te/internal/peerauth"
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
