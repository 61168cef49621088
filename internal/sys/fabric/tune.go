package fabric

import "github.com/ebitengine/purego"

// ProviderDefault is a libfabric provider parameter te sets for its process
// when the environment does not name it.
type ProviderDefault struct {
	Name, Value string
}

// ProviderDefaults are set before libfabric first initializes its providers
// (the first fi_getinfo reads their parameters), only where the variable is
// unset, so an operator's own setting always wins.
//
// ofi_rxm (RDM endpoints over the tcp and verbs providers) sizes every
// endpoint for two-sided messaging: a shared receive pool of 4096 bounce
// buffers of 16 KiB, written when the endpoint opens and again when a
// connection forms. That is about 70 MiB and up to a second per endpoint on a
// small host, and te opens one endpoint per peer. te moves bytes with one-sided
// RMA only, which rxm hands to the core provider without those buffers, so a
// small pool of small buffers is enough (rxm still exchanges its connection
// messages through them).
var ProviderDefaults = []ProviderDefault{
	{"FI_OFI_RXM_MSG_RX_SIZE", "16"},
	{"FI_OFI_RXM_BUFFER_SIZE", "2048"},
}

// setDefaults sets defs in the C environment (which libfabric reads with
// getenv; Go's os.Setenv does not reach it in a binary built without cgo)
// where they are unset, through the libc h reaches. It reports which it set.
func setDefaults(h uintptr, defs []ProviderDefault) []string {
	getenv, err1 := purego.Dlsym(h, "getenv")
	setenv, err2 := purego.Dlsym(h, "setenv")
	if err1 != nil || err2 != nil || getenv == 0 || setenv == 0 {
		return nil
	}
	// The strings go to C in memory the Go runtime does not manage.
	s, err := newScratch(4096)
	if err != nil {
		return nil
	}
	defer s.free()
	var set []string
	for _, d := range defs {
		name := s.cstring(0, d.Name)
		val := s.cstring(2048, d.Value)
		if callPtr(getenv, name) != 0 {
			continue
		}
		// overwrite=0: another thread's setting between the two calls
		// wins. setenv copies both strings.
		if call(setenv, name, val, 0) == 0 {
			set = append(set, d.Name+"="+d.Value)
		}
	}
	return set
}
