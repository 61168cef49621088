package tcp_test

import (
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tecache/te/engine"
	"github.com/tecache/te/internal/sys/mem"
)

// rawTCP measures plain loopback TCP with conns connections moving block-sized
// writes for d: the physical reference the transport is reported against.
// Each side rotates through span/conns bytes of pre-faulted mmap memory, as
// much memory as the transfer it is compared to touches.
func rawTCP(b *testing.B, block, span, conns int, d time.Duration) float64 {
	per := max(block, span/conns/block*block)
	var bufs [][]byte
	defer func() {
		for _, buf := range bufs {
			mem.Free(buf)
		}
	}()
	for i := 0; i < 2*conns; i++ {
		buf, err := mem.Alloc(per)
		if err != nil {
			b.Fatal(err)
		}
		for j := 0; j < per; j += 4096 {
			buf[j] = 1
		}
		bufs = append(bufs, buf)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	var wg sync.WaitGroup
	var clients, servers []net.Conn
	for i := 0; i < conns; i++ {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			b.Fatal(err)
		}
		s, err := ln.Accept()
		if err != nil {
			b.Fatal(err)
		}
		clients, servers = append(clients, c), append(servers, s)
	}
	for i, nc := range servers {
		wg.Add(1)
		go func(nc net.Conn, buf []byte) {
			defer wg.Done()
			defer nc.Close()
			for off := 0; ; off += block {
				if off+block > len(buf) {
					off = 0
				}
				if _, err := io.ReadFull(nc, buf[off:off+block]); err != nil {
					return
				}
			}
		}(nc, bufs[conns+i])
	}
	var total int64
	var mu sync.Mutex
	var cw sync.WaitGroup
	start := time.Now()
	for i, nc := range clients {
		cw.Add(1)
		go func(nc net.Conn, buf []byte) {
			defer cw.Done()
			var n int64
			for off := 0; time.Since(start) < d; off += block {
				if off+block > len(buf) {
					off = 0
				}
				if _, err := nc.Write(buf[off : off+block]); err != nil {
					break
				}
				n += int64(block)
			}
			mu.Lock()
			total += n
			mu.Unlock()
		}(nc, bufs[i])
	}
	cw.Wait()
	el := time.Since(start)
	for _, nc := range clients {
		nc.Close()
	}
	wg.Wait()
	return float64(total) / el.Seconds() / 1e9
}

// syscalls returns the read and write syscalls this process made so far
// (Linux /proc/self/io), or -1.
func syscalls() int64 {
	b, err := os.ReadFile("/proc/self/io")
	if err != nil {
		return -1
	}
	var n int64
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ": ")
		if ok && (k == "syscr" || k == "syscw") {
			x, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil {
				return -1
			}
			n += x
		}
	}
	return n
}

// BenchmarkTransfer moves batches of 128 blocks between two engines of this
// process over tcp and reports GB/s and the ratio to raw loopback TCP with the
// same connection count, block size and memory footprint, measured in the
// same run.
func BenchmarkTransfer(b *testing.B) {
	const batch = 128
	for _, op := range []engine.Opcode{engine.Read, engine.Write} {
		for _, block := range []int{4 << 10, 64 << 10, 1 << 20} {
			b.Run(fmt.Sprintf("%v/%dKiB", op, block>>10), func(b *testing.B) {
				tg := newEngine(&testing.T{}, "", nil)
				defer tg.Close()
				e := newEngine(&testing.T{}, "", nil)
				defer e.Close()
				size := block * batch
				rbuf, _ := mem.Alloc(size)
				lbuf, _ := mem.Alloc(size)
				defer mem.Free(rbuf)
				defer mem.Free(lbuf)
				if err := tg.RegisterMemory(mem.Addr(rbuf), uint64(size), "cpu:0", true); err != nil {
					b.Fatal(err)
				}
				if err := e.RegisterMemory(mem.Addr(lbuf), uint64(size), "cpu:0", false); err != nil {
					b.Fatal(err)
				}
				seg, err := e.OpenSegment(tg.Name())
				if err != nil {
					b.Fatal(err)
				}
				reqs := make([]engine.Request, batch)
				for i := range reqs {
					off := uint64(i * block)
					reqs[i] = engine.Request{Op: op, Local: mem.Addr(lbuf) + off, Segment: seg, Remote: mem.Addr(rbuf) + off, Length: uint64(block)}
				}
				b.SetBytes(int64(size))
				b.ResetTimer()
				sys0 := syscalls()
				start := time.Now()
				for i := 0; i < b.N; i++ {
					bt, _ := e.AllocateBatch(batch)
					if err := bt.Submit(reqs...); err != nil {
						b.Fatal(err)
					}
					if st, err := bt.Wait(time.Minute); err != nil || st.State != engine.Completed {
						b.Fatal(st, err)
					}
					bt.Free()
				}
				el := time.Since(start)
				sys1 := syscalls()
				b.StopTimer()
				gbps := float64(b.N*size) / el.Seconds() / 1e9
				ref := rawTCP(b, block, size, 2, 300*time.Millisecond)
				b.ReportMetric(gbps, "GB/s")
				b.ReportMetric(gbps/ref, "x_raw_tcp")
				b.ReportMetric(float64(b.N*batch)/el.Seconds(), "req/s")
				if sys0 >= 0 && sys1 >= 0 {
					// Both sides are in this process: read and write
					// syscalls of initiator and target together.
					b.ReportMetric(float64(sys1-sys0)/float64(b.N*batch), "syscalls/req")
				}
			})
		}
	}
}
