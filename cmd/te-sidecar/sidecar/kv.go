package sidecar

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"sync"

	"github.com/valyala/fasthttp"

	"github.com/tecache/te/cmd/te-sidecar/api"
	"github.com/tecache/te/internal/authsecret"
	"github.com/tecache/te/internal/errs"
)

// MaxKeyLen bounds a metadata key.
const MaxKeyLen = 4096

// KV is the sidecar's in-memory metadata store: Mooncake's HTTP metadata
// server semantics (the last PUT wins; DELETE of a missing key succeeds).
type KV struct {
	maxKeys, maxValue, maxBytes int

	mu    sync.RWMutex
	m     map[string][]byte
	bytes int
}

// NewKV returns an empty store with the given bounds: keys, bytes of one
// value, and bytes of every key and value together.
func NewKV(maxKeys, maxValue, maxBytes int) *KV {
	return &KV{maxKeys: maxKeys, maxValue: maxValue, maxBytes: maxBytes, m: map[string][]byte{}}
}

// Get returns the value at key (not a copy: values are never modified in
// place).
func (kv *KV) Get(key string) ([]byte, bool) {
	kv.mu.RLock()
	defer kv.mu.RUnlock()
	v, ok := kv.m[key]
	return v, ok
}

// errFull is returned by Put when the store holds MaxKeys keys or would
// exceed its bytes.
var errFull = errors.New("metadata store full")

// Put stores a copy of value.
func (kv *KV) Put(key string, value []byte) error {
	v := append([]byte(nil), value...)
	kv.mu.Lock()
	defer kv.mu.Unlock()
	old, ok := kv.m[key]
	if !ok && len(kv.m) >= kv.maxKeys {
		return errFull
	}
	grow := len(v)
	if ok {
		grow -= len(old)
	} else {
		grow += len(key)
	}
	if kv.maxBytes > 0 && kv.bytes+grow > kv.maxBytes {
		return errFull
	}
	if ok {
		kv.bytes -= len(key) + len(old)
	}
	kv.m[key] = v
	kv.bytes += len(key) + len(v)
	return nil
}

// Delete removes key and reports whether it was there.
func (kv *KV) Delete(key string) bool {
	kv.mu.Lock()
	defer kv.mu.Unlock()
	old, ok := kv.m[key]
	if ok {
		kv.bytes -= len(key) + len(old)
		delete(kv.m, key)
	}
	return ok
}

// Size returns the number of keys and their total size in bytes.
func (kv *KV) Size() (keys, bytes int) {
	kv.mu.RLock()
	defer kv.mu.RUnlock()
	return len(kv.m), kv.bytes
}

// MetadataAnswer is the answer of PUT and DELETE /metadata.
type MetadataAnswer struct {
	Status string `json:"status"` // updated or deleted
	Key    string `json:"key"`
}

