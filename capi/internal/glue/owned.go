package glue

import "slices"

// Owned is one value of a table with its handle.
type Owned[T any] struct {
	h uint64
	v T
}

// H returns the handle.
func (o Owned[T]) H() uint64 { return o.h }

// V returns the value.
func (o Owned[T]) V() T { return o.v }

// DropOwnerHandles removes every handle owned by owner and returns them with
// their values.
func (t *Table[T]) DropOwnerHandles(owner uint64) []Owned[T] {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []Owned[T]
	for h, e := range t.m {
		if e.owner == owner {
			out = append(out, Owned[T]{h, e.val})
			delete(t.m, h)
		}
	}
	return out
}

// Owned returns the values owned by owner, in handle order (the order they
// were issued).
func (t *Table[T]) Owned(owner uint64) []T {
	t.mu.RLock()
	var hs []uint64
	for h, e := range t.m {
		if e.owner == owner {
			hs = append(hs, h)
		}
	}
	t.mu.RUnlock()
	slices.Sort(hs)
	out := make([]T, 0, len(hs))
	t.mu.RLock()
	defer t.mu.RUnlock()
	for _, h := range hs {
		if e, ok := t.m[h]; ok {
			out = append(out, e.val)
		}
	}
	return out
}
