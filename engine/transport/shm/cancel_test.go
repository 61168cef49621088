package shm_test

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// watchCanary fails t if the canary byte shows up in b within d: a copy of
// the initiator's that ran after its tasks had ended.
func watchCanary(t *testing.T, b []byte, d time.Duration) {
	t.Helper()
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		if i := strings.IndexByte(string(b), canary); i >= 0 {
			t.Fatalf("byte %d of the owner's buffer changed after the initiator's tasks had ended", i)
		}
	}
}

// TestCancelMidBatchWrite: a batch of 64 x 1 MiB WRITEs canceled right after
// Submit. The jobs still queued end CANCELED at once; every task ends;
// completed ones left their bytes, and nothing the initiator's buffer holds
// afterwards reaches the owner.
func TestCancelMidBatchWrite(t *testing.T) {
	const n, size = 64, 1 << 20
	o := newOwner(t, n*size, nil)
	c := startInitiator(t, o.e.Name(), o.addr(), o.n(), nil)
	expectOK(t, c.do("write 0 4096 1"), "shm") // attached, key granted
	fill(o.buf, 0)
	var states string
	var intact int
	line := c.do("cancel write %d %d 171", n, size)
	if _, err := fmt.Sscanf(line, "ok %s %d", &states, &intact); err != nil || len(states) != n {
		t.Fatalf("initiator: %q", line)
	}
	if strings.Count(states, "x") == 0 {
		t.Fatalf("tasks %s: none was canceled", states)
	}
	if strings.Count(states, "f") != 0 {
		t.Fatalf("tasks %s: some failed", states)
	}
	for i, s := range states {
		blk := o.buf[i*size : (i+1)*size]
		switch s {
		case 'c':
			if j := firstNot(blk, 171); j >= 0 {
				t.Fatalf("completed write %d: byte %d is %#x", i, j, blk[j])
			}
		case 'x':
			for j, b := range blk {
				if b != 0 && b != 171 {
					t.Fatalf("canceled write %d: byte %d is %#x", i, j, b)
				}
			}
		}
	}
	watchCanary(t, o.buf, 200*time.Millisecond)
	t.Logf("tasks: %s", states)
}

// TestCancelMidBatchRead: the same with READs: completed ones brought the
// owner's bytes, and after Wait returned nothing lands in the initiator's
// buffer (it checks its canary for 200 ms).
func TestCancelMidBatchRead(t *testing.T) {
	const n, size = 64, 1 << 20
	o := newOwner(t, n*size, nil)
	c := startInitiator(t, o.e.Name(), o.addr(), o.n(), nil)
	expectOK(t, c.do("read 0 4096"), "shm")
	fill(o.buf, 0x3C)
	var states string
	var intact int
	line := c.do("cancel read %d %d %d", n, size, 0x3C)
	if _, err := fmt.Sscanf(line, "ok %s %d", &states, &intact); err != nil || len(states) != n {
		t.Fatalf("initiator: %q", line)
	}
	if strings.Count(states, "x") == 0 || strings.Count(states, "f") != 0 {
		t.Fatalf("tasks %s: want some canceled, none failed", states)
	}
	if intact != 1 {
		t.Fatal("a read landed in the initiator's buffer after its batch had ended")
	}
}

// TestCloseWithTasksInFlight: 512 WRITEs of 256 KiB in flight when the
// initiator's engine closes: Close returns with every task ended, and no
// copy runs after it.
func TestCloseWithTasksInFlight(t *testing.T) {
	const n, size = 512, 256 << 10
	o := newOwner(t, n*size, nil)
	c := startInitiator(t, o.e.Name(), o.addr(), o.n(), nil)
	expectOK(t, c.do("write 0 4096 1"), "shm")
	fill(o.buf, 0)
	var completed, ended, pending int
	line := c.do("closeall %d %d 90", n, size)
	if _, err := fmt.Sscanf(line, "ok %d %d %d", &completed, &ended, &pending); err != nil {
		t.Fatalf("initiator: %q", line)
	}
	if ended != n || pending != 0 {
		t.Fatalf("after Close: %d of %d tasks ended, %d pending", ended, n, pending)
	}
	watchCanary(t, o.buf, 200*time.Millisecond)
	t.Logf("%d of %d writes completed before Close", completed, n)
}
