package session

import (
	"slices"

	"github.com/tecache/te/internal/errs"
)

// Sealer seals what one end sends. A nil *Sealer passes bytes through (a
// connection without a session). Not safe for concurrent use: seal in the
// order the bytes are written.
type Sealer struct {
	d       direction
	err     error
	scratch []byte // one sealed record, for streams (allocated on first use)
	tag     [TagSize]byte
	pay     payloadState
	keys    []recordKey // the records of one Seal or Tags call
	job     sealJob
}

// Opener opens what one end receives. A nil *Opener passes bytes through.
// Not safe for concurrent use: open in the order the bytes were read. Once
// a call failed, every later call fails with the same error.
type Opener struct {
	d       direction
	err     error
	scratch []byte // ReadRecords sealed records, for streams (allocated on first use)
	pay     payloadState
	keys    []recordKey // the records of one group (records)
	job     openJob
	check   [TagSize]byte // scratch of Open's check
}

// Mode returns the session's mode; 0 for a nil Sealer.
func (s *Sealer) Mode() Mode {
	if s == nil {
		return 0
	}
	return s.d.mode
}

// Mode returns the session's mode; 0 for a nil Opener.
func (o *Opener) Mode() Mode {
	if o == nil {
		return 0
	}
	return o.d.mode
}

// Size is the wire size of n bytes sealed with Seal: n plus a tag per
// record; n for a nil Sealer.
func (s *Sealer) Size(n uint64) uint64 {
	if s == nil {
		return n
	}
	return SealedSize(n)
}

// Size is the wire size of n bytes sealed as records: n plus a tag per
// record; n for a nil Opener.
func (o *Opener) Size(n uint64) uint64 {
	if o == nil {
		return n
	}
	return SealedSize(n)
}

// PayloadSize is the wire size of an n-byte data payload: records in
// Integrity and Encryption modes, n otherwise.
func (s *Sealer) PayloadSize(n uint64) uint64 {
	if !s.Mode().SealsPayload() {
		return n
	}
	return SealedSize(n)
}

// PayloadSize is the wire size of an n-byte data payload: records in
// Integrity and Encryption modes, n otherwise.
func (o *Opener) PayloadSize(n uint64) uint64 {
	if !o.Mode().SealsPayload() {
		return n
	}
	return SealedSize(n)
}

// Seal appends p to dst as records (Records(len(p)) of them, each at most
// RecordSize bytes of p and its tag) and returns the extended slice: a
// frame header is one record. It allocates nothing when dst has room for
// Size(len(p)) more bytes. p and dst must not overlap. The records of a p
// of two records or more are sealed on several cores (on a machine of four
// cores or more: fanOut).
func (s *Sealer) Seal(dst, p []byte) ([]byte, error) {
	if s == nil {
		return append(dst, p...), nil
	}
	if s.err != nil {
		return dst, s.err
	}
	if len(p) >= minParallel {
		return s.sealWide(dst, p)
	}
	for len(p) > 0 {
		n := min(len(p), RecordSize)
		var err error
		if dst, err = s.record(dst, p[:n]); err != nil {
			return dst, err
		}
		p = p[n:]
	}
	return dst, nil
}

// record appends one record of p (at most RecordSize bytes).
func (s *Sealer) record(dst, p []byte) ([]byte, error) {
	if err := s.d.next(); err != nil {
		s.err = err
		return dst, err
	}
	if s.d.mode.encrypts() {
		return s.d.gcm.seal(dst, &s.d.nonce, p), nil
	}
	// Headers and Integrity: the plaintext, then GMAC over it (AES-GCM with the record
	// as additional data and nothing to encrypt).
	start := len(dst)
	dst = append(dst, p...)
	end := len(dst)
	dst = slices.Grow(dst, TagSize)[:end+TagSize]
	s.d.gcm.sum(dst[end:], &s.d.nonce, dst[start:end])
	return dst, nil
}

