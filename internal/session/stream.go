package session

import (
	"io"

	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/wire"
)

// Streams: bodies and payloads larger than a record, read and written a
// record at a time so that memory stays bounded and bytes flow as they
// arrive. beforeChunk, where given, is called with the wire size of each
// record (or each RecordSize of a payload in the clear) before it is read
// or written: a caller sets its progress deadline there, as with
// wire.ReadBody.

func scratch(b *[]byte) []byte {
	if *b == nil {
		*b = make([]byte, RecordSize+TagSize)
	}
	return *b
}

// ReadRecords is how many records of a payload or body the Opener reads
// with one read at most: fewer system calls per payload, and the bytes are
// still in cache when their tag is checked and they are copied out.
const ReadRecords = 4

// groupScratch returns the Opener's buffer for ReadRecords records.
func (o *Opener) groupScratch() []byte {
	const size = ReadRecords * (RecordSize + TagSize)
	if len(o.scratch) < size {
		o.scratch = make([]byte, size)
	}
	return o.scratch
}

// ReadRecord reads one record of n plaintext bytes (Size(n) bytes on the
// wire, n at most RecordSize) from r into buf and opens it: the frame
// header's read. buf must hold Size(n) bytes; the plaintext is a prefix of
// buf. With a nil Opener it reads n bytes.
func (o *Opener) ReadRecord(r io.Reader, buf []byte, n int) ([]byte, error) {
	if o == nil {
		if n <= 0 || len(buf) < n {
			return nil, errs.New(errs.InvalidArgument, "session", "a header of %d bytes into a buffer of %d", n, len(buf))
		}
		if _, err := io.ReadFull(r, buf[:n]); err != nil {
			return nil, err
		}
		return buf[:n], nil
	}
	if o.err != nil {
		return nil, o.err
	}
	if n <= 0 || n > RecordSize || len(buf) < n+TagSize {
		return nil, errs.New(errs.InvalidArgument, "session", "a record of %d bytes into a buffer of %d", n, len(buf))
	}
	if _, err := io.ReadFull(r, buf[:n+TagSize]); err != nil {
		return nil, err
	}
	return o.Open(buf[:n+TagSize])
}

// ReadBody reads a body of n plaintext bytes sent with Seal, as
// wire.ReadBody does (its buffer grows with what arrived, never to the
// claimed size up front), opening each record before it reads the next.
// The caller bounds n before it calls. With a nil Opener it is
// wire.ReadBody.
func (o *Opener) ReadBody(r io.Reader, n uint64, beforeChunk func(size int)) ([]byte, error) {
	if o == nil {
		return wire.ReadBody(r, n, beforeChunk)
	}
	if o.err != nil {
		return nil, o.err
	}
	// Each record is read behind the plaintext so far and opened in place;
	// its tag is then overwritten by the next record.
	buf := make([]byte, 0, min(n, RecordSize)+TagSize)
	for uint64(len(buf)) < n {
		want := int(min(n-uint64(len(buf)), RecordSize))
		if cap(buf)-len(buf) < want+TagSize {
			nc := uint64(max(2*cap(buf), len(buf)+want+TagSize))
			nb := make([]byte, len(buf), min(nc, n+TagSize))
			copy(nb, buf)
			buf = nb
		}
		if beforeChunk != nil {
			beforeChunk(want + TagSize)
		}
		rec := buf[len(buf) : len(buf)+want+TagSize]
		if _, err := io.ReadFull(r, rec); err != nil {
			return nil, err
		}
		if _, err := o.Open(rec); err != nil {
			return nil, err
		}
		buf = buf[:len(buf)+want]
	}
	return buf, nil
}

// DiscardBody reads, checks and drops a body of n plaintext bytes sent with
// Seal (a refused call's): its records still count in the sequence. With a
// nil Opener it is wire.DiscardBody.
func (o *Opener) DiscardBody(r io.Reader, n uint64, beforeChunk func(size int)) error {
	if o == nil {
		return wire.DiscardBody(r, n, beforeChunk)
	}
	return o.records(r, nil, n, 1, beforeChunk)
}

// ReadPayload reads a data payload of len(dst) bytes into dst: records in
// Integrity and Encryption modes, each opened in the Opener's own buffer
// and copied into dst only once its tag checked out; the bytes as they
// come in Headers mode. On an error dst holds part of the payload (never
// unauthenticated bytes, except in Headers mode) and the connection must
// be closed.
func (o *Opener) ReadPayload(r io.Reader, dst []byte, beforeChunk func(size int)) error {
	if !o.Mode().SealsPayload() {
		if o != nil && o.err != nil {
			return o.err
		}
		for off := 0; off < len(dst); off += RecordSize {
			end := min(len(dst), off+RecordSize)
			if beforeChunk != nil {
				beforeChunk(end - off)
			}
			if _, err := io.ReadFull(r, dst[off:end]); err != nil {
				return err
			}
		}
		return nil
	}
	return o.records(r, dst, uint64(len(dst)), ReadRecords, beforeChunk)
}

