package peerauth

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"

	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/wire"
)

// Store records (spec.md, "Authenticated store records"): a descriptor or
// rpc_meta record an engine puts in a metadata store carries a MAC under a
// key derived from the secret, so a store writer without the secret can
// delete or garble a record (an open fails) but not move one segment's
// record under another's name (an open reaching the wrong engine).

// RecordField is the JSON field a signed record carries its MAC in; every
// other field is the record's own (Mooncake's readers ignore this one).
const RecordField = "te_mac"

// labelRecord derives the record key from a secret: a label of its own, so
// no MAC of the exchange or of another use is ever a valid record MAC.
const labelRecord = "te-store-v1 record key"

// recordMAC is HMAC-SHA256(HMAC-SHA256(secret, labelRecord), storeKey ‖ 0 ‖
// body).
func recordMAC(k key, storeKey string, body []byte) []byte {
	rk := hmac.New(sha256.New, k.mac)
	rk.Write([]byte(labelRecord))
	m := hmac.New(sha256.New, rk.Sum(nil))
	m.Write([]byte(storeKey))
	m.Write([]byte{0})
	m.Write(body)
	return m.Sum(nil)
}

// SignRecord returns body, a JSON object, with RecordField added last: the
// MAC of the current key over storeKey (the key the record is stored under)
// and body. Without a secret it returns body as it is. body must be a JSON
// object that does not carry RecordField already.
func (s *Secret) SignRecord(storeKey string, body []byte) ([]byte, error) {
	if s == nil {
		return body, nil
	}
	b := bytes.TrimRight(body, " \t\r\n")
	if len(b) < 2 || b[0] != '{' || b[len(b)-1] != '}' || bytes.Contains(b, []byte(`"`+RecordField+`"`)) {
		return nil, errs.New(errs.InvalidArgument, "auth", "record for %q is not a JSON object without %s", storeKey, RecordField)
	}
	k := s.keys[0]
	empty := len(bytes.TrimSpace(b[1:len(b)-1])) == 0
	if empty {
		b = []byte("{}")
	}
	out := make([]byte, 0, len(b)+len(RecordField)+120)
	out = append(out, b[:len(b)-1]...)
	if !empty {
		out = append(out, ',')
	}
	out = append(out, `"`+RecordField+`":"`...)
	out = hex.AppendEncode(out, k.id[:])
	out = append(out, '.')
	out = hex.AppendEncode(out, recordMAC(k, storeKey, b))
	return append(out, `"}`...), nil
}

// VerifyRecord checks a record read from a store under storeKey and
// returns it without RecordField, as it was signed. Errors (all
// Unauthenticated, naming the key and why): the record is unsigned, signed
// under a key this engine does not hold, or its MAC does not match (it was
// altered, or copied from another key). Without a secret it returns rec as
// it is.
func (s *Secret) VerifyRecord(storeKey string, rec []byte) ([]byte, error) {
	if s == nil {
		return rec, nil
	}
	b := bytes.TrimRight(rec, " \t\r\n")
	marker := []byte(`"` + RecordField + `":"`)
	i := bytes.LastIndex(b, marker)
	if i < 0 {
		return nil, errs.New(errs.Unauthenticated, "auth", "record %q carries no %s: it was not written by an engine holding the cluster secret", storeKey, RecordField).
			WithHint("a record written without the secret (a store writer, or an engine without the secret) is refused; give every engine the secret")
	}
	tail := b[i+len(marker):]
	const idHex, macHex = 2 * wire.AuthKeyIDSize, 2 * sha256.Size
	if len(tail) != idHex+1+macHex+2 || tail[idHex] != '.' || string(tail[len(tail)-2:]) != `"}` {
		return nil, errs.New(errs.Unauthenticated, "auth", "record %q has a malformed %s", storeKey, RecordField)
	}
	var id [wire.AuthKeyIDSize]byte
	got := make([]byte, sha256.Size)
	if _, err := hex.Decode(id[:], tail[:idHex]); err != nil {
		return nil, errs.New(errs.Unauthenticated, "auth", "record %q has a malformed %s", storeKey, RecordField)
	}
	if _, err := hex.Decode(got, tail[idHex+1:idHex+1+macHex]); err != nil {
		return nil, errs.New(errs.Unauthenticated, "auth", "record %q has a malformed %s", storeKey, RecordField)
	}
	k, ok := s.find(id)
	if !ok {
		return nil, errs.New(errs.Unauthenticated, "auth", "record %q is signed with key id %s, which this engine does not hold (ours: %v)", storeKey, hexID(id), s.KeyIDs()).
			WithHint("the writer has another cluster secret")
	}
	head := bytes.TrimRight(b[:i], " \t\r\n")
	orig := make([]byte, 0, len(head)+1)
	switch {
	case len(head) > 0 && head[len(head)-1] == ',':
		orig = append(append(orig, head[:len(head)-1]...), '}')
	case len(head) > 0 && head[len(head)-1] == '{':
		orig = append(append(orig, head...), '}')
	default:
		return nil, errs.New(errs.Unauthenticated, "auth", "record %q has a malformed %s", storeKey, RecordField)
	}
	if !hmac.Equal(got, recordMAC(k, storeKey, orig)) {
		return nil, errs.New(errs.Unauthenticated, "auth", "record %q does not verify: it was altered, or copied from another segment's key", storeKey).
			WithHint("someone without the cluster secret wrote to the metadata store")
	}
	return orig, nil
}
