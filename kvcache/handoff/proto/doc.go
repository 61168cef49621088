// Package proto holds the wire types of the prefill-to-decode handoff: the
// JSON bodies and headers that te-sidecar's /handoff routes take and answer,
// the states a transfer goes through, and the notification a mover sends
// when it has finished. The client (package handoff, linked into libte) and
// the server (te-sidecar's rendezvous table) both import it, and neither
// imports the other: the library carries no HTTP server and no table.
package proto
