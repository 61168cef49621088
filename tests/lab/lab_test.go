package lab_test

import (
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/tecache/te/tests/lab"
)

const mib = 1 << 20

// two builds a lab of two hosts with a peer in each: a initiates, b is the
// target.
func two(t *testing.T, o lab.Options, size int, env ...string) (*lab.Lab, *peer, *peer) {
	t.Helper()
	o.Hosts = 2
	l := lab.New(t, o)
	a := startPeer(t, l.Hosts[0], size, env...)
	b := startPeer(t, l.Hosts[1], size, env...)
	return l, a, b
}

// check verifies a finished batch of bs-byte tasks from src into dst: no
// task is left PENDING or WAITING, and every COMPLETED one's bytes are in
// dst. It returns how many completed.
func check(t *testing.T, r batchResult, dst *peer, bs uint64) int {
	t.Helper()
	if r.State == "" || r.State == "PENDING" {
		t.Fatalf("batch did not end: %+v", r.Err)
	}
	done := 0
	for i, ts := range r.Tasks {
		switch ts.State {
		case "COMPLETED":
			if got := dst.crc(uint64(i)*bs, bs); got != ts.SrcCRC {
				t.Errorf("task %d COMPLETED but the target holds crc %08x, want %08x", i, got, ts.SrcCRC)
			}
			done++
		case "FAILED", "TIMEOUT":
		default:
			t.Errorf("task %d ended %s: %s", i, ts.State, ts.Err)
		}
	}
	return done
}

// transfer writes n bytes from a's buffer (a fresh pattern) into b's
// (zeroed first) and requires every task to complete with the bytes in
// place.
func transfer(t *testing.T, a, b *peer, seed int, n, bs uint64) batchResult {
	t.Helper()
	a.do(fmt.Sprintf("pattern %d", seed))
	b.do("fill 0")
	a.startWrite(b, n, bs)
	r := a.result(2 * time.Minute)
	if r.State != "COMPLETED" || r.Err != "" {
		t.Fatalf("batch ended %s: %s (%+v)", r.State, r.Err, summary(r))
	}
	if got, want := b.crc(0, n), a.crc(0, n); got != want {
		t.Fatalf("target holds crc %08x, initiator wrote %08x", got, want)
	}
	check(t, r, b, bs)
	return r
}

// summary counts a batch's tasks by state and error code.
func summary(r batchResult) map[string]int {
	m := map[string]int{}
	for _, ts := range r.Tasks {
		k := ts.State
		if ts.Code != "" {
			k += " (" + ts.Code + ")"
		}
		m[k]++
	}
	return m
}

func TestTwoHostsTransfer(t *testing.T) {
	_, a, b := two(t, lab.Options{}, 64*mib)
	r := transfer(t, a, b, 1, 64*mib, mib)
	t.Logf("64 MiB %s -> %s over tcp across the bridge in %d ms", a.host.Addr(0), b.host.Addr(0), r.ElapsedMS)
}

// progress is TE_PROGRESS_TIMEOUT for the fault tests; the transfer timeout
// is far longer, so the progress bound is what ends a stalled task.
const progress = 2 * time.Second

// slack is what a loaded two-core machine may add to it.
const slack = 8 * time.Second

var faultEnv = []string{"TE_PROGRESS_TIMEOUT=2s", "TE_TRANSFER_TIMEOUT=60s"}

// TestPartitionDuringBatch partitions the two hosts while a rate-limited
// batch is on the wire: every task ends FAILED or TIMEOUT (or COMPLETED
// with its bytes in place) within the progress timeout plus slack, and once
// the partition heals the same processes transfer again.
func TestPartitionDuringBatch(t *testing.T) {
	const n, bs = 32 * mib, mib // about 2.7 s at 100 Mbit
	l, a, b := two(t, lab.Options{RateMbit: 100}, n, faultEnv...)
	transfer(t, a, b, 1, mib, mib) // connections up
	a.do("pattern 2")
	b.do("fill 0")
	a.startWrite(b, n, bs)
	time.Sleep(500 * time.Millisecond)
	l.Partition([]int{0}, []int{1})
	t0 := time.Now()
	r := a.result(2 * time.Minute)
	took := time.Since(t0)
	t.Logf("partitioned: batch ended %s %v after %v (%d ms after submit)", r.State, summary(r), took, r.ElapsedMS)
	done := check(t, r, b, bs)
	if done == len(r.Tasks) {
		t.Fatalf("every task completed: the partition came after the batch")
	}
	if took > progress+slack {
		t.Errorf("tasks ended %v after the partition, want within %v + %v", took, progress, slack)
	}
	l.Heal()
	r = transfer(t, a, b, 3, 4*mib, mib)
	t.Logf("after heal: 4 MiB in %d ms", r.ElapsedMS)
}

