package handoff

// WindowOf returns the key of the window t granted over its blocks: what an
// engine that learned it (from a log, say) would hold.
func WindowOf(t *Transfer) uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.window
}
