package rendezvous_test

import (
	"github.com/tecache/te/kvcache/handoff/proto"

	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tecache/te/cmd/te-sidecar/rendezvous"
	"github.com/tecache/te/cmd/te-sidecar/sidecar"
	"github.com/tecache/te/internal/authsecret"
	"github.com/tecache/te/internal/errs"
)

// TestJunkCannotLockOut: 65,536 declarations that never pair, from one
// client, with the default bounds: that client is refused once over its
// quota (429, ResourceExhausted), the table is never full for the others,
// and a real transfer from another client pairs.
func TestJunkCannotLockOut(t *testing.T) {
	tb := rendezvous.NewTable(rendezvous.Config{}, nil)
	defer tb.Close()
	// Long-lived: none may expire on a slow machine while the loop runs.
	d := decl(t, "", []int{1}, proto.Push, 600000)
	var ok, refused int
	for i := range 1 << 16 {
		d.ID = fmt.Sprint("junk-", i)
		_, e := tb.Declare(proto.Decode, d, "10.0.0.9")
		switch {
		case e == nil:
			ok++
		case e.Status == http.StatusTooManyRequests && e.Code == errs.ResourceExhausted:
			refused++
		default:
			t.Fatalf("junk %d: %+v", i, e)
		}
	}
	if ok != 4096 || refused != 1<<16-4096 {
		t.Fatalf("junk: %d accepted, %d refused; want 4096 and the rest", ok, refused)
	}
	d.ID = "real"
	r, e := tb.Declare(proto.Decode, d, "10.0.0.7")
	if e != nil {
		t.Fatalf("a real expect from another client: %+v", e)
	}
	p, e := tb.Declare(proto.Prefill, decl(t, "real", []int{3}, "", 0), "10.0.0.8")
	if e != nil || p.State != proto.Transferring || r.Capability == "" {
		t.Fatalf("pairing: %+v %+v", p, e)
	}
	if u := tb.Usage(); u.Transfers != 4097 || u.Clients != 3 {
		t.Fatalf("usage %+v", u)
	}
}

// TestFullTableEvictsTheHeaviest: when the table is full, a client under
// its share gets room by evicting the oldest unpaired transfer of the
// client holding the most; the evicted transfer expires, settled, with
// ResourceExhausted. Nothing is evicted for the heaviest client itself.
func TestFullTableEvictsTheHeaviest(t *testing.T) {
	tb := rendezvous.NewTable(rendezvous.Config{MaxTransfers: 10, ClientTransfers: 6}, nil)
	defer tb.Close()
	d := decl(t, "", []int{1}, proto.Push, 0)
	declare := func(id, client string) (proto.Record, *rendezvous.Refusal) {
		d.ID = id
		return tb.Declare(proto.Decode, d, client)
	}
	var first proto.Record
	for i := range 6 {
		r, e := declare(fmt.Sprint("a", i), "a")
		if e != nil {
			t.Fatal(e)
		}
		if i == 0 {
			first = r
		}
	}
	for i := range 4 {
		if _, e := declare(fmt.Sprint("b", i), "b"); e != nil {
			t.Fatal(e)
		}
	}
	// Full: "a" (6 unpaired) is refused its quota anyway, "b" (4) gets no
	// room from "a" for itself only when it would hold more than "a".
	if _, e := declare("a6", "a"); e == nil || e.Status != 429 {
		t.Fatalf("a over its quota: %+v", e)
	}
	if _, e := declare("b4", "b"); e != nil {
		t.Fatalf("b under a's holding: %+v", e)
	}
	// "c" holds nothing: room is made at a's expense again.
	if _, e := declare("c0", "c"); e != nil {
		t.Fatalf("c: %+v", e)
	}
	// The table was full by count: the evicted transfers are gone, and
	// their sides learn it (404: the client reports TransferLost).
	if _, e := tb.Status("a0", first.Capability, ""); e == nil || e.Status != 404 {
		t.Fatalf("evicted transfer: %+v", e)
	}
	if u := tb.Usage(); u.Transfers != 10 {
		t.Fatalf("usage %+v", u)
	}
	// Paired transfers are never evicted: a table full of live transfers
	// refuses with 503.
	tb2 := rendezvous.NewTable(rendezvous.Config{MaxTransfers: 2}, nil)
	defer tb2.Close()
	for _, id := range []string{"p0", "p1"} {
		tb2.Declare(proto.Decode, decl(t, id, []int{1}, proto.Push, 0), "x")
		tb2.Declare(proto.Prefill, decl(t, id, []int{1}, "", 0), "y")
	}
	if _, e := tb2.Declare(proto.Decode, decl(t, "p2", []int{1}, proto.Push, 0), "z"); e == nil || e.Status != 503 || e.Code != errs.ResourceExhausted {
		t.Fatalf("full of live transfers: %+v", e)
	}
}

