package cudaipc_test

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/tecache/te/internal/sys/cuda/cudatest"
)

// TestUnregisterOutlastedBySlowCopies replays the interleaving behind a
// SIGSEGV in the driver's copy seen under load: the conformance case
// "UnregisterInFlight" unregisters local memory while cudaipc copies into
// it. The fake driver makes every copy take 150 ms (FAKECUDA_COPY_DELAY_US)
// and TE_RPC_TIMEOUT bounds UnregisterMemory's wait to about a second, so
// UnregisterMemory returns Timeout with copies still in flight, as the
// contract allows (the range stays registered; retry). The suite used to
// fail there and free the memory on its way out, under the copies: the
// process died in cuMemcpyAsync. The case runs in a process of its own,
// which must pass, having retried, without a crash.
func TestUnregisterOutlastedBySlowCopies(t *testing.T) {
	if err := cudaReady(); err != nil {
		t.Skipf("no CUDA runtime and no fake: %v", err)
	}
	if !cudatest.Fake() {
		t.Skip("needs the fake driver's copy delay")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestConformance$/^cuda$/^UnregisterInFlight$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), "FAKECUDA_COPY_DELAY_US=150000", "TE_RPC_TIMEOUT=1s", "GOTRACEBACK=single")
	out, err := cmd.CombinedOutput()
	s := string(out)
	if strings.Contains(s, "SIGSEGV") || strings.Contains(s, "signal arrived during cgo execution") {
		t.Fatalf("the case crashed: memory was freed under a copy:\n%s", tail(s, 4000))
	}
	if err != nil || !strings.Contains(s, "--- PASS: TestConformance/cuda/UnregisterInFlight") {
		t.Fatalf("the case did not pass (%v):\n%s", err, tail(s, 4000))
	}
	// The interleaving happened: an unregister gave up with copies in
	// flight before one succeeded.
	if !strings.Contains(s, "(retrying)") {
		t.Fatalf("no unregister timed out under the slow copies, so nothing was checked:\n%s", tail(s, 4000))
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}
