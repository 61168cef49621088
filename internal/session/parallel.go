package session

import (
	"runtime"
	"sync"
)

// The records of a payload are independent of each other (each has its own
// nonce), so those of a large payload are sealed, tagged or opened on
// several cores at once: the sequence numbers are taken in order first, on
// the caller's goroutine, then each worker handles a run of records.

// maxWorkers bounds the goroutines one call uses (the caller's included).
const maxWorkers = 4

// minParallel is the least number of bytes a call spreads over workers:
// below it, starting and joining a goroutine costs more than it saves.
const minParallel = 2 * RecordSize

// wideCores is the least GOMAXPROCS at which records are spread over
// workers. With two cores the connection's other end, or another
// connection, has the other one busy: measured on a 2-core machine under
// load, spreading the checks cost 10 to 20 % more CPU per request (goroutine
// wake-ups and spinning) for no gain in throughput (bench/README.md,
// "Payload integrity"). A variable so that tests run the spread path on
// any machine.
var wideCores = 4

// recordKey is what one record is sealed or opened with: the key of its
// epoch, its nonce, its sequence number.
type recordKey struct {
	gcm   *gcm
	check [TagSize]byte // scratch of an Integrity record's check
	nonce [NonceSize]byte
	seq   uint64
}

// take consumes the sequence numbers of n records and returns each one's
// key and nonce in order, in ks's storage (a key changes at each epoch
// boundary, which take crosses as next does).
func (d *direction) take(ks []recordKey, n int) ([]recordKey, error) {
	ks = ks[:0]
	for range n {
		if err := d.next(); err != nil {
			return ks, err
		}
		ks = append(ks, recordKey{gcm: d.gcm, nonce: d.nonce, seq: d.seq - 1})
	}
	return ks, nil
}

// runner is work on a run of records, [lo, hi).
type runner interface{ run(lo, hi int) }

// fanOut runs r on n records split into contiguous runs, one per worker,
// the caller's goroutine taking the first run, and returns once all are
// done; with wide false, or one core, it runs r(0, n) alone (and allocates
// nothing).
func fanOut(n int, wide bool, r runner) {
	cores := runtime.GOMAXPROCS(0)
	w := min(n, cores, maxWorkers)
	if !wide || w <= 1 || cores < wideCores {
		r.run(0, n)
		return
	}
	var wg sync.WaitGroup
	for i := 1; i < w; i++ {
		lo, hi := i*n/w, (i+1)*n/w
		wg.Go(func() { r.run(lo, hi) })
	}
	r.run(0, n/w)
	wg.Wait()
}

// sealJob seals records of p into dst at at (Seal), or computes their tags
// into dst at at (Tags).
type sealJob struct {
	ks      []recordKey
	p, dst  []byte
	at      int
	tagOnly bool // Tags: only the tags go to dst
	enc     bool // Encryption: ciphertext and tag
}

func (j *sealJob) run(lo, hi int) {
	for i := lo; i < hi; i++ {
		rec := j.p[i*RecordSize : min(len(j.p), (i+1)*RecordSize)]
		switch {
		case j.tagOnly:
			o := j.at + i*TagSize
			j.ks[i].gcm.sum(j.dst[o:o+TagSize], &j.ks[i].nonce, rec)
		case j.enc:
			o := j.at + i*(RecordSize+TagSize)
			j.ks[i].gcm.seal(j.dst[o:o], &j.ks[i].nonce, rec)
		default:
			o := j.at + i*(RecordSize+TagSize)
			copy(j.dst[o:], rec)
			e := o + len(rec)
			j.ks[i].gcm.sum(j.dst[e:e+TagSize], &j.ks[i].nonce, j.dst[o:e])
		}
	}
}

// openJob opens records read whole, back to back, in place, noting which
// opened. With decryptOut, an encrypted record the vector path takes is
// only checked here (sealed[i]): openGroup decrypts it straight into the
// destination, saving the copy out of the scratch buffer.
type openJob struct {
	ks         []recordKey
	recs       []byte
	enc        bool
	decryptOut bool
	opened     [ReadRecords]bool
	sealed     [ReadRecords]bool
}

func (j *openJob) run(lo, hi int) {
	for i := lo; i < hi; i++ {
		rec := j.recs[i*(RecordSize+TagSize) : min(len(j.recs), (i+1)*(RecordSize+TagSize))]
		k := len(rec) - TagSize
		j.sealed[i] = false
		switch {
		case j.enc && j.decryptOut && j.ks[i].gcm.vector(k):
			j.opened[i] = j.ks[i].gcm.verify(rec, &j.ks[i].nonce, j.ks[i].check[:])
			j.sealed[i] = true
		case j.enc:
			j.opened[i] = j.ks[i].gcm.open(rec, &j.ks[i].nonce, j.ks[i].check[:])
		default:
			j.opened[i] = j.ks[i].gcm.check(rec[k:], &j.ks[i].nonce, rec[:k], j.ks[i].check[:])
		}
	}
}
