package session

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/sha256"
	"encoding/binary"

	"github.com/tecache/te/internal/errs"
)

// Record layer constants (spec.md, "Authenticated sessions").
const (
	// TagSize is the size of a record's tag.
	TagSize = 16
	// RecordSize is the most plaintext one record carries.
	RecordSize = 64 << 10
	// KeySize is the size of each direction's AES key (AES-128: the
	// secret itself carries at least 128 bits, so a longer key would not
	// be stronger).
	KeySize = 16
	// NonceSize is AES-GCM's nonce size.
	NonceSize = 12
	// RekeyRecords is how many records each direction seals under one key
	// before both ends move to the next one: at most 64 GiB of records,
	// far inside AES-GCM's bound for one key.
	RekeyRecords = 1 << 20
	// KeyIDSize is the size of a key id (wire.AuthKeyIDSize).
	KeyIDSize = 8
)

// Mode says what a session protects. The values are those of the mode byte
// of the version 2 exchange.
type Mode uint8

const (
	// Headers authenticates every header and control body; data payloads
	// cross in the clear, unauthenticated (an opt-out: a party on the path
	// can alter KV bytes unnoticed).
	Headers Mode = 1
	// Encryption seals everything, data payloads included, with AES-GCM:
	// a party on the path can neither read nor alter any byte.
	Encryption Mode = 2
	// Integrity authenticates everything, data payloads included: each
	// payload record is its plaintext and a GMAC tag, checked before any
	// byte of it reaches the receiver's memory. A party on the path can
	// read payloads but not alter them. The default with a secret.
	Integrity Mode = 3
)

func (m Mode) String() string {
	switch m {
	case Headers:
		return "headers"
	case Integrity:
		return "integrity"
	case Encryption:
		return "encryption"
	}
	return "none"
}

// label is the mode's name in the key schedule: mode 1 keeps the name it
// had before payload integrity existed, so its keys are what older
// engines derive.
func (m Mode) label() string {
	switch m {
	case Headers:
		return "integrity"
	case Integrity:
		return "payload-integrity"
	}
	return m.String()
}

// SealsPayload reports whether data payloads travel as records (tagged,
// or encrypted and tagged) in this mode.
func (m Mode) SealsPayload() bool { return m == Integrity || m == Encryption }

// encrypts reports whether records carry ciphertext rather than plaintext.
func (m Mode) encrypts() bool { return m == Encryption }

// Channels: which listener a connection was made to. The channel is bound
// into the keys, so frames of one kind of connection can never be taken
// for another's (a relay that forwards a control connection's exchange to
// a data listener gets a session whose first record fails).
const (
	Control = "ctrl"
	Data    = "data"
)

// Role is the side of the exchange this end played.
type Role uint8

const (
	// Initiator dialled the connection and sent HELLO.
	Initiator Role = 1
	// Server accepted it and sent CHALLENGE.
	Server Role = 2
)

// Params is what the exchange hands the record layer.
type Params struct {
	// Secret is the chosen key's bytes (the secret the CHALLENGE named).
	Secret []byte
	// KeyID is that key's id.
	KeyID [KeyIDSize]byte
	// Transcript is T exactly as both proofs cover it: the HELLO and
	// CHALLENGE bodies as sent, each after its u16 length.
	Transcript []byte
	// Channel is Control or Data.
	Channel string
	// Mode is what the CHALLENGE chose.
	Mode Mode
}

// Session is one connection's protection: Send seals what this end writes,
// Recv opens what it reads.
type Session struct {
	Mode Mode
	Send *Sealer
	Recv *Opener
}

// Split returns the session's Sealer and Opener; nil and nil for a nil
// Session (a connection without a session), which pass bytes through.
func (s *Session) Split() (*Sealer, *Opener) {
	if s == nil {
		return nil, nil
	}
	return s.Send, s.Recv
}

// Labels of the key schedule (HKDF info strings).
const (
	labelPrefix = "te-session-v1 "
	labelI2S    = "initiator to server"
	labelS2I    = "server to initiator"
	labelKey    = labelPrefix + "key"
	labelIV     = labelPrefix + "iv"
	labelUpdate = labelPrefix + "update"
)

// Direction numbers, in every nonce (spec.md).
const (
	dirI2S uint32 = 1
	dirS2I uint32 = 2
)

