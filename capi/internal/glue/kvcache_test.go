package glue

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/tecache/te/cmd/te-sidecar/sidecar"
	"github.com/tecache/te/engine"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/sys/mem"
	"github.com/tecache/te/kvcache"
	"github.com/tecache/te/kvcache/handoff"
	"github.com/tecache/te/kvcache/handoff/proto"
)

const shape = `"format":"vllm","order":"HND","dtype":"bf16","num_blocks":4,"block_size":16,"num_heads":2,"head_dim":64`

func TestParseLayout(t *testing.T) {
	l, err := ParseLayout("op", `{`+shape+`,"bases":[4096,1048576]}`)
	if err != nil {
		t.Fatal(err)
	}
	if l.Format != kvcache.VLLM || l.Order != kvcache.HND || l.NumLayers() != 2 {
		t.Fatalf("%+v", l)
	}
	for _, tc := range []struct{ json, want string }{
		{``, "empty"},
		{`{`, "layout JSON"},
		{`{` + shape + `,"bases":[4096]} {}`, "trailing"},
		{`{` + shape + `,"bases":[4096],"base":[1]}`, `unknown field "base"`},
		{`{` + shape + `}`, "no layer base"},
		{`{` + strings.Replace(shape, "bf16", "int3", 1) + `,"bases":[4096]}`, "int3"},
		{`{` + shape + `,"bases":[4096,4100]}`, "overlap"},
	} {
		_, err := ParseLayout("op", tc.json)
		if !errors.Is(err, errs.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseLayout(%s) = %v, want invalid argument with %q", tc.json, err, tc.want)
		}
	}
	if _, err := ParseLayout("op", strings.Repeat(" ", MaxLayoutJSON+1)); !errors.Is(err, errs.ErrTooLarge) {
		t.Errorf("oversized: %v", err)
	}

	block, layer, err := ParseShape("op", `{`+shape+`}`)
	if err != nil || block != 16*2*64*2 || layer != 2*4*block {
		t.Fatalf("ParseShape = %d, %d, %v", block, layer, err)
	}
	if _, _, err := ParseShape("op", `{"format":"vllm"}`); !errors.Is(err, errs.ErrInvalidArgument) {
		t.Errorf("ParseShape without a dtype: %v", err)
	}
	in, err := InfoOf(l)
	if err != nil || in.NumLayers != 2 || in.Components != 2 || in.Regions != 2 || in.LayerBytes != layer {
		t.Fatalf("InfoOf = %+v, %v", in, err)
	}
}

func TestPlanArguments(t *testing.T) {
	if r, err := LayerRange("op", 0, 0); err != nil || r != (kvcache.LayerRange{}) {
		t.Fatalf("0,0: %v %v", r, err)
	}
	if r, err := LayerRange("op", 2, 5); err != nil || r != kvcache.Layers(2, 5) {
		t.Fatalf("2,5: %v %v", r, err)
	}
	for _, r := range [][2]int32{{3, 3}, {4, 2}, {-1, 2}} {
		if _, err := LayerRange("op", r[0], r[1]); !errors.Is(err, errs.ErrInvalidArgument) {
			t.Errorf("LayerRange%v = %v", r, err)
		}
	}
	if b, err := Blocks("op", "source", []int32{3, -1, 7}); err != nil || len(b) != 3 || b[1] != -1 {
		t.Fatalf("Blocks = %v, %v", b, err)
	}
	if _, err := Blocks("op", "source", nil); !errors.Is(err, errs.ErrInvalidArgument) {
		t.Errorf("empty: %v", err)
	}
}

