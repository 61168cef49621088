package session

import (
	"bytes"
	"testing"

	"github.com/tecache/te/internal/errs"
)

// TestRekey: both directions move to the next key at the epoch boundary
// in step, so records keep opening; a record sealed under the old key
// after the boundary does not.
func TestRekey(t *testing.T) {
	for _, mode := range []Mode{Headers, Integrity, Encryption} {
		p := Params{Secret: []byte("correct horse battery staple 1"), Transcript: []byte("t"), Channel: Control, Mode: mode}
		ini, _ := New(p, Initiator)
		srv, _ := New(p, Server)
		ini.Send.d.seq = RekeyRecords - 2
		srv.Recv.d.seq = RekeyRecords - 2
		old := ini.Send.d.gcm
		oldTS := ini.Send.d.ts
		for i := range 4 {
			rec, err := ini.Send.Seal(nil, []byte("header"))
			if err != nil {
				t.Fatal(err)
			}
			if got, err := srv.Recv.Open(rec); err != nil || string(got) != "header" {
				t.Fatalf("%v: record %d around the boundary: %v", mode, i, err)
			}
		}
		if ini.Send.d.gcm == old || ini.Send.d.ts == oldTS || srv.Recv.d.ts != ini.Send.d.ts {
			t.Fatalf("%v: no key update at the boundary", mode)
		}
		// A record sealed with the previous epoch's key for the current
		// sequence number does not open.
		stale := direction{mode: mode, dir: ini.Send.d.dir, seq: ini.Send.d.seq, ts: oldTS}
		if err := stale.keys(); err != nil {
			t.Fatal(err)
		}
		stale.next()
		var rec []byte
		if mode == Encryption {
			rec = stale.gcm.aead.Seal(nil, stale.nonce[:], []byte("header"), nil)
		} else {
			rec = stale.gcm.aead.Seal([]byte("header"), stale.nonce[:], nil, []byte("header"))
		}
		if _, err := srv.Recv.Open(rec); errs.CodeOf(err) != errs.Unauthenticated {
			t.Fatalf("%v: old key accepted after the update: %v", mode, err)
		}
	}
}

// TestNonceLayout pins the nonce: the IV XOR (u32 direction, u64 sequence),
// little-endian, as spec.md says.
func TestNonceLayout(t *testing.T) {
	d := direction{dir: dirS2I, seq: 0x0102030405060708}
	d.iv = [NonceSize]byte{0xff, 0, 0, 0, 0xff}
	d.next()
	want := []byte{0xfd, 0, 0, 0, 0xf7, 7, 6, 5, 4, 3, 2, 1}
	if !bytes.Equal(d.nonce[:], want) || d.seq != 0x0102030405060709 {
		t.Fatalf("nonce % x seq %#x", d.nonce, d.seq)
	}
}
