package fabric_test

import (
	"testing"

	_ "github.com/tecache/te/engine/std" // the engines these tests build install every standard transport

	"github.com/tecache/te/engine"
	"github.com/tecache/te/engine/transport/fabric"
	"github.com/tecache/te/engine/transport/transporttest"
)

func TestMain(m *testing.M) { transporttest.Main(m) }

// requireProvider skips, with one line saying why, where libfabric or the
// provider is not installed; it returns the engine parameters that select
// the provider.
func requireProvider(t *testing.T, prov string) map[string]string {
	t.Helper()
	t.Setenv("FI_PROVIDER", prov)
	if _, err := fabric.Probe("127.0.0.1"); err != nil {
		t.Skipf("fabric over %s unavailable: %v", prov, err)
	}
	return map[string]string{"fabric.provider": prov}
}

// TestConformanceTCPInProcess runs the shared suite over libfabric's tcp
// provider (RDM over ofi_rxm) with both engines in this process, small
// slices so large transfers are many operations.
func TestConformanceTCPInProcess(t *testing.T) {
	p := requireProvider(t, "tcp")
	p["fabric.slice"] = "256KiB"
	transporttest.Run(t, transporttest.Setup{Transport: fabric.Name, Config: func(c *engine.Config) {
		c.Params = p
	}})
}