// TestFrozenPeerAcrossHosts stops the target process mid-batch: the tasks
// end within the progress timeout plus slack as the peer unreachable (or
// TIMEOUT), and once it continues new batches succeed.
func TestFrozenPeerAcrossHosts(t *testing.T) {
	const n, bs = 32 * mib, mib // about 1.3 s at 200 Mbit
	_, a, b := two(t, lab.Options{RateMbit: 200}, n, faultEnv...)
	transfer(t, a, b, 1, mib, mib)
	a.do("pattern 2")
	b.do("fill 0")
	a.startWrite(b, n, bs)
	time.Sleep(300 * time.Millisecond)
	if err := b.proc.Freeze(); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	r := a.result(2 * time.Minute)
	took := time.Since(t0)
	t.Logf("frozen: batch ended %s %v after %v", r.State, summary(r), took)
	if err := b.proc.Thaw(); err != nil {
		t.Fatal(err)
	}
	done := check(t, r, b, bs)
	if done == len(r.Tasks) {
		t.Fatalf("every task completed: the freeze came after the batch")
	}
	if took > progress+slack {
		t.Errorf("tasks ended %v after the freeze, want within %v + %v", took, progress, slack)
	}
	for i, ts := range r.Tasks {
		if ts.State != "COMPLETED" && ts.Code != "peer unreachable" && ts.State != "TIMEOUT" {
			t.Errorf("task %d ended %s (%s): %s, want peer unreachable or TIMEOUT", i, ts.State, ts.Code, ts.Err)
		}
	}
	r = transfer(t, a, b, 3, 4*mib, mib)
	t.Logf("after thaw: 4 MiB in %d ms", r.ElapsedMS)
}

// TestPeerRestartedSameName kills the target mid-batch and starts it again
// on the same host and port, so under the same segment name, with its
// buffer elsewhere: the batch under way ends (none of its tasks reports
// bytes the dead process never got), and the next batch reaches the new
// process without restarting the initiator: the stale descriptor and
// the dead connections are replaced.
func TestPeerRestartedSameName(t *testing.T) {
	const n, bs = 32 * mib, mib
	port := strconv.Itoa(20000 + os.Getpid()%20000) // the lab's address is the test's own
	l, a, b := two(t, lab.Options{RateMbit: 200}, n, append(faultEnv, envPort+"="+port)...)
	transfer(t, a, b, 1, mib, mib)
	a.do("pattern 2")
	a.startWrite(b, n, bs)
	time.Sleep(300 * time.Millisecond)
	b.proc.Kill()
	t0 := time.Now()
	r := a.result(2 * time.Minute)
	took := time.Since(t0)
	t.Logf("killed: batch ended %s %v after %v", r.State, summary(r), took)
	if took > progress+slack {
		t.Errorf("tasks ended %v after the kill, want within %v + %v", took, progress, slack)
	}
	for i, ts := range r.Tasks {
		if ts.State == "PENDING" || ts.State == "WAITING" {
			t.Errorf("task %d left %s", i, ts.State)
		}
	}
	b2 := startPeer(t, l.Hosts[1], n+mib, append(faultEnv, envPort+"="+port)...)
	if b2.h.Segment != b.h.Segment {
		t.Fatalf("restarted as %s, was %s", b2.h.Segment, b.h.Segment)
	}
	r = transfer(t, a, b2, 3, 4*mib, mib)
	t.Logf("after restart: 4 MiB in %d ms", r.ElapsedMS)
}

// TestLinkDownUp pulls the target's cable mid-batch and plugs it back: the
// batch ends within the progress timeout plus slack, the next succeeds.
func TestLinkDownUp(t *testing.T) {
	const n, bs = 32 * mib, mib
	l, a, b := two(t, lab.Options{RateMbit: 100}, n, faultEnv...)
	transfer(t, a, b, 1, mib, mib)
	a.do("pattern 2")
	b.do("fill 0")
	a.startWrite(b, n, bs)
	time.Sleep(500 * time.Millisecond)
	l.LinkDown(1, 0)
	t0 := time.Now()
	r := a.result(2 * time.Minute)
	took := time.Since(t0)
	t.Logf("link down: batch ended %s %v after %v", r.State, summary(r), took)
	if check(t, r, b, bs) == len(r.Tasks) {
		t.Fatalf("every task completed: the link went down after the batch")
	}
	if took > progress+slack {
		t.Errorf("tasks ended %v after the link went down, want within %v + %v", took, progress, slack)
	}
	l.LinkUp(1, 0)
	transfer(t, a, b, 3, 4*mib, mib)
}

// TestRateLimitedLink measures a transfer over links shaped to 200 Mbit.
func TestRateLimitedLink(t *testing.T) {
	const rate = 200
	const n = 24 * mib // about 1 s
	_, a, b := two(t, lab.Options{RateMbit: rate}, n)
	transfer(t, a, b, 1, mib, mib)
	r := transfer(t, a, b, 2, n, mib)
	got := float64(n) * 8 / 1e6 / (float64(r.ElapsedMS) / 1000)
	t.Logf("%d MiB in %d ms: %.0f Mbit/s over a %d Mbit link", n/mib, r.ElapsedMS, got, rate)
	if got < 0.5*rate || got > 1.1*rate {
		t.Errorf("throughput %.0f Mbit/s, want within [%.0f, %.0f]", got, 0.5*rate, 1.1*rate)
	}
}
