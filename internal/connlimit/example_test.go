package connlimit_test

import (
	"fmt"
	"net"

	"github.com/tecache/te/internal/connlimit"
)

func ExampleLimiter_Admit() {
	lim := connlimit.New(100, 1)
	peer := &net.TCPAddr{IP: net.ParseIP("192.0.2.7"), Port: 40000}
	release, err := lim.Admit(peer)
	fmt.Println("first:", err)
	_, err = lim.Admit(&net.TCPAddr{IP: peer.IP, Port: 40001})
	fmt.Println("second:", err)
	release()
	fmt.Printf("%+v\n", lim.Stats())
	// Output:
	// first: <nil>
	// second: accept: resource exhausted: 1 connections open from 192.0.2.7, the limit per address
	// {Open:0 Peak:1 Accepted:1 RefusedTotal:0 RefusedPerHost:1}
}
