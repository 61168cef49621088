package session

// SpreadOnAnyMachine makes Seal, Tags and ReadPayload spread the records
// of large payloads over workers whatever the number of cores, so that
// tests (and the race detector) run that path on a 2-core machine; it
// returns the function that restores the default.
func SpreadOnAnyMachine() (restore func()) {
	old := wideCores
	wideCores = 1
	return func() { wideCores = old }
}