// TestByteBudgets: declarations are charged by size, per client and in
// total, and released when their transfer ends.
func TestByteBudgets(t *testing.T) {
	blocks := make([]int, 1000)
	for i := range blocks {
		blocks[i] = i
	}
	one := decl(t, "", blocks, proto.Push, 0)
	one.Layout = layout(t, 1000, 1<<30)
	one.ID = "xx" // every id below has two bytes
	cost := rendezvous.Cost(&one)
	tb := rendezvous.NewTable(rendezvous.Config{ClientBytes: 3*cost + 10, MaxBytes: 4*cost + 10}, nil)
	defer tb.Close()
	var a0 proto.Record
	for i := range 4 {
		one.ID = fmt.Sprint("a", i)
		r, e := tb.Declare(proto.Decode, one, "a")
		if i == 0 {
			a0 = r
		}
		if (i < 3) != (e == nil) || e != nil && e.Status != 429 {
			t.Fatalf("a%d: %+v", i, e)
		}
	}
	one.ID = "b0"
	b0, e := tb.Declare(proto.Decode, one, "b")
	if e != nil {
		t.Fatal(e)
	}
	one.ID = "b1"
	if _, e := tb.Declare(proto.Decode, one, "b"); e != nil {
		t.Fatalf("b1 evicts from a: %+v", e)
	}
	// Evicted for bytes, the transfer stays queryable: its side learns why.
	r, e := tb.Status("a0", a0.Capability, "")
	if e != nil || r.State != proto.Expired || !r.Settled || errs.Code(r.Code) != errs.ResourceExhausted || !strings.Contains(r.Reason, "evicted") {
		t.Fatalf("evicted transfer: %+v %+v", r, e)
	}
	if u := tb.Usage(); u.Bytes != 4*cost {
		t.Fatalf("held %d bytes, want %d", u.Bytes, 4*cost)
	}
	if _, e := tb.Abort(proto.Abort{ID: "b0"}, b0.Capability); e != nil {
		t.Fatal(e)
	}
	if u := tb.Usage(); u.Bytes != 3*cost {
		t.Fatalf("after an abort: held %d bytes, want %d", u.Bytes, 3*cost)
	}
}