// sealWide is Seal for a p of many records: their sequence numbers taken
// in order, then the records sealed in place in dst by several workers.
func (s *Sealer) sealWide(dst, p []byte) ([]byte, error) {
	n := int(Records(uint64(len(p))))
	ks, err := s.d.take(s.keys, n)
	s.keys = ks
	if err != nil {
		s.err = err
		return dst, err
	}
	at := len(dst)
	dst = slices.Grow(dst, int(SealedSize(uint64(len(p)))))[:at+int(SealedSize(uint64(len(p))))]
	s.job = sealJob{ks: ks, p: p, dst: dst, at: at, enc: s.d.mode.encrypts()}
	fanOut(n, true, &s.job)
	s.job = sealJob{}
	return dst, nil
}

// Tags appends to dst the tags of the records of p, the next records of an
// Integrity payload (p starts a record; every record but the last one is
// RecordSize bytes), and consumes their sequence numbers: on the wire each
// record is its bytes of p followed by its tag, what WritePayload puts
// there. A sender uses it to send a payload from where it lies (the records
// and their tags in one writev) instead of copying it into a buffer first;
// the tags of a p of two records or more are computed on several cores
// (on a machine of four cores or more: fanOut).
// Only Integrity sessions have such records; other modes, a nil Sealer and
// an empty p are refused.
func (s *Sealer) Tags(dst, p []byte) ([]byte, error) {
	if s.Mode() != Integrity {
		return dst, errs.New(errs.InvalidArgument, "session", "payload tags in a %s session", s.Mode())
	}
	if s.err != nil {
		return dst, s.err
	}
	if len(p) == 0 {
		return dst, errs.New(errs.InvalidArgument, "session", "tags of an empty payload")
	}
	n := int(Records(uint64(len(p))))
	ks, err := s.d.take(s.keys, n)
	s.keys = ks
	if err != nil {
		s.err = err
		return dst, err
	}
	at := len(dst)
	dst = slices.Grow(dst, n*TagSize)[:at+n*TagSize]
	s.job = sealJob{ks: ks, p: p, dst: dst, at: at, tagOnly: true}
	fanOut(n, len(p) >= minParallel, &s.job)
	s.job = sealJob{}
	return dst, nil
}

// Open opens one record received whole (its plaintext length plus
// TagSize bytes, at most RecordSize plus TagSize) in place and returns its
// plaintext, a prefix of rec. Errors: Unauthenticated (the record was
// altered, injected, replayed, reordered, or one before it was dropped),
// Protocol (it is shorter than a tag or longer than a record).
func (o *Opener) Open(rec []byte) ([]byte, error) {
	if o == nil {
		return rec, nil
	}
	if o.err != nil {
		return nil, o.err
	}
	if len(rec) < TagSize || len(rec) > RecordSize+TagSize {
		return nil, o.fail(errs.New(errs.Protocol, "session", "a record of %d bytes (%d to %d)", len(rec), TagSize, RecordSize+TagSize))
	}
	if err := o.d.next(); err != nil {
		return nil, o.fail(err)
	}
	n := len(rec) - TagSize
	if o.d.mode.encrypts() {
		// Go's AES-GCM checks the tag before it hands the plaintext
		// back; here the plaintext replaces the ciphertext in rec, which
		// the caller does not use unless Open succeeds.
		if !o.d.gcm.open(rec, &o.d.nonce, o.check[:]) {
			return nil, o.fail(o.refused())
		}
		return rec[:n], nil
	}
	if !o.d.gcm.check(rec[n:], &o.d.nonce, rec[:n], o.check[:]) {
		return nil, o.fail(o.refused())
	}
	return rec[:n], nil
}

func (o *Opener) refused() error { return refusedRecord(o.d.seq - 1) }

func refusedRecord(seq uint64) error {
	return errs.New(errs.Unauthenticated, "session",
		"record %d did not authenticate: it was altered, injected, replayed or reordered, or one before it was lost", seq).
		WithHint("someone on the path between the two engines tampers with the connection, or the two ends disagree on the session")
}

func (o *Opener) fail(err error) error {
	o.err = err
	return err
}

// Err returns the error that broke the Opener, if any.
func (o *Opener) Err() error {
	if o == nil {
		return nil
	}
	return o.err
}
