package glue

import (
	"strings"
	"sync"

	"github.com/tecache/te/internal/errs"
)

// Kind is the type of object a handle names. It lives in the handle's top
// byte, so a segment handle passed where a batch is expected is refused
// instead of naming some unrelated batch.
type Kind uint8

// Handle kinds.
const (
	KindEngine  Kind = 1
	KindSegment Kind = 2
	KindBatch   Kind = 3
	KindStore   Kind = 8 // a metadata store connection (te_store_open)
)

// handle names a handle of kind k with its article: "an engine handle".
func (k Kind) handle() string {
	n := k.String()
	switch {
	case n == "unknown":
		return "a handle of unknown kind"
	case strings.ContainsRune("aeiou", rune(n[0])):
		return "an " + n + " handle"
	}
	return "a " + n + " handle"
}

func (k Kind) String() string {
	switch k {
	case KindEngine:
		return "engine"
	case KindSegment:
		return "segment"
	case KindBatch:
		return "batch"
	case KindStore:
		return "store"
	}
	return kvKindName(k)
}

const (
	kindShift = 56
	seqMask   = 1<<kindShift - 1
)

// KindOf returns the kind encoded in h.
func KindOf(h uint64) Kind { return Kind(h >> kindShift) }

type entry[T any] struct {
	owner uint64
	val   T
}

// Table maps handles of one kind to values. Handles are never reused within
// a process (a 56-bit counter), so a stale handle cannot name a newer object.
// The zero handle is never issued. Safe for concurrent use.
type Table[T any] struct {
	kind Kind
	mu   sync.RWMutex
	next uint64
	m    map[uint64]entry[T]
}

// NewTable returns an empty table issuing handles of kind k.
func NewTable[T any](k Kind) *Table[T] {
	return &Table[T]{kind: k, m: map[uint64]entry[T]{}}
}

// Put stores v, owned by owner (0 for none), and returns its new handle.
func (t *Table[T]) Put(owner uint64, v T) uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.next++
	h := uint64(t.kind)<<kindShift | t.next&seqMask
	t.m[h] = entry[T]{owner, v}
	return h
}

// Get returns the value and owner of h, or an InvalidArgument error naming
// what is wrong with h.
func (t *Table[T]) Get(op string, h uint64) (T, uint64, error) {
	t.mu.RLock()
	e, ok := t.m[h]
	t.mu.RUnlock()
	if !ok {
		var zero T
		return zero, 0, t.bad(op, h)
	}
	return e.val, e.owner, nil
}

// Delete removes h and returns its value.
func (t *Table[T]) Delete(op string, h uint64) (T, error) {
	t.mu.Lock()
	e, ok := t.m[h]
	delete(t.m, h)
	t.mu.Unlock()
	if !ok {
		var zero T
		return zero, t.bad(op, h)
	}
	return e.val, nil
}

// DeleteIf calls check with h's value under the table's lock and removes h
// when check returns nil, so the check and the removal cannot interleave
// with another Delete of the same handle.
func (t *Table[T]) DeleteIf(op string, h uint64, check func(T) error) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	e, ok := t.m[h]
	if !ok {
		return t.bad(op, h)
	}
	if err := check(e.val); err != nil {
		return err
	}
	delete(t.m, h)
	return nil
}

// DropOwner removes every handle owned by owner and returns their values.
func (t *Table[T]) DropOwner(owner uint64) []T {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []T
	for h, e := range t.m {
		if e.owner == owner {
			out = append(out, e.val)
			delete(t.m, h)
		}
	}
	return out
}

// Len returns the number of live handles.
func (t *Table[T]) Len() int {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return len(t.m)
}

func (t *Table[T]) bad(op string, h uint64) error {
	switch {
	case h == 0:
		return errs.New(errs.InvalidArgument, op, "%s handle is 0", t.kind)
	case KindOf(h) != t.kind:
		return errs.New(errs.InvalidArgument, op, "handle %#x is %s, not %s", h, KindOf(h).handle(), t.kind.handle())
	}
	return errs.New(errs.InvalidArgument, op, "%s handle %#x is not open (closed, freed or never issued)", t.kind, h)
}