// TestQuotaOverHTTP: a quota is kept per identity the caller cannot
// choose per request. A flood with the cluster token under rotating
// X-Te-Client names, from 127.0.0.1 and 127.0.0.2, is one client (the local
// host) and is refused with 429 past its quota, counted in /metrics; a
// client with its own client token is another client and declares and
// pairs; a client token presented for another name is refused (401).
func TestQuotaOverHTTP(t *testing.T) {
	sec, err := authsecret.Parse("quota-test-cluster-secret-000001")
	if err != nil {
		t.Fatal(err)
	}
	s := startWith(t, sidecar.Config{Secret: sec, Handoff: rendezvous.Config{ClientTransfers: 50}})
	bearer := func(tok string) []string { return []string{"Authorization", "Bearer " + tok} }
	other := &http.Client{Transport: &http.Transport{DialContext: (&net.Dialer{
		LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}, Timeout: 5 * time.Second}).DialContext}}
	defer other.CloseIdleConnections()
	hc := s.hc
	var ok, refused int
	for i := range 200 {
		s.hc = []*http.Client{hc, other}[i%2]
		hdr := append(bearer(sec.Token()), proto.ClientHeader, fmt.Sprint("junk-", i))
		code, b := s.do("POST", "/handoff/expect", decl(t, fmt.Sprint("junk", i), []int{1}, proto.Push, 0), hdr...)
		switch code {
		case 200:
			ok++
		case 429:
			refused++
			if !strings.Contains(string(b), `"code":24`) || !strings.Contains(string(b), "host:local") {
				t.Fatalf("429 body %s", b)
			}
		default:
			t.Fatalf("junk %d: %d %s", i, code, b)
		}
	}
	s.hc = hc
	if ok != 50 || refused != 150 {
		t.Fatalf("%d accepted, %d refused", ok, refused)
	}
	dec := append(bearer(sec.ClientToken("decode-0")), proto.ClientHeader, "decode-0")
	pre := append(bearer(sec.ClientToken("prefill-0")), proto.ClientHeader, "prefill-0")
	d := s.ok("POST", "/handoff/expect", decl(t, "real", []int{1}, proto.Push, 0), dec...)
	p := s.ok("POST", "/handoff/ready", decl(t, "real", []int{2}, "", 0), pre...)
	if p.State != proto.Transferring || d.Capability == "" {
		t.Fatalf("real transfer: %+v", p)
	}
	// decode-0's token does not make another name.
	forged := append(bearer(sec.ClientToken("decode-0")), proto.ClientHeader, "decode-1")
	if code, b := s.do("POST", "/handoff/expect", decl(t, "forged", []int{1}, proto.Push, 0), forged...); code != 401 {
		t.Fatalf("a client token under another name: %d %s", code, b)
	}
	_, m := s.do("GET", "/metrics", nil)
	for _, want := range []string{`te_handoff_rejected_total{reason="client_quota"} 150`, `te_handoff_clients 3`,
		`te_sidecar_refused_total{reason="unauthenticated"} 1`} {
		if !strings.Contains(string(m), want) {
			t.Errorf("metrics lack %q", want)
		}
	}
}

// TestPairingIsNotEvicted: room made for a pairing declaration never comes
// from the transfer it pairs.
func TestPairingIsNotEvicted(t *testing.T) {
	d := decl(t, "r1", []int{1}, proto.Push, 0)
	cost := rendezvous.Cost(&d)
	tb := rendezvous.NewTable(rendezvous.Config{MaxBytes: 3*cost + 10}, nil)
	defer tb.Close()
	r1, e := tb.Declare(proto.Decode, d, "a")
	if e != nil {
		t.Fatal(e)
	}
	d.ID = "r2"
	r2, e := tb.Declare(proto.Decode, d, "a")
	if e != nil {
		t.Fatal(e)
	}
	d.ID = "r3"
	if _, e := tb.Declare(proto.Decode, d, "b"); e != nil {
		t.Fatal(e)
	}
	p, e := tb.Declare(proto.Prefill, decl(t, "r1", []int{2}, "", 0), "c")
	if e != nil || p.State != proto.Transferring {
		t.Fatalf("pairing r1: %+v %+v", p, e)
	}
	if r, e := tb.Status("r1", r1.Capability, ""); e != nil || r.State != proto.Transferring {
		t.Fatalf("r1: %+v %+v", r, e)
	}
	if r, e := tb.Status("r2", r2.Capability, ""); e != nil || r.State != proto.Expired || errs.Code(r.Code) != errs.ResourceExhausted {
		t.Fatalf("r2 should have made the room: %+v %+v", r, e)
	}
}

