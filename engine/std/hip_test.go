package std_test

import (
	"os"
	"strings"
	"testing"

	"github.com/tecache/te/engine"
	_ "github.com/tecache/te/engine/std"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/sys/hip"
	"github.com/tecache/te/internal/sys/mem"
)

// TestEngineRefusesHipWithoutGPU registers a range as hip:0 in an engine on
// a machine with Debian's HIP runtime and no AMD GPU: NotSupported naming
// the cause, and the engine goes on (host memory still registers).
func TestEngineRefusesHipWithoutGPU(t *testing.T) {
	if _, err := os.Stat("/dev/kfd"); err == nil {
		t.Skip("/dev/kfd exists: this machine may have an AMD GPU")
	}
	t.Setenv(hip.EnvLibrary, "libamdhip64.so.5") // Debian's libamdhip64-5
	e, err := engine.New(engine.Config{ListenAddr: "127.0.0.1:0", Hostname: "127.0.0.1", Transports: []string{"tcp"}})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	b, err := mem.Alloc(1 << 16)
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Free(b)
	err = e.RegisterMemory(mem.Addr(b), 4096, "hip:0", true)
	if errs.CodeOf(err) != errs.NotSupported || !strings.Contains(err.Error(), "hip:0") || !strings.Contains(err.Error(), "AMD GPU") {
		t.Fatalf("hip:0 without an AMD GPU: %v", err)
	}
	if err := e.RegisterMemory(mem.Addr(b), 4096, "cpu:0", true); err != nil {
		t.Fatalf("host memory after the refusal: %v", err)
	}
}
