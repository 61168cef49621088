// Command ctrlpeer is the second process of the engine's cross-process tests:
// it starts an engine, registers a buffer, prints its segment name, answers
// every "echo" notification by sending the message back to the segment it
// names, and exits when its standard input closes.
package main

import (
	_ "github.com/tecache/te/engine/std"

	"bufio"
	"fmt"
	"os"
	"time"

	"github.com/tecache/te/engine"
	"github.com/tecache/te/internal/sys/mem"
)

func main() {
	e, err := engine.New(engine.Config{ListenAddr: "127.0.0.1:0"})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer e.Close()
	buf := mem.MustAlloc(1 << 20)
	if err := e.RegisterMemory(mem.Addr(buf), 1<<20, "cpu:0", true); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println(e.Name())
	stop := make(chan struct{})
	go func() {
		bufio.NewReader(os.Stdin).ReadString('\n')
		close(stop)
	}()
	for {
		select {
		case <-stop:
			return
		case <-time.After(time.Millisecond):
		}
		for _, n := range e.Notifies() {
			if n.Name == "echo" {
				if err := e.SendNotify(n.Msg, "echo-reply", n.Msg); err != nil {
					fmt.Fprintln(os.Stderr, "echo:", err)
				}
			}
		}
	}
}
