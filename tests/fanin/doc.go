// Package fanin measures and checks what many peers cost one engine: a
// decode engine and many prefill engines, spread over child processes,
// each writing one block to the decode engine and then going idle, the
// shape of a decode engine fed by a prefill fleet.
//
// TestFanIn (in make test: 64 peers in two processes) checks that every
// block lands, that the decode side holds a bounded number of connections
// and descriptors per peer, and that an idle fleet's connections are
// reclaimed (the prefill engines' peer_idle_timeout) until the decode
// engine is back at its own baseline. TE_FANIN_PEERS and TE_FANIN_PROCS
// size it (bench/README.md, "1,000 peers": TE_FANIN_PEERS=1000
// TE_FANIN_PROCS=10); it logs memory, descriptors, goroutines and threads
// per peer on the decode side and the time from the go signal to each
// peer's completed write.
package fanin
