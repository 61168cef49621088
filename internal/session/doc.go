// Package session protects every frame of a connection after the peer
// authentication exchange (internal/peerauth): the record layer of
// internal/wire/spec.md, "Authenticated sessions".
//
// The exchange proves that both ends hold the cluster secret, but proves it
// for the opening only: a party on the path (or one that relays the exchange
// between two honest engines) could otherwise inject, alter, replay or drop
// the frames that follow. New derives two keys from the secret and the
// exchange's whole transcript (both nonces, both instance ids, the chosen
// key, the session mode, the channel), one per direction, and every frame
// after the exchange travels as records sealed with AES-128-GCM under them:
//
//   - a frame's fixed header (the control plane's frame and call header; the
//     data path's request and completion headers: opcode, id, address,
//     length, key) is one record, opened before any field of it is used;
//   - a control body is records of at most RecordSize bytes;
//   - a data payload is records too in Integrity mode (the default: the
//     plaintext and a GMAC tag per record, checked before any byte of it
//     reaches the receiver's memory) and in Encryption mode; it crosses in
//     the clear, unauthenticated, only in Headers mode, an explicit
//     opt-out.
//
// Each record consumes the next value of a per-direction sequence number
// that is never sent: it is part of the nonce, so a record that is dropped,
// replayed, reordered, moved to the other direction or to another
// connection fails to open. In Headers and Integrity modes a record is
// its plaintext followed by a 16-byte GMAC tag; in Encryption mode it is
// the AES-GCM ciphertext and tag. Both are the same size, so framing code is the same
// in both modes.
//
// A Session is one Sealer (the sending direction) and one Opener (the
// receiving one). Neither is safe for concurrent use: the connection's one
// writer (or whoever holds its write lock) seals in the order the bytes go
// out, and its one reader opens in the order they come in. A nil *Sealer and
// a nil *Opener stand for a connection without a session (no secret): they
// pass bytes through unchanged, so one framing serves both cases.
//
// Framing code calls, per connection: Seal (a header, a small body) and
// WriteBody or WritePayload on the writing side; ReadRecord (a header),
// ReadBody, DiscardBody, ReadPayload or DiscardPayload on the reading
// side. A payload produced or consumed in pieces of other sizes (device
// memory staged through host chunks) goes through StartPayload and
// WritePiece or ReadPiece, which put exactly the same records on the wire.
// In Integrity mode a sender may instead send a payload's records from
// where they lie, each followed by its tag from Tags (one writev, no copy).
//
// Cost: the payload MAC is GMAC and Encryption is AES-128-GCM, as
// crypto/cipher computes them. crypto/cipher hashes additional data one
// block at a time and encrypts four blocks at a time; on CPUs with AVX-512
// VAES and VPCLMULQDQ (Intel Ice Lake and later, AMD Zen 4 and later),
// outside Go's FIPS 140 mode, te computes records of 256 bytes or more
// 16 or 32 blocks at a time (ghash_amd64.s, aesctr_amd64.s: 2.5-3x as fast
// per 64 KiB record). The
// bytes are crypto/cipher's, so engines with and without the vector path
// interoperate. BLAKE3, HighwayHash and Poly1305 were measured slower than
// either GMAC (bench/README.md, "Payload integrity"). ReadPayload reads up to
// ReadRecords records at once and checks them while they are in cache,
// before it copies any of them out. Records are independent (each has its
// own nonce), so on a machine of four cores or more Seal and Tags seal or
// tag the records of a payload of two records or more on several cores,
// and ReadPayload opens a read's records on several cores; with fewer
// cores the other end or another connection has the other core busy, and
// spreading only added CPU.
//
// An Opener that fails once stays failed (the stream cannot be trusted any
// more): every later call returns the same error, errs.Unauthenticated for
// a record that does not open, errs.Protocol for a malformed one, and the
// caller closes the connection. No plaintext is returned, or copied into the
// caller's memory, before its record's tag was checked.
package session
