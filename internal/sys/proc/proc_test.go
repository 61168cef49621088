package proc

import (
	"os/exec"
	"testing"
	"time"
)

func TestStopContinue(t *testing.T) {
	cmd := exec.Command("sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Skip(err)
	}
	defer cmd.Wait()
	defer cmd.Process.Kill()
	pid := cmd.Process.Pid
	if Stopped(pid) {
		t.Fatal("a running process reads as stopped")
	}
	if err := Stop(pid, 5*time.Second); err != nil || !Stopped(pid) {
		t.Fatalf("Stop = %v, stopped %v", err, Stopped(pid))
	}
	if err := Continue(pid); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for Stopped(pid) && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if Stopped(pid) {
		t.Fatal("still stopped after Continue")
	}
	if Stopped(1 << 30) {
		t.Fatal("a missing process reads as stopped")
	}
	if err := Stop(1<<30, time.Second); err == nil {
		t.Fatal("Stop of a missing process succeeded")
	}
}
