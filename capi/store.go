package main

/*
#include <string.h>
#include "te.h"
typedef const char te_cchar;
typedef const void te_cvoid;
*/
import "C"

import (
	"context"
	"sync"
	"unsafe"

	"github.com/tecache/te/capi/internal/glue"
	"github.com/tecache/te/engine/meta"
	"github.com/tecache/te/internal/errs"
)

// Bounds on what one store call copies from or to the caller: keys as etcd
// and redis take them, values well above te's own descriptors and NIXL's
// agent metadata (16 MiB), below the point where one call ties up memory.
const (
	maxStoreKey   = 4096
	maxStoreValue = 64 << 20
	// Watched prefixes per handle, and changed keys held for
	// te_store_changes: past maxPending the keys collapse into their
	// watched prefixes ("everything under it changed"), as a watch reports
	// after a reconnection, so a flood costs bounded memory.
	maxWatches      = 4096
	maxPending      = 65536
	maxPendingBytes = 1 << 20
)

// storeEntry is a store handle: the store, and the changes its watches saw.
type storeEntry struct {
	s meta.Store

	mu      sync.Mutex
	watches map[string]context.CancelFunc // prefix -> its watch
	pending map[string]struct{}
	order   []string // pending in arrival order
	bytes   int      // of order, a NUL after each
}

func (e *storeEntry) changed(prefix, key string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, ok := e.watches[prefix]; !ok {
		return // unwatched meanwhile
	}
	if _, ok := e.pending[key]; ok {
		return
	}
	if len(e.pending) >= maxPending || e.bytes+len(key)+1 > maxPendingBytes {
		e.pending, e.order, e.bytes = map[string]struct{}{}, nil, 0
		for p := range e.watches {
			e.add(p)
		}
		return
	}
	e.add(key)
}

func (e *storeEntry) add(key string) {
	e.pending[key] = struct{}{}
	e.order = append(e.order, key)
	e.bytes += len(key) + 1
}

func (e *storeEntry) stopWatches() {
	e.mu.Lock()
	defer e.mu.Unlock()
	for p, cancel := range e.watches {
		cancel()
		delete(e.watches, p)
	}
}

// Stores belong to no engine (owner 0): te_destroy leaves them.
var stores = glue.NewTable[*storeEntry](glue.KindStore)

// storeAndKey resolves the handle and reads the key, the first steps of
// every call on a store.
func storeAndKey(op string, h C.te_store_t, key *C.te_cchar) (*storeEntry, string, error) {
	e, _, err := stores.Get(op, uint64(h))
	if err != nil {
		return nil, "", err
	}
	k, err := storeKey(op, key)
	return e, k, err
}

func storeKey(op string, p *C.te_cchar) (string, error) {
	if p == nil {
		return "", errs.New(errs.InvalidArgument, op, "key is NULL")
	}
	k := C.GoStringN((*C.char)(p), C.int(C.strnlen((*C.char)(p), maxStoreKey+1)))
	switch {
	case k == "":
		return "", errs.New(errs.InvalidArgument, op, "empty key")
	case len(k) > maxStoreKey:
		return "", errs.New(errs.TooLarge, op, "key exceeds %d bytes", maxStoreKey)
	}
	return k, nil
}

//export tego_store_open
func tego_store_open(conn *C.te_cchar, out *C.te_store_t) (rc C.int) {
	const op = "store open"
	defer enter(op, &rc)()
	if out == nil {
		return null(op, "out")
	}
	*out = 0
	c := cstr(conn)
	if meta.IsP2P(c) {
		return fail(errs.New(errs.InvalidArgument, op, "%q names no store", c).
			WithHint("give etcd://host:port[,host:port], redis://host:port or http://host:port/metadata"))
	}
	s, err := meta.Open(c)
	if err != nil {
		return fail(err)
	}
	*out = C.te_store_t(stores.Put(0, &storeEntry{s: s, watches: map[string]context.CancelFunc{},
		pending: map[string]struct{}{}}))
	return 0
}

//export tego_store_put
func tego_store_put(h C.te_store_t, key *C.te_cchar, value *C.te_cvoid, n C.size_t) (rc C.int) {
	const op = "store put"
	defer enter(op, &rc)()
	e, k, err := storeAndKey(op, h, key)
	if err != nil {
		return fail(err)
	}
	if n > maxStoreValue {
		return fail(errs.New(errs.TooLarge, op, "value of %d bytes exceeds %d", uint64(n), maxStoreValue))
	}
	if value == nil && n > 0 {
		return null(op, "value")
	}
	v := []byte{}
	if n > 0 {
		v = append(v, unsafe.Slice((*byte)(unsafe.Pointer(value)), int(n))...)
	}
	return fail(e.s.Put(context.Background(), k, v))
}

