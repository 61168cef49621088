// Package tebench is te-bench: a target that serves registered memory, an
// initiator that moves blocks to or from it and reports GB/s, requests/s and
// batch latency, and a loopback mode that runs both (the target as a child
// process). Every run also measures, in the same processes, the physical
// references it is compared to: raw loopback TCP with the same number of
// connections and block size, and memcpy bandwidth.
//
// The te-bench command (bench/te-bench) is a thin wrapper around Main.
package tebench