func TestHandoffNumbers(t *testing.T) {
	for _, s := range proto.States {
		if StateNumber(string(s)) < 0 {
			t.Errorf("state %q has no TE_HANDOFF_ number", s)
		}
	}
	if StateNumber("bogus") != -1 {
		t.Error("unknown state")
	}
	for n, m := range map[int32]handoff.Mode{ModeDefault: "", ModePush: handoff.Push, ModePull: handoff.Pull} {
		got, err := ModeOf("op", n)
		if err != nil || got != m || ModeNumber(m) != n {
			t.Errorf("mode %d: %q %v", n, got, err)
		}
	}
	if _, err := ModeOf("op", 3); !errors.Is(err, errs.ErrInvalidArgument) {
		t.Error(err)
	}
	if _, err := DeclTimeout("op", -1); !errors.Is(err, errs.ErrInvalidArgument) {
		t.Error(err)
	}
	if d, err := DeclTimeout("op", 1500); err != nil || d != 1500*time.Millisecond {
		t.Error(d, err)
	}
	if d, _ := DeclTimeout("op", 1<<62); d <= 0 {
		t.Errorf("huge timeout overflowed to %v", d)
	}
	if KindTransfer.String() != "transfer" || KindLayout.String() != "layout" || Kind(99).String() != "unknown" {
		t.Error("kind names")
	}
}

func TestOwned(t *testing.T) {
	tb := NewTable[string](KindHandoff)
	a := tb.Put(1, "a")
	tb.Put(2, "x")
	b := tb.Put(1, "b")
	if got := tb.Owned(1); len(got) != 2 || got[0] != "a" || got[1] != "b" {
		t.Fatalf("Owned = %v", got)
	}
	got := tb.DropOwnerHandles(1)
	if len(got) != 2 || tb.Len() != 1 {
		t.Fatalf("DropOwnerHandles = %v, %d left", got, tb.Len())
	}
	for _, o := range got {
		if (o.H() == a) != (o.V() == "a") || (o.H() == b) != (o.V() == "b") {
			t.Errorf("%#x -> %q", o.H(), o.V())
		}
	}
}

// TestXferWaitAndRelease drives a decode-side transfer against a real
// sidecar: a short wait times out and leaves the transfer waiting; Release
// aborts it, and a second Release does nothing.
func TestXferWaitAndRelease(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := sidecar.New(sidecar.Config{})
	go srv.Serve(ln)
	defer srv.Shutdown(context.Background())

	e, err := engine.New(engine.Config{ListenAddr: "127.0.0.1:0", Hostname: "127.0.0.1", Transports: []string{"tcp"}})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	l := &kvcache.Layout{Format: kvcache.VLLM, DType: kvcache.BF16, NumBlocks: 4, BlockSize: 16, NumHeads: 2, HeadDim: 64}
	per, _ := l.LayerBytes()
	buf := mem.MustAlloc(int(per))
	defer mem.Free(buf)
	l.Bases = []uint64{mem.Addr(buf)}
	if err := e.RegisterMemory(mem.Addr(buf), per, "cpu", true); err != nil {
		t.Fatal(err)
	}
	c, err := handoff.New(e, handoff.Options{Sidecar: ln.Addr().String()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	tr, err := c.Expect(context.Background(), handoff.Request{ID: "x1", Layout: l, Blocks: []int{0, 1}, Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	x := NewXfer(tr)
	if _, err := x.Wait(30); !errors.Is(err, errs.ErrTimeout) || x.Finished() {
		t.Fatalf("short wait = %v (finished %v), want a timeout", err, x.Finished())
	}
	st, err := tr.Status(context.Background())
	if err != nil || st.State != "waiting" {
		t.Fatalf("after the timed-out wait: %+v %v", st, err)
	}
	x.Release(5 * time.Second)
	if !x.Finished() {
		t.Fatal("release did not finish the transfer")
	}
	st, err = tr.Status(context.Background())
	if err != nil || st.State != "aborted" || !st.Settled || !strings.Contains(st.Reason, "freed") {
		t.Fatalf("after release: %+v %v", st, err)
	}
	x.Release(5 * time.Second) // finished: no second abort
	ReleaseAll([]*Xfer{x})
	if _, err := x.Wait(1000); !errors.Is(err, errs.ErrCanceled) {
		t.Fatalf("wait after abort = %v", err)
	}
}
