package file_test

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/tecache/te/engine"
	"github.com/tecache/te/internal/sys/mem"
)

// Register a file range as a buffer of the segment, write memory into it and
// read it back: the file's address works like a remote address.
func Example() {
	e, err := engine.New(engine.Config{ListenAddr: "127.0.0.1:0", Logger: quiet})
	if err != nil {
		panic(err)
	}
	defer e.Close()
	dir, _ := os.MkdirTemp("", "te-example-")
	defer os.RemoveAll(dir)

	buf := mem.MustAlloc(1 << 20)
	defer mem.Free(buf)
	copy(buf, "KV blocks")
	e.RegisterMemory(mem.Addr(buf), uint64(len(buf)), "cpu", false)
	file, err := e.RegisterFile(filepath.Join(dir, "kv"), 0, 64<<20, engine.FileOptions{Remote: true, Create: true})
	if err != nil {
		panic(err)
	}
	defer e.UnregisterMemory(file) // waits for the file's I/O, closes it

	seg, _ := e.OpenSegment(e.Name())
	b, _ := e.AllocateBatch(1)
	defer b.Free()
	b.Submit(engine.Request{Op: engine.Write, Local: mem.Addr(buf), Segment: seg, Remote: file + 4096, Length: 1 << 20})
	st, _ := b.Wait(10 * time.Second)
	fmt.Println("write:", st.State)

	clear(buf)
	b.Reset()
	b.Submit(engine.Request{Op: engine.Read, Local: mem.Addr(buf), Segment: seg, Remote: file + 4096, Length: 1 << 20})
	st, _ = b.Wait(10 * time.Second)
	fmt.Println("read:", st.State, string(buf[:9]))
	// Output:
	// write: COMPLETED
	// read: COMPLETED KV blocks
}
