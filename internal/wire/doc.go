// Package wire holds te's wire formats (see spec.md): the control-plane frame
// shared with Mooncake's peer-to-peer handshake, te's call header, and the
// payloads carried in them. Decoders check every length before allocating and
// are fuzzed.
package wire