// DiscardPayload reads and drops an n-byte data payload (a refused WRITE's,
// a canceled READ's), checking its records where payloads are records.
func (o *Opener) DiscardPayload(r io.Reader, n uint64, beforeChunk func(size int)) error {
	if !o.Mode().SealsPayload() {
		if o != nil && o.err != nil {
			return o.err
		}
		return wire.DiscardBody(r, n, beforeChunk)
	}
	return o.records(r, nil, n, ReadRecords, beforeChunk)
}

// records reads n plaintext bytes of records through the scratch buffer,
// up to group of them at a time (beforeChunk gets the wire size of each
// such group: a control body's bound is per record, a payload's per
// group), opens them (on several cores where the group is large)
// and copies each record that opened into dst (nil: dropped). A record
// that does not open fails the call; no byte of it reaches dst.
func (o *Opener) records(r io.Reader, dst []byte, n uint64, group int, beforeChunk func(size int)) error {
	if o.err != nil {
		return o.err
	}
	sc := o.groupScratch()
	for off := uint64(0); off < n; {
		k := min(n-off, uint64(group)*RecordSize)
		size := int(SealedSize(k))
		if beforeChunk != nil {
			beforeChunk(size)
		}
		if _, err := io.ReadFull(r, sc[:size]); err != nil {
			return err
		}
		if err := o.openGroup(sc[:size], int(Records(k)), dst, off); err != nil {
			return err
		}
		off += k
	}
	return nil
}

// openGroup opens the n records of recs (at most ReadRecords, read whole) in
// place, on several cores where they are many, then copies them into dst at
// off and on (nil: dropped), in order, up to the first that did not open:
// that one fails the Opener, and no byte of it or of any record after it
// reaches dst.
func (o *Opener) openGroup(recs []byte, n int, dst []byte, off uint64) error {
	ks, err := o.d.take(o.keys, n)
	o.keys = ks
	if err != nil {
		return o.fail(err)
	}
	o.job.ks, o.job.recs, o.job.enc, o.job.decryptOut = ks, recs, o.d.mode.encrypts(), dst != nil
	fanOut(n, len(recs) >= minParallel, &o.job)
	o.job.recs = nil
	for i := range n {
		if !o.job.opened[i] {
			return o.fail(refusedRecord(ks[i].seq))
		}
		if dst != nil {
			rec := recs[i*(RecordSize+TagSize) : min(len(recs), (i+1)*(RecordSize+TagSize))]
			at := dst[off+uint64(i*RecordSize):]
			if o.job.sealed[i] {
				// Checked, still ciphertext: decrypted into place.
				ks[i].gcm.ctr(at[:len(rec)-TagSize], rec[:len(rec)-TagSize], &ks[i].nonce)
			} else {
				copy(at, rec[:len(rec)-TagSize])
			}
		}
	}
	return nil
}

// WriteBody writes p sealed as records (Seal), a record at a time through
// the Sealer's own buffer; with a nil Sealer, p as it is.
func (s *Sealer) WriteBody(w io.Writer, p []byte, beforeChunk func(size int)) error {
	if s == nil {
		return writeChunks(w, p, beforeChunk)
	}
	return s.records(w, p, beforeChunk)
}

// WritePayload writes a data payload: records in Integrity mode (the
// bytes straight from src, each record's tag after them) and Encryption
// mode, the bytes as they are in Headers mode.
func (s *Sealer) WritePayload(w io.Writer, src []byte, beforeChunk func(size int)) error {
	if !s.Mode().SealsPayload() {
		if s != nil && s.err != nil {
			return s.err
		}
		return writeChunks(w, src, beforeChunk)
	}
	return s.records(w, src, beforeChunk)
}

func (s *Sealer) records(w io.Writer, p []byte, beforeChunk func(size int)) error {
	if s.err != nil {
		return s.err
	}
	sc := scratch(&s.scratch)
	for len(p) > 0 {
		n := min(len(p), RecordSize)
		var rec []byte
		var err error
		if !s.d.mode.encrypts() {
			// The plaintext goes out from where it is, then its tag.
			if rec, err = s.tagOnly(p[:n]); err != nil {
				return err
			}
			if beforeChunk != nil {
				beforeChunk(n + TagSize)
			}
			if _, err := w.Write(p[:n]); err != nil {
				return err
			}
		} else {
			if rec, err = s.record(sc[:0], p[:n]); err != nil {
				return err
			}
			if beforeChunk != nil {
				beforeChunk(len(rec))
			}
		}
		if _, err := w.Write(rec); err != nil {
			return err
		}
		p = p[n:]
	}
	return nil
}

// tagOnly computes an Integrity record's tag over p into the Sealer's tag
// buffer.
func (s *Sealer) tagOnly(p []byte) ([]byte, error) {
	if err := s.d.next(); err != nil {
		s.err = err
		return nil, err
	}
	s.d.gcm.sum(s.tag[:], &s.d.nonce, p)
	return s.tag[:], nil
}

