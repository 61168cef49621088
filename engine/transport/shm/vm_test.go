package shm

import (
	"bytes"
	"fmt"
	"math/rand"
	"os"
	"os/exec"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/sys/mem"
)

// The copier is tested against this process itself: process_vm_writev to
// our own pid follows the same kernel path as to a peer.

func noSkip(int) bool   { return false }
func noCheck() error    { return nil }
func fillRand(b []byte) { rand.New(rand.NewSource(int64(len(b)))).Read(b) }

// TestMoveManySpans moves 3000 scattered spans: three system calls (1024
// iovecs each at most), every byte in place, nothing outside.
func TestMoveManySpans(t *testing.T) {
	const n, bs = 3000, 100
	src, dst := mem.MustAlloc(n*bs*2), mem.MustAlloc(n*bs*2)
	defer mem.Free(src)
	defer mem.Free(dst)
	fillRand(src)
	perm := rand.New(rand.NewSource(1)).Perm(n)
	spans := make([]span, n)
	for i := range spans {
		spans[i] = span{Local: mem.Addr(src) + uint64(i*bs*2), Remote: mem.Addr(dst) + uint64(perm[i]*bs*2), N: bs}
	}
	for _, write := range []bool{true, false} {
		clear(dst)
		v := newVM()
		ss := spans
		if !write { // read: the "remote" side is the source
			ss = make([]span, n)
			for i, s := range spans {
				ss[i] = span{Local: s.Remote, Remote: s.Local, N: s.N}
			}
		}
		v.move(os.Getpid(), write, ss, noSkip, noCheck, func(i int, err error) { t.Fatalf("span %d: %v", i, err) })
		if v.calls != 3 {
			t.Fatalf("write=%v: %d system calls for %d spans, want 3", write, v.calls, n)
		}
		for i := range spans {
			at := perm[i] * bs * 2
			if !bytes.Equal(dst[at:at+bs], src[i*bs*2:i*bs*2+bs]) {
				t.Fatalf("write=%v: span %d differs", write, i)
			}
			if dst[at+bs] != 0 {
				t.Fatalf("write=%v: span %d wrote past its end", write, i)
			}
		}
	}
}

// TestMovePartial puts an inaccessible page in the middle of the target: the
// span that runs into it fails alone with AddressNotRegistered after the
// kernel stopped short, the spans after it still move, and skipped spans are
// left alone.
func TestMovePartial(t *testing.T) {
	const page = 4096
	src, dst := mem.MustAlloc(8*page), mem.MustAlloc(8*page)
	defer mem.Free(src)
	defer mem.Free(dst)
	fillRand(src)
	if err := unix.Mprotect(dst[3*page:4*page], unix.PROT_NONE); err != nil {
		t.Fatal(err)
	}
	s, d := mem.Addr(src), mem.Addr(dst)
	spans := []span{
		{s, d, page},                               // fine
		{s + page, d + 2*page + page/2, page},      // runs into the guard
		{s + 2*page, d + 5*page, page},             // fine, after it
		{s + 3*page, d + 6*page, page},             // skipped
		{s + 4*page + 1, d + 7*page + 1, page - 2}, // fine, unaligned
	}
	failed := map[int]error{}
	v := newVM()
	v.move(os.Getpid(), true, spans, func(i int) bool { return i == 3 }, noCheck, func(i int, err error) { failed[i] = err })
	if len(failed) != 1 || errs.CodeOf(failed[1]) != errs.AddressNotRegistered {
		t.Fatalf("failures %v, want span 1 alone with AddressNotRegistered", failed)
	}
	if v.short == 0 {
		t.Fatal("the kernel did not stop short at the guard page")
	}
	for _, i := range []int{0, 2, 4} {
		off := spans[i].Remote - d
		if !bytes.Equal(dst[off:off+spans[i].N], src[spans[i].Local-s:spans[i].Local-s+spans[i].N]) {
			t.Fatalf("span %d did not move", i)
		}
	}
	// The first half page of span 1 moved before the fault.
	if !bytes.Equal(dst[2*page+page/2:3*page], src[page:page+page/2]) {
		t.Fatal("the bytes before the fault did not move")
	}
	if dst[6*page] != 0 {
		t.Fatal("a skipped span moved")
	}
}

