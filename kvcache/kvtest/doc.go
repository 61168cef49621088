// Package kvpattern builds vLLM-shaped KV caches in real (mmap'ed) memory,
// fills blocks with a pattern that depends on (layer, K/V, source block,
// byte), and checks a destination cache byte for byte against it. The
// handoff tests, benchmark and demo use it on both sides of a transfer; it
// computes addresses from the documented vLLM shape itself, not through
// package kvcache, so that a planning mistake shows as a mismatch.
package kvtest
