//go:build !race

package rendezvous_test

const raceEnabled = false