// TestMoveGoneProcess: a pid that has exited fails every span with
// PeerUnreachable in one go; a check error fails every span before any call.
func TestMoveGoneProcess(t *testing.T) {
	cmd := exec.Command("/bin/true")
	if err := cmd.Run(); err != nil {
		t.Skip("no /bin/true to make a dead pid:", err)
	}
	buf := mem.MustAlloc(4096)
	defer mem.Free(buf)
	spans := []span{{mem.Addr(buf), mem.Addr(buf), 8}, {mem.Addr(buf) + 8, mem.Addr(buf) + 8, 8}}
	var codes []errs.Code
	v := newVM()
	v.move(cmd.Process.Pid, true, spans, noSkip, noCheck, func(i int, err error) { codes = append(codes, errs.CodeOf(err)) })
	if len(codes) != 2 || codes[0] != errs.PeerUnreachable || codes[1] != errs.PeerUnreachable || v.calls != 1 {
		t.Fatalf("codes %v after %d calls, want PeerUnreachable twice after one", codes, v.calls)
	}
	codes = nil
	v.move(os.Getpid(), true, spans, noSkip, func() error { return errs.New(errs.Timeout, "t", "lease") },
		func(i int, err error) { codes = append(codes, errs.CodeOf(err)) })
	if len(codes) != 2 || codes[0] != errs.Timeout || v.calls != 1 {
		t.Fatalf("codes %v, want Timeout twice and no call", codes)
	}
}

// TestMoveCoalesces: spans that continue each other on a side share an
// iovec, so 3000 contiguous spans take one call, and spans contiguous only
// locally still move byte for byte.
func TestMoveCoalesces(t *testing.T) {
	const n, bs = 3000, 100
	src, dst := mem.MustAlloc(n*bs*2), mem.MustAlloc(n*bs*2)
	defer mem.Free(src)
	defer mem.Free(dst)
	fillRand(src)
	spans := make([]span, n)
	for i := range spans {
		spans[i] = span{Local: mem.Addr(src) + uint64(i*bs), Remote: mem.Addr(dst) + uint64(i*bs), N: bs}
	}
	v := newVM()
	v.move(os.Getpid(), true, spans, noSkip, noCheck, func(i int, err error) { t.Fatalf("span %d: %v", i, err) })
	if v.calls != 1 || !bytes.Equal(dst[:n*bs], src[:n*bs]) {
		t.Fatalf("%d calls for contiguous spans, want 1 (bytes equal: %v)", v.calls, bytes.Equal(dst[:n*bs], src[:n*bs]))
	}
	// Locally contiguous, remotely every other slot (reversed).
	clear(dst)
	for i := range spans {
		spans[i].Remote = mem.Addr(dst) + uint64((n-1-i)*bs*2)
	}
	v = newVM()
	v.move(os.Getpid(), true, spans, noSkip, noCheck, func(i int, err error) { t.Fatalf("span %d: %v", i, err) })
	for i := range spans {
		at := (n - 1 - i) * bs * 2
		if !bytes.Equal(dst[at:at+bs], src[i*bs:i*bs+bs]) || dst[at+bs] != 0 {
			t.Fatalf("span %d differs", i)
		}
	}
	if v.calls != 3 {
		t.Fatalf("%d calls, want 3 (1024 remote iovecs each)", v.calls)
	}
}

// BenchmarkMove is the floor under the transport: process_vm_writev to this
// process of batches of scattered blocks between two 512 MiB buffers (larger
// than the last-level cache), against single-thread memcpy of the same
// blocks, interleaved, best of 5 rounds of 128 MiB each.
func BenchmarkMove(b *testing.B) {
	const size, round = 512 << 20, 128 << 20
	src, dst := mem.MustAlloc(size), mem.MustAlloc(size)
	defer mem.Free(src)
	defer mem.Free(dst)
	fillRand(src[:4096])
	for i := 4096; i < size; i += 4096 {
		src[i] = byte(i)
		dst[i] = 1
	}
	for _, c := range []struct{ bs, per int }{{1 << 20, 16}, {4 << 10, 128}} {
		b.Run(fmt.Sprintf("%dKiBx%d", c.bs>>10, c.per), func(b *testing.B) {
			perm := rand.New(rand.NewSource(1)).Perm(size / c.bs)
			spans := make([]span, c.per)
			v := newVM()
			k := 0
			batch := func() {
				for i := range spans {
					o := uint64(perm[k%len(perm)] * c.bs)
					k++
					spans[i] = span{Local: mem.Addr(src) + o, Remote: mem.Addr(dst) + o, N: uint64(c.bs)}
				}
				v.move(os.Getpid(), true, spans, noSkip, noCheck, func(i int, err error) { b.Fatal(err) })
			}
			memcpy := func() {
				for i := 0; i < c.per; i++ {
					o := perm[k%len(perm)] * c.bs
					k++
					copy(dst[o:o+c.bs], src[o:o+c.bs])
				}
			}
			b.SetBytes(int64(c.bs * c.per))
			for i := 0; i < b.N; i++ {
				batch()
			}
			b.StopTimer()
			var best [2]float64
			for r := 0; r < 5; r++ {
				for j, f := range []func(){batch, memcpy} {
					t0 := time.Now()
					for n := 0; n < round/(c.bs*c.per); n++ {
						f()
					}
					best[j] = max(best[j], round/time.Since(t0).Seconds()/1e9)
				}
			}
			b.ReportMetric(best[0], "vm_GB/s")
			b.ReportMetric(best[1], "memcpy_GB/s")
			b.ReportMetric(best[0]/best[1], "x_memcpy")
		})
	}
}
