// Command example is te's Go API in one program: two engines (a prefill and
// a decode), a batch of WRITEs with a notification, the batch's status, and
// the engine's metrics in Prometheus's text format.
//
//	go run -ldflags "-X github.com/tecache/te/engine.Version=$(mk/version.sh)" ./examples/go
//
// (without -ldflags the version reads "+dev": go run stamps no commit; make
// test-examples runs it as above). The engines log in te's style on stderr
// (TE_LOG_LEVEL, TE_LOG_FORMAT).
//
// The blank import of engine/std links the standard transports (local, shm,
// tcp, rdma, cudaipc) and metadata stores; without it an engine has none.
package main

import (
	_ "github.com/tecache/te/engine/std"

	"bufio"
	"bytes"
	"fmt"
	"os"
	"strings"
	"time"
	"unsafe"

	"github.com/tecache/te/engine"
)

const block = 64 << 10

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "example:", err)
		os.Exit(1)
	}
	fmt.Println("example: ok")
}

func run() error {
	fmt.Println("te", engine.Version)
	// Both engines on loopback with free ports; peer-to-peer metadata (no
	// server): a segment is named by its engine's host:port.
	cfg := engine.Config{ListenAddr: "127.0.0.1:0", ForceTransport: "tcp"}
	prefill, err := engine.New(cfg)
	if err != nil {
		return err
	}
	defer prefill.Close()
	decode, err := engine.New(cfg)
	if err != nil {
		return err
	}
	defer decode.Close()

	// Registered memory must not move: Go's allocator does not move heap
	// objects, and the slices stay referenced until unregistered.
	src, dst := make([]byte, 8*block), make([]byte, 8*block)
	for i := range src {
		src[i] = byte(i/block + 1)
	}
	addr := func(b []byte) uint64 { return uint64(uintptr(unsafe.Pointer(&b[0]))) }
	if err := prefill.RegisterMemory(addr(src), uint64(len(src)), "cpu", true); err != nil {
		return err
	}
	defer prefill.UnregisterMemory(addr(src))
	if err := decode.RegisterMemory(addr(dst), uint64(len(dst)), "cpu", true); err != nil {
		return err
	}
	defer decode.UnregisterMemory(addr(dst))

	seg, err := prefill.OpenSegment(decode.Name())
	if err != nil {
		return err
	}
	defer prefill.CloseSegment(seg)
	b, err := prefill.AllocateBatch(8)
	if err != nil {
		return err
	}
	defer b.Free()
	var reqs []engine.Request
	for i := range 8 {
		reqs = append(reqs, engine.Request{Op: engine.Write, Local: addr(src) + uint64(i*block), Segment: seg,
			Remote: addr(dst) + uint64((7-i)*block), Length: block}) // reversed block order
	}
	if err := b.SubmitWithNotify(decode.Name(), "kv-ready", "req-1", reqs...); err != nil {
		return err
	}
	st, err := b.Wait(30 * time.Second)
	if err != nil {
		return err
	}
	fmt.Printf("prefill: %v, %d bytes in %d tasks\n", st.State, st.Transferred, st.Completed)
	for i := range 8 {
		if !bytes.Equal(dst[(7-i)*block:(8-i)*block], src[i*block:(i+1)*block]) {
			return fmt.Errorf("block %d did not arrive", i)
		}
	}
	notes := decode.Notifies()
	fmt.Printf("decode: every byte correct; %d notification(s): %q\n", len(notes), notes)

	var m bytes.Buffer
	if err := prefill.WriteMetrics(&m); err != nil {
		return err
	}
	sc := bufio.NewScanner(&m)
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "te_tasks_total") || strings.HasPrefix(sc.Text(), "te_transferred_bytes_total") {
			fmt.Println("metrics:", sc.Text())
		}
	}
	return nil
}