// TestNameRotation: a holder of the cluster token declares 66,000 unpaired
// transfers (8,000 under the race detector: still twice the quota), each
// under a new X-Te-Client name, over 4 pipelined connections. The
// names do not split its quota (it is the local host): 4096 are held, the
// rest refused with 429. A legitimate decode and prefill with their client
// tokens still declare and pair, and a legitimate client under its host
// identity is refused only its own quota.
func TestNameRotation(t *testing.T) {
	if testing.Short() {
		t.Skip("66,000 requests")
	}
	sec, err := authsecret.Parse("rotation-test-cluster-secret-001")
	if err != nil {
		t.Fatal(err)
	}
	// A pipelined batch is written while the sidecar reads it: on a
	// loaded machine the writer can stall longer than the default 2 s
	// header timeout between two requests of a batch (a 408 that says
	// nothing about quotas), so the flood gets a minute.
	s := startWith(t, sidecar.Config{Secret: sec, HeaderTimeout: time.Minute})
	const workers, batch = 4, 200
	total := 66000
	if raceEnabled {
		total = 8000
	}
	// Long-lived declarations: none may expire while the flood runs.
	body, err := json.Marshal(decl(t, "ID_PLACEHOLDER", []int{1}, proto.Push, 600000))
	if err != nil {
		t.Fatal(err)
	}
	addr := strings.TrimPrefix(s.base, "http://")
	var ok, quota atomic.Int64
	var wg sync.WaitGroup
	errc := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Raw HTTP/1.1, pipelined in batches: the test measures the
			// sidecar, not an HTTP client.
			c, err := net.Dial("tcp", addr)
			if err != nil {
				errc <- err
				return
			}
			defer c.Close()
			br := bufio.NewReader(c)
			for first := w * batch; first < total; first += workers * batch {
				var out bytes.Buffer
				n := min(batch, total-first)
				for i := first; i < first+n; i++ {
					b := bytes.Replace(body, []byte("ID_PLACEHOLDER"), []byte(fmt.Sprint("junk-", i)), 1)
					fmt.Fprintf(&out, "POST /handoff/expect HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n%s: rotating-%d\r\n"+
						"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", sec.Token(), proto.ClientHeader, i, len(b), b)
				}
				c.SetDeadline(time.Now().Add(2 * time.Minute))
				if _, err := c.Write(out.Bytes()); err != nil {
					errc <- err
					return
				}
				for range n {
					resp, err := http.ReadResponse(br, nil)
					if err != nil {
						errc <- err
						return
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					switch resp.StatusCode {
					case 200:
						ok.Add(1)
					case 429:
						quota.Add(1)
					default:
						errc <- fmt.Errorf("status %d", resp.StatusCode)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	if ok.Load() != 4096 || quota.Load() != int64(total-4096) {
		t.Fatalf("%d accepted, %d refused with 429; want 4096 and the rest", ok.Load(), quota.Load())
	}
	if u := s.svc.Usage(); u.Transfers != 4096 || u.Clients != 1 {
		t.Fatalf("usage %+v", u)
	}
	dec := []string{"Authorization", "Bearer " + sec.ClientToken("decode-0"), proto.ClientHeader, "decode-0"}
	pre := []string{"Authorization", "Bearer " + sec.ClientToken("prefill-0"), proto.ClientHeader, "prefill-0"}
	d := s.ok("POST", "/handoff/expect", decl(t, "legit", []int{1, 2}, proto.Push, 0), dec...)
	p := s.ok("POST", "/handoff/ready", decl(t, "legit", []int{3, 4}, "", 0), pre...)
	if p.State != proto.Transferring || p.Peer == nil || d.Capability == "" {
		t.Fatalf("legitimate transfer: %+v", p)
	}
	s.ok("POST", "/handoff/complete", proto.Complete{ID: "legit", OK: true, Bytes: 4096}, append(pre, cp(p.Capability)...)...)
	if r := s.ok("GET", "/handoff/status?id=legit", nil, append(dec, cp(d.Capability)...)...); r.State != proto.Done || !r.Settled {
		t.Fatalf("legitimate transfer after completion: %+v", r)
	}
}