//export tego_store_get
func tego_store_get(h C.te_store_t, key *C.te_cchar, buf *C.char, capacity C.size_t, n *C.size_t) (rc C.int) {
	const op = "store get"
	defer enter(op, &rc)()
	if n == nil {
		return null(op, "len")
	}
	*n = 0
	if buf == nil && capacity > 0 {
		return null(op, "buf")
	}
	e, k, err := storeAndKey(op, h, key)
	if err != nil {
		return fail(err)
	}
	v, err := e.s.Get(context.Background(), k)
	if err != nil {
		return fail(err)
	}
	*n = C.size_t(len(v))
	if len(v) > int(capacity) {
		return fail(errs.New(errs.BufferTooSmall, op, "value of %q is %d bytes, buffer holds %d", k, len(v), int(capacity)))
	}
	copy(cbuf(buf, capacity), v)
	return 0
}

//export tego_store_delete
func tego_store_delete(h C.te_store_t, key *C.te_cchar) (rc C.int) {
	const op = "store delete"
	defer enter(op, &rc)()
	e, k, err := storeAndKey(op, h, key)
	if err != nil {
		return fail(err)
	}
	return fail(e.s.Delete(context.Background(), k))
}

//export tego_store_close
func tego_store_close(h C.te_store_t) (rc C.int) {
	const op = "store close"
	defer enter(op, &rc)()
	e, err := stores.Delete(op, uint64(h))
	if err != nil {
		return fail(err)
	}
	e.stopWatches()
	return fail(e.s.Close())
}

//export tego_store_watch
func tego_store_watch(h C.te_store_t, prefix *C.te_cchar) (rc C.int) {
	const op = "store watch"
	defer enter(op, &rc)()
	e, p, err := storeAndKey(op, h, prefix)
	if err != nil {
		return fail(err)
	}
	w, ok := e.s.(meta.Watcher)
	if !ok {
		return fail(errs.New(errs.NotSupported, op, "this store does not push changes (only etcd does)"))
	}
	e.mu.Lock()
	if _, ok := e.watches[p]; ok {
		e.mu.Unlock()
		return 0
	}
	if len(e.watches) >= maxWatches {
		e.mu.Unlock()
		return fail(errs.New(errs.ResourceExhausted, op, "%d prefixes watched already", maxWatches))
	}
	ctx, cancel := context.WithCancel(context.Background())
	e.watches[p] = cancel
	e.mu.Unlock()
	if err := w.Watch(ctx, p, func(key string) { e.changed(p, key) }); err != nil {
		e.mu.Lock()
		delete(e.watches, p)
		e.mu.Unlock()
		cancel()
		return fail(err)
	}
	return 0
}

//export tego_store_unwatch
func tego_store_unwatch(h C.te_store_t, prefix *C.te_cchar) (rc C.int) {
	const op = "store unwatch"
	defer enter(op, &rc)()
	e, p, err := storeAndKey(op, h, prefix)
	if err != nil {
		return fail(err)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if cancel, ok := e.watches[p]; ok {
		cancel()
		delete(e.watches, p)
	}
	return 0
}

//export tego_store_changes
func tego_store_changes(h C.te_store_t, buf *C.char, capacity C.size_t, n *C.size_t) (rc C.int) {
	const op = "store changes"
	defer enter(op, &rc)()
	if n == nil {
		return null(op, "len")
	}
	*n = 0
	if buf == nil && capacity > 0 {
		return null(op, "buf")
	}
	e, _, err := stores.Get(op, uint64(h))
	if err != nil {
		return fail(err)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	need := e.bytes
	*n = C.size_t(need)
	if need > int(capacity) {
		return fail(errs.New(errs.BufferTooSmall, op, "%d bytes of changed keys, buffer holds %d", need, int(capacity)))
	}
	dst := cbuf(buf, capacity)
	off := 0
	for _, k := range e.order {
		off += copy(dst[off:], k)
		dst[off] = 0
		off++
	}
	e.pending, e.order, e.bytes = map[string]struct{}{}, nil, 0
	return 0
}