// New derives the session's keys from the exchange (spec.md, "Key
// schedule") for the side role played. Both ends of one exchange derive the
// same two keys, each end sealing with the one the other opens with.
func New(p Params, role Role) (*Session, error) {
	if len(p.Secret) == 0 || len(p.Transcript) == 0 {
		return nil, errs.New(errs.InvalidArgument, "session", "no secret or no transcript to derive keys from")
	}
	if p.Channel != Control && p.Channel != Data {
		return nil, errs.New(errs.InvalidArgument, "session", "unknown channel %q", p.Channel)
	}
	if p.Mode != Headers && p.Mode != Integrity && p.Mode != Encryption {
		return nil, errs.New(errs.InvalidArgument, "session", "unknown mode %d", p.Mode)
	}
	if role != Initiator && role != Server {
		return nil, errs.New(errs.InvalidArgument, "session", "unknown role %d", role)
	}
	th := sha256.Sum256(p.Transcript)
	prk, err := hkdf.Extract(sha256.New, p.Secret, th[:])
	if err != nil {
		return nil, errs.Wrap(errs.Internal, "session", err, "extract")
	}
	i2s, err := newDir(prk, p, labelI2S, dirI2S)
	if err != nil {
		return nil, err
	}
	s2i, err := newDir(prk, p, labelS2I, dirS2I)
	if err != nil {
		return nil, err
	}
	if role == Server {
		i2s, s2i = s2i, i2s
	}
	return &Session{Mode: p.Mode, Send: &Sealer{d: *i2s}, Recv: &Opener{d: *s2i}}, nil
}

// direction is the state of one direction: the current epoch's traffic
// secret, its AEAD and nonce mask, and the next record's sequence number.
type direction struct {
	mode  Mode
	dir   uint32
	seq   uint64
	ts    [sha256.Size]byte
	iv    [NonceSize]byte
	nonce [NonceSize]byte
	gcm   *gcm // crypto/cipher's AES-GCM, or the vector path (gcm.go)
}

func newDir(prk []byte, p Params, label string, dir uint32) (*direction, error) {
	info := labelPrefix + p.Channel + " " + p.Mode.label() + " " + label + "\x00" + string(p.KeyID[:])
	ts, err := hkdf.Expand(sha256.New, prk, info, sha256.Size)
	if err != nil {
		return nil, errs.Wrap(errs.Internal, "session", err, "expand")
	}
	d := &direction{mode: p.Mode, dir: dir}
	copy(d.ts[:], ts)
	if err := d.keys(); err != nil {
		return nil, err
	}
	return d, nil
}

// keys sets the AEAD and the nonce mask from the traffic secret.
func (d *direction) keys() error {
	k, err := hkdf.Expand(sha256.New, d.ts[:], labelKey, KeySize)
	if err != nil {
		return errs.Wrap(errs.Internal, "session", err, "expand")
	}
	iv, err := hkdf.Expand(sha256.New, d.ts[:], labelIV, NonceSize)
	if err != nil {
		return errs.Wrap(errs.Internal, "session", err, "expand")
	}
	b, err := aes.NewCipher(k)
	if err != nil {
		return errs.Wrap(errs.Internal, "session", err, "aes")
	}
	g, err := cipher.NewGCM(b)
	if err != nil {
		return errs.Wrap(errs.Internal, "session", err, "gcm")
	}
	copy(d.iv[:], iv)
	d.gcm = newGCM(k, b, g)
	return nil
}

// next prepares the nonce of the next record and consumes its sequence
// number, moving to the next key at each epoch boundary. The rekey cannot
// fail in practice (fixed sizes into HKDF and AES); if it did, the
// direction is unusable and the caller's error says so.
func (d *direction) next() error {
	if d.seq != 0 && d.seq%RekeyRecords == 0 {
		ts, err := hkdf.Expand(sha256.New, d.ts[:], labelUpdate, sha256.Size)
		if err != nil {
			return errs.Wrap(errs.Internal, "session", err, "key update")
		}
		copy(d.ts[:], ts)
		if err := d.keys(); err != nil {
			return err
		}
	}
	binary.LittleEndian.PutUint32(d.nonce[0:], d.dir)
	binary.LittleEndian.PutUint64(d.nonce[4:], d.seq)
	for i := range d.nonce {
		d.nonce[i] ^= d.iv[i]
	}
	d.seq++
	return nil
}

// Records returns how many records carry n bytes: one per RecordSize or
// part of it, none for n = 0.
func Records(n uint64) uint64 { return (n + RecordSize - 1) / RecordSize }

// SealedSize is the wire size of n bytes sent as records.
func SealedSize(n uint64) uint64 { return n + Records(n)*TagSize }
