package storetest

import (
	"context"
	"io"
	"net"
	"testing"
	"time"

	"github.com/tecache/te/engine/meta"
)

// LoopbackRTT measures the physical reference for a metadata request: the
// round trip of a 64-byte message over a loopback TCP connection, median of
// n tries.
func LoopbackRTT(tb testing.TB, n int) time.Duration {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		io.Copy(c, c)
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		tb.Fatal(err)
	}
	defer c.Close()
	buf := make([]byte, 64)
	ds := make([]time.Duration, n)
	for i := range ds {
		t0 := time.Now()
		c.Write(buf)
		if _, err := io.ReadFull(c, buf); err != nil {
			tb.Fatal(err)
		}
		ds[i] = time.Since(t0)
	}
	return median(ds)
}

func median(ds []time.Duration) time.Duration {
	for i := 1; i < len(ds); i++ {
		for j := i; j > 0 && ds[j] < ds[j-1]; j-- {
			ds[j], ds[j-1] = ds[j-1], ds[j]
		}
	}
	return ds[len(ds)/2]
}

// BenchGet measures Get of a descriptor-sized value (4 KiB) from s and
// reports it as a ratio to the loopback round trip measured in the same run
// (x-loopback-rtt).
func BenchGet(b *testing.B, s meta.Store) {
	ctx := context.Background()
	v := make([]byte, 4096)
	for i := range v {
		v[i] = 'a' + byte(i%26)
	}
	if err := s.Put(ctx, meta.KeyRAM("bench"), v); err != nil {
		b.Fatal(err)
	}
	rtt := LoopbackRTT(b, 2000)
	b.SetBytes(int64(len(v)))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := s.Get(ctx, meta.KeyRAM("bench")); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	per := b.Elapsed() / time.Duration(b.N)
	b.ReportMetric(float64(rtt.Nanoseconds()), "loopback-rtt-ns")
	b.ReportMetric(float64(per)/float64(rtt), "x-loopback-rtt")
}