func writeChunks(w io.Writer, p []byte, beforeChunk func(size int)) error {
	for off := 0; off < len(p); off += RecordSize {
		end := min(len(p), off+RecordSize)
		if beforeChunk != nil {
			beforeChunk(end - off)
		}
		if _, err := w.Write(p[off:end]); err != nil {
			return err
		}
	}
	return nil
}

// payloadState is a payload streamed in pieces: the bytes of it not yet
// handed over, and the record being filled (Sealer) or drained (Opener).
type payloadState struct {
	left    uint64 // payload bytes not yet written (Sealer) or read off the wire (Opener)
	fill    int    // Sealer: bytes of the current record in the buffer
	recSize int    // Sealer: size of the current record
	avail   []byte // Opener: opened plaintext not yet copied out
}

// StartPayload begins a payload of n bytes to be written with WritePiece
// in pieces of any size (a device payload staged through host chunks):
// the bytes on the wire are exactly WritePayload's for the whole payload.
// Until its last byte is written, nothing else is sealed.
func (s *Sealer) StartPayload(n uint64) {
	if s != nil {
		s.pay = payloadState{left: n}
	}
}

// WritePiece writes the next piece of the payload begun with StartPayload.
// In Integrity and Encryption modes a record goes out each time one is
// complete (the last one when the payload's last byte arrives); in Headers
// mode the piece goes out as it is. Writing more than the payload's size is an error.
func (s *Sealer) WritePiece(w io.Writer, p []byte, beforeChunk func(size int)) error {
	if !s.Mode().SealsPayload() {
		if s != nil {
			if s.err != nil {
				return s.err
			}
			if uint64(len(p)) > s.pay.left {
				return errs.New(errs.InvalidArgument, "session", "a piece of %d bytes where the payload has %d left", len(p), s.pay.left)
			}
			s.pay.left -= uint64(len(p))
		}
		return writeChunks(w, p, beforeChunk)
	}
	if s.err != nil {
		return s.err
	}
	st := &s.pay
	if uint64(len(p)) > st.left+uint64(st.recSize-st.fill) {
		return errs.New(errs.InvalidArgument, "session", "a piece of %d bytes where the payload has %d left", len(p), st.left+uint64(st.recSize-st.fill))
	}
	sc := scratch(&s.scratch)
	for len(p) > 0 {
		if st.fill == 0 {
			st.recSize = int(min(st.left, RecordSize))
			st.left -= uint64(st.recSize)
		}
		k := copy(sc[st.fill:st.recSize], p)
		st.fill += k
		p = p[k:]
		if st.fill < st.recSize {
			break
		}
		// Sealed in place: the plaintext is exactly where the record goes.
		rec, err := s.record(sc[:0], sc[:st.recSize])
		if err != nil {
			return err
		}
		st.fill, st.recSize = 0, 0
		if beforeChunk != nil {
			beforeChunk(len(rec))
		}
		if _, err := w.Write(rec); err != nil {
			return err
		}
	}
	return nil
}

// StartPayload begins a payload of n bytes to be read with ReadPiece in
// pieces of any size, as the sender's WritePayload or WritePiece sent it.
// Until its last byte is read, nothing else is read through the Opener.
func (o *Opener) StartPayload(n uint64) {
	if o != nil {
		o.pay = payloadState{left: n}
	}
}

// ReadPiece fills dst with the next bytes of the payload begun with
// StartPayload. In Integrity and Encryption modes it reads and opens
// records as it needs them, and copies out only bytes of records that
// opened. Reading past the
// payload's end is an error.
func (o *Opener) ReadPiece(r io.Reader, dst []byte, beforeChunk func(size int)) error {
	if !o.Mode().SealsPayload() {
		if o != nil {
			if o.err != nil {
				return o.err
			}
			if uint64(len(dst)) > o.pay.left {
				return errs.New(errs.InvalidArgument, "session", "a piece of %d bytes where the payload has %d left", len(dst), o.pay.left)
			}
			o.pay.left -= uint64(len(dst))
		}
		for off := 0; off < len(dst); off += RecordSize {
			end := min(len(dst), off+RecordSize)
			if beforeChunk != nil {
				beforeChunk(end - off)
			}
			if _, err := io.ReadFull(r, dst[off:end]); err != nil {
				return err
			}
		}
		return nil
	}
	if o.err != nil {
		return o.err
	}
	st := &o.pay
	if uint64(len(dst)) > st.left+uint64(len(st.avail)) {
		return errs.New(errs.InvalidArgument, "session", "a piece of %d bytes where the payload has %d left", len(dst), st.left+uint64(len(st.avail)))
	}
	sc := scratch(&o.scratch)
	for len(dst) > 0 {
		if len(st.avail) == 0 {
			k := int(min(st.left, RecordSize))
			if beforeChunk != nil {
				beforeChunk(k + TagSize)
			}
			if _, err := io.ReadFull(r, sc[:k+TagSize]); err != nil {
				return err
			}
			p, err := o.Open(sc[:k+TagSize])
			if err != nil {
				return err
			}
			st.left -= uint64(k)
			st.avail = p
		}
		c := copy(dst, st.avail)
		st.avail = st.avail[c:]
		dst = dst[c:]
	}
	return nil
}
