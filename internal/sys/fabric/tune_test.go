package fabric

import (
	"slices"
	"testing"

	"github.com/ebitengine/purego"

	"github.com/tecache/te/internal/sys/sigkeep"
)

// cgetenv reads the C environment, which libfabric's providers read.
func cgetenv(t *testing.T, h uintptr, name string) (string, bool) {
	t.Helper()
	getenv, err := purego.Dlsym(h, "getenv")
	if err != nil {
		t.Fatal(err)
	}
	s, err := newScratch(256)
	if err != nil {
		t.Fatal(err)
	}
	defer s.free()
	p := callPtr(getenv, s.cstring(0, name))
	if p == 0 {
		return "", false
	}
	return gostring(p), true
}

// The provider defaults reach the C environment libfabric reads, and a
// value the operator set is left as it is.
func TestProviderDefaults(t *testing.T) {
	testLib(t) // skips where libfabric is not installed
	h, err := sigkeep.Dlopen(DefaultLibrary, purego.RTLD_NOW|purego.RTLD_GLOBAL)
	if err != nil {
		t.Fatal(err)
	}
	const unset, preset = "TE_TEST_FABRIC_DEFAULT_UNSET", "TE_TEST_FABRIC_DEFAULT_PRESET"
	if got := setDefaults(h, []ProviderDefault{{preset, "operator"}}); !slices.Equal(got, []string{preset + "=operator"}) {
		t.Fatalf("first setting: %v", got)
	}
	got := setDefaults(h, []ProviderDefault{{unset, "16"}, {preset, "te"}})
	if !slices.Equal(got, []string{unset + "=16"}) {
		t.Fatalf("set %v, want only %s", got, unset)
	}
	if v, ok := cgetenv(t, h, unset); !ok || v != "16" {
		t.Fatalf("%s = %q %v in the C environment", unset, v, ok)
	}
	if v, _ := cgetenv(t, h, preset); v != "operator" {
		t.Fatalf("%s = %q: te overwrote the operator's value", preset, v)
	}
	// Load set the real ones (unless this environment named them).
	l := testLib(t)
	for _, d := range ProviderDefaults {
		v, ok := cgetenv(t, h, d.Name)
		if !ok {
			t.Errorf("%s is not set after Load", d.Name)
		}
		if slices.Contains(l.Defaults, d.Name+"="+d.Value) && v != d.Value {
			t.Errorf("%s = %q, Load said it set %q", d.Name, v, d.Value)
		}
	}
}