func (s *Server) installMetadata() {
	ops := s.metrics.Counter("te_sidecar_metadata_ops_total", "Metadata operations by kind and result.", "op", "result")
	key := func(ctx *fasthttp.RequestCtx) (string, bool) {
		// Peek decodes the query; an empty or absent key is the client's
		// mistake, never a key.
		k := string(ctx.QueryArgs().Peek("key"))
		if k == "" || len(k) > MaxKeyLen {
			s.refuse(ctx, fasthttp.StatusBadRequest, errs.InvalidArgument, fmt.Sprintf("the key parameter must be 1..%d bytes", MaxKeyLen))
			return "", false
		}
		return k, true
	}
	answer := func(ctx *fasthttp.RequestCtx, status, k string) {
		b, _ := json.Marshal(MetadataAnswer{Status: status, Key: k})
		ctx.SetContentType(ctype)
		ctx.SetBody(b)
	}
	keyParam := []api.Param{{Name: "key", Required: true, Description: "The key, e.g. mooncake/ram/<segment> (1..4096 bytes)."}}
	const desc = "Mooncake's HTTP metadata protocol, served from memory: the last PUT wins, DELETE of a missing key succeeds. " +
		"Values are stored as they are (engines store segment descriptors as JSON)."
	s.Route(api.Route{Method: "GET", Path: "/metadata", Auth: api.Metadata, Tag: "metadata", Query: keyParam,
		Summary: "Read a metadata value", Description: desc + " The answer is the value as stored.", AnswerType: ctype,
		Refusals: []int{404}, Handler: func(ctx *fasthttp.RequestCtx) {
			k, ok := key(ctx)
			if !ok {
				return
			}
			v, ok := s.kv.Get(k)
			if !ok {
				ops.Inc("get", "not_found")
				s.refuse(ctx, fasthttp.StatusNotFound, errs.NotFound, "metadata not found")
				return
			}
			ops.Inc("get", "ok")
			ctx.SetContentType(ctype)
			ctx.SetBody(v)
		}})
	s.Route(api.Route{Method: "GET", Path: "/metadata" + authsecret.ProofPath, Auth: api.Open, Tag: "metadata",
		Query: []api.Param{{Name: "nonce", Required: true,
			Description: "A fresh nonce from the client: 32..128 lowercase hex digits."}},
		Summary: "Prove that this sidecar holds the cluster secret",
		Description: "Asked by te's metadata and handoff clients on each new connection before the connection carries the token derived from the secret, so that the token " +
			"goes only to a server that holds the secret. Each proof is lowercase hex of HMAC-SHA256(key, nonce + \"\\n\" + instance), " +
			"key = HMAC-SHA256(secret, \"" + authsecret.ProofLabel + "\"), under the current secret and, during a rotation, the previous one. " +
			"Open: it reveals neither the secret nor the token. 404 without a cluster secret (nothing to prove).",
		Answer: reflect.TypeFor[authsecret.ProofAnswer](), Refusals: []int{404}, Handler: func(ctx *fasthttp.RequestCtx) {
			nonce := string(ctx.QueryArgs().Peek("nonce"))
			switch {
			case s.cfg.Secret == nil:
				ops.Inc("proof", "no_secret")
				s.refuse(ctx, fasthttp.StatusNotFound, errs.NotFound, "this sidecar has no cluster secret: it has nothing to prove")
				return
			case !authsecret.ValidNonce(nonce):
				ops.Inc("proof", "refused")
				s.refuse(ctx, fasthttp.StatusBadRequest, errs.InvalidArgument,
					fmt.Sprintf("the nonce must be %d..%d lowercase hex digits", authsecret.MinNonceLen, authsecret.MaxNonceLen))
				return
			}
			ops.Inc("proof", "ok")
			b, _ := json.Marshal(authsecret.ProofAnswer{Instance: s.instance, Proofs: s.cfg.Secret.Proofs(nonce, s.instance)})
			ctx.SetContentType(ctype)
			ctx.SetBody(b)
		}})
	s.Route(api.Route{Method: "PUT", Path: "/metadata", Auth: api.Metadata, Tag: "metadata", Query: keyParam,
		Summary: "Store a metadata value", Description: desc + " The body is the value (at most -max-value bytes).",
		RawBody: ctype, Answer: reflect.TypeFor[MetadataAnswer](), Refusals: []int{507}, Handler: func(ctx *fasthttp.RequestCtx) {
			k, ok := key(ctx)
			if !ok {
				return
			}
			body, status, err := s.ReadBody(ctx, s.cfg.MaxValue)
			if err != nil {
				ops.Inc("put", "refused")
				s.refuse(ctx, status, codeOf(status), err.Error())
				return
			}
			if err := s.kv.Put(k, body); err != nil {
				ops.Inc("put", "full")
				s.log.Warn("metadata store full", "max_keys", s.cfg.MaxKeys, "max_bytes", s.cfg.MaxMetadataBytes, "key", k)
				s.refuse(ctx, fasthttp.StatusInsufficientStorage, errs.ResourceExhausted, err.Error())
				return
			}
			ops.Inc("put", "ok")
			answer(ctx, "updated", k)
		}})
	s.Route(api.Route{Method: "DELETE", Path: "/metadata", Auth: api.Metadata, Tag: "metadata", Query: keyParam,
		Summary: "Delete a metadata value", Description: desc, Answer: reflect.TypeFor[MetadataAnswer](),
		Handler: func(ctx *fasthttp.RequestCtx) {
			k, ok := key(ctx)
			if !ok {
				return
			}
			if s.kv.Delete(k) {
				ops.Inc("delete", "ok")
			} else {
				ops.Inc("delete", "not_found")
			}
			answer(ctx, "deleted", k)
		}})
}

const ctype = "application/json; charset=utf-8"
