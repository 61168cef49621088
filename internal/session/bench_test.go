package session

import (
	"bufio"
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/sha256"
	"fmt"
	"io"
	"net"
	"syscall"
	"testing"

	"github.com/klauspost/cpuid/v2"

	"github.com/tecache/te/internal/wire"
)

// The benchmarks measure what sessions cost and against what:
//
//   - BenchmarkPrimitives: the candidates for a header's MAC (GMAC, which
//     the sessions use, and HMAC-SHA256) and the rates of the physical
//     references, memcpy and AES-128-GCM on one core, in the same run.
//   - BenchmarkFrame: the CPU cost of one data frame (a 40-byte request
//     header and its payload, sealed and opened) per mode, in ns/frame and
//     GB/s, beside memcpy and raw AES-GCM of the same size.
//   - BenchmarkLoopback: whole frames over a real TCP connection on
//     127.0.0.1 (request header and payload one way, a 24-byte completion
//     back, 16 frames in flight), per mode: the ratio to "plain" is what a
//     session costs a transfer. cpu-ns/op is the CPU both ends spent per
//     frame, the figure to compare on a machine shared with other work.
//
// "headers" is the opt-out (payloads in the clear, unauthenticated);
// "payloadmac" moves the payload as a body (records through the Sealer's
// buffer), which Integrity mode avoids on the sending side.

var benchSizes = []int{4 << 10, 64 << 10, 1 << 20}

func sizeName(n int) string {
	if n >= 1<<20 {
		return fmt.Sprintf("%dMiB", n>>20)
	}
	return fmt.Sprintf("%dKiB", n>>10)
}

func benchPair(b *testing.B, mode Mode) (send *Sealer, recv *Opener) {
	if mode == 0 {
		return nil, nil
	}
	p := Params{Secret: []byte("correct horse battery staple 1"), Transcript: []byte("bench"), Channel: Data, Mode: mode}
	ini, err := New(p, Initiator)
	if err != nil {
		b.Fatal(err)
	}
	srv, _ := New(p, Server)
	return ini.Send, srv.Recv
}

func rawGCM() cipher.AEAD {
	blk, _ := aes.NewCipher(make([]byte, KeySize))
	g, _ := cipher.NewGCM(blk)
	return g
}

func BenchmarkPrimitives(b *testing.B) {
	b.Logf("CPU %s, %d cores; crypto features %s; hardware AES-GCM %v", cpuid.CPU.BrandName, cpuid.CPU.LogicalCores, CPUFeatures(), HardwareAES())
	g := rawGCM()
	nonce := make([]byte, NonceSize)
	for _, n := range append([]int{40}, benchSizes...) {
		src := bytes.Repeat([]byte{7}, n)
		dst := make([]byte, n+TagSize)
		b.Run("memcpy/"+fmt.Sprint(n), func(b *testing.B) {
			b.SetBytes(int64(n))
			loop(b, func() { copy(dst, src) })
		})
		b.Run("aes128gcm/"+fmt.Sprint(n), func(b *testing.B) {
			b.SetBytes(int64(n))
			loop(b, func() { g.Seal(dst[:0], nonce, src, nil) })
		})
		b.Run("gmac/"+fmt.Sprint(n), func(b *testing.B) {
			b.SetBytes(int64(n))
			loop(b, func() { g.Seal(dst[:0], nonce, nil, src) })
		})
		m := hmac.New(sha256.New, make([]byte, 32))
		b.Run("hmacsha256/"+fmt.Sprint(n), func(b *testing.B) {
			b.SetBytes(int64(n))
			loop(b, func() {
				m.Reset()
				m.Write(src)
				m.Sum(dst[:0])
			})
		})
	}
}

type variant struct {
	name       string
	mode       Mode
	payloadMAC bool
}

var variants = []variant{{"plain", 0, false}, {"headers", Headers, false}, {"integrity", Integrity, false}, {"payloadmac", Integrity, true}, {"encryption", Encryption, false}}

// writePayload and readPayload move a payload as the variant does.
func (v variant) writePayload(s *Sealer, w io.Writer, p []byte) error {
	if v.payloadMAC {
		return s.WriteBody(w, p, nil)
	}
	return s.WritePayload(w, p, nil)
}

func (v variant) readPayload(o *Opener, r io.Reader, dst []byte) error {
	if v.payloadMAC {
		return o.records(r, dst, uint64(len(dst)), ReadRecords, nil)
	}
	return o.ReadPayload(r, dst, nil)
}

