package engine_test

import (
	"bufio"
	"net"
	"testing"
	"time"

	"github.com/tecache/te/internal/peerauth"
	"github.com/tecache/te/internal/wire"
)

// BenchmarkControlCall measures control-plane round trips with and without a
// cluster secret, in the same run. "call" is a Probe on the pooled,
// established connection: authentication is per connection, so the two
// should match. "connect" opens a connection per operation (dial, the
// authentication exchange, one Probe, close): the per-connection cost.
func BenchmarkControlCall(b *testing.B) {
	for _, mode := range []string{"nosecret", "secret"} {
		var secret string
		var s *peerauth.Secret
		if mode == "secret" {
			secret = secretA
			s, _ = peerauth.ParseSecret(secretA)
		}
		tg := newEngine(b, withSecret(secret))
		a := newEngine(b, withSecret(secret))
		b.Run("call/"+mode, func(b *testing.B) {
			if _, err := a.Probe(tg.Name()); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if _, err := a.Probe(tg.Name()); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run("connect/"+mode, func(b *testing.B) {
			probe := wire.AppendFrame(nil, wire.KindProbe, wire.AppendCall(nil, 1, wire.FlagRequest, nil))
			for i := 0; i < b.N; i++ {
				c, err := net.Dial("tcp", tg.RPCAddr())
				if err != nil {
					b.Fatal(err)
				}
				if _, err := peerauth.Client(c, s, "bench", time.Now().Add(5*time.Second)); err != nil {
					b.Fatal(err)
				}
				c.Write(probe)
				if _, _, err := wire.ReadFrame(bufio.NewReader(c), 1<<16); err != nil {
					b.Fatal(err)
				}
				c.Close()
			}
		})
	}
}
