//go:build race

package rendezvous_test

// raceEnabled: the race detector slows the sidecar about tenfold.
const raceEnabled = true