// BenchmarkFrame: one data frame sealed and opened in memory (both ends'
// CPU), beside memcpy and raw AES-128-GCM of the payload.
func BenchmarkFrame(b *testing.B) {
	for _, n := range benchSizes {
		src := bytes.Repeat([]byte{7}, n)
		dst := make([]byte, n)
		b.Run(sizeName(n)+"/memcpy", func(b *testing.B) {
			b.SetBytes(int64(n))
			loop(b, func() { copy(dst, src) })
		})
		g := rawGCM()
		out := make([]byte, n+TagSize)
		nonce := make([]byte, NonceSize)
		b.Run(sizeName(n)+"/aes128gcm", func(b *testing.B) {
			b.SetBytes(int64(n))
			loop(b, func() { g.Seal(out[:0], nonce, src, nil) })
		})
		for _, v := range variants {
			b.Run(sizeName(n)+"/"+v.name, func(b *testing.B) {
				s, o := benchPair(b, v.mode)
				var hdr [wire.ReqHeaderSize]byte
				hbuf := make([]byte, 0, wire.ReqHeaderSize+TagSize)
				var w bytes.Buffer
				w.Grow(2 * n)
				r := bytes.NewReader(nil)
				b.SetBytes(int64(n))
				b.ReportAllocs()
				loop(b, func() {
					w.Reset()
					wire.PutDataRequest(hdr[:], wire.DataRequest{Kind: wire.DataWrite, ID: 1, Addr: 1 << 40, Length: uint64(n), Key: 42})
					h, _ := s.Seal(hbuf[:0], hdr[:])
					w.Write(h)
					if err := v.writePayload(s, &w, src); err != nil {
						b.Fatal(err)
					}
					r.Reset(w.Bytes())
					if _, err := o.ReadRecord(r, hbuf[:cap(hbuf)], wire.ReqHeaderSize); err != nil {
						b.Fatal(err)
					}
					if err := v.readPayload(o, r, dst); err != nil {
						b.Fatal(err)
					}
				})
			})
		}
	}
}

// loop runs f b.N times under b.Loop and reports, beside the wall clock,
// the CPU time per iteration: on a machine shared with other work the wall
// clock also counts the time this benchmark waited for a core.
func loop(b *testing.B, f func()) {
	cpu0, iters := cpuTime(), 0
	for b.Loop() {
		f()
		iters++
	}
	b.ReportMetric(float64(cpuTime()-cpu0)/float64(iters), "cpu-ns/op")
}

// cpuTime is the process's user and system CPU time in nanoseconds.
func cpuTime() int64 {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return ru.Utime.Nano() + ru.Stime.Nano()
}

// BenchmarkLoopback: a stream of WRITE frames over TCP on 127.0.0.1, each
// answered by a completion, 16 in flight, per variant.
func BenchmarkLoopback(b *testing.B) {
	for _, n := range benchSizes {
		for _, v := range variants {
			b.Run(sizeName(n)+"/"+v.name, func(b *testing.B) { loopback(b, v, n) })
		}
	}
}

func loopback(b *testing.B, v variant, n int) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	cs, so := benchPair(b, v.mode) // client -> server
	ss, co := benchPair(b, v.mode) // server -> client (a second pair: the directions are independent)
	served := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			served <- err
			return
		}
		defer c.Close()
		br := bufio.NewReaderSize(c, 256<<10)
		bw := bufio.NewWriterSize(c, 16<<10)
		hbuf := make([]byte, wire.ReqHeaderSize+TagSize)
		cbuf := make([]byte, 0, wire.CompHeaderSize+TagSize)
		var comp [wire.CompHeaderSize]byte
		dst := make([]byte, n)
		for {
			h, err := so.ReadRecord(br, hbuf, wire.ReqHeaderSize)
			if err != nil {
				served <- nil // the client closed
				return
			}
			req, err := wire.DecodeDataRequest(h)
			if err != nil || req.Length != uint64(n) {
				served <- fmt.Errorf("request %+v: %v", req, err)
				return
			}
			if err := v.readPayload(so, br, dst); err != nil {
				served <- err
				return
			}
			wire.PutCompletion(comp[:], wire.Completion{ID: req.ID})
			rec, _ := ss.Seal(cbuf[:0], comp[:])
			bw.Write(rec)
			if br.Buffered() == 0 {
				if err := bw.Flush(); err != nil {
					served <- err
					return
				}
			}
		}
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	const window = 16
	slots := make(chan struct{}, window)
	done := make(chan error, 1)
	total := b.N
	go func() {
		br := bufio.NewReaderSize(c, 16<<10)
		cbuf := make([]byte, wire.CompHeaderSize+TagSize)
		for i := 0; i < total; i++ {
			h, err := co.ReadRecord(br, cbuf, wire.CompHeaderSize)
			if err != nil {
				done <- err
				return
			}
			if cp, err := wire.DecodeCompletion(h); err != nil || cp.ID != uint64(i) {
				done <- fmt.Errorf("completion %+v for %d: %v", cp, i, err)
				return
			}
			<-slots
		}
		done <- nil
	}()
	src := bytes.Repeat([]byte{7}, n)
	bw := bufio.NewWriterSize(c, 64<<10)
	hbuf := make([]byte, 0, wire.ReqHeaderSize+TagSize)
	var hdr [wire.ReqHeaderSize]byte
	b.SetBytes(int64(n))
	cpu0 := cpuTime()
	b.ResetTimer()
	for i := 0; i < total; i++ {
		slots <- struct{}{}
		wire.PutDataRequest(hdr[:], wire.DataRequest{Kind: wire.DataWrite, ID: uint64(i), Addr: 1 << 40, Length: uint64(n), Key: 42})
		h, _ := cs.Seal(hbuf[:0], hdr[:])
		bw.Write(h)
		if err := v.writePayload(cs, bw, src); err != nil {
			b.Fatal(err)
		}
		if err := bw.Flush(); err != nil {
			b.Fatal(err)
		}
	}
	if err := <-done; err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	// CPU time of both ends per frame: on a shared machine the wall clock
	// says how busy the neighbours are, this says what a frame costs.
	b.ReportMetric(float64(cpuTime()-cpu0)/float64(total), "cpu-ns/op")
	c.Close()
	if err := <-served; err != nil {
		b.Fatal(err)
	}
}
