package engine_test

import (
	"bytes"
	"testing"
	"time"

	"github.com/tecache/te/engine"
	"github.com/tecache/te/internal/sys/mem"
)

func TestSmokeTwoEngines(t *testing.T) {
	a, err := engine.New(engine.Config{ListenAddr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := engine.New(engine.Config{ListenAddr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	src := mem.MustAlloc(4096)
	copy(src, bytes.Repeat([]byte{7}, 4096))
	dst := mem.MustAlloc(4096)
	if err := a.RegisterMemory(mem.Addr(src), 4096, "cpu:0", true); err != nil {
		t.Fatal(err)
	}
	if err := b.RegisterMemory(mem.Addr(dst), 4096, "cpu:0", true); err != nil {
		t.Fatal(err)
	}
	seg, err := a.OpenSegment(b.Name())
	if err != nil {
		t.Fatal(err)
	}
	d0, _ := seg.Descriptor()
	t.Logf("%+v dst=%#x", d0.Buffers, mem.Addr(dst))
	bt, _ := a.AllocateBatch(4)
	if err := bt.Submit(engine.Request{Op: engine.Write, Local: mem.Addr(src), Segment: seg, Remote: mem.Addr(dst), Length: 4096}); err != nil {
		t.Fatal(err)
	}
	st, err := bt.Wait(time.Second)
	if err != nil || st.State != engine.Completed {
		t.Fatal(st, err)
	}
	if !bytes.Equal(src, dst) {
		t.Fatal("mismatch")
	}
	ts, _ := bt.TaskStatus(0)
	t.Log(ts.Transport, st)
}
