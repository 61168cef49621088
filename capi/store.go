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
)

// Stores belong to no engine (owner 0): te_destroy leaves them.
var stores = glue.NewTable[meta.Store](glue.KindStore)

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
	*out = C.te_store_t(stores.Put(0, s))
	return 0
}

//export tego_store_put
func tego_store_put(h C.te_store_t, key *C.te_cchar, value *C.te_cvoid, n C.size_t) (rc C.int) {
	const op = "store put"
	defer enter(op, &rc)()
	s, _, err := stores.Get(op, uint64(h))
	if err != nil {
		return fail(err)
	}
	k, err := storeKey(op, key)
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
	return fail(s.Put(context.Background(), k, v))
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
	s, _, err := stores.Get(op, uint64(h))
	if err != nil {
		return fail(err)
	}
	k, err := storeKey(op, key)
	if err != nil {
		return fail(err)
	}
	v, err := s.Get(context.Background(), k)
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
	s, _, err := stores.Get(op, uint64(h))
	if err != nil {
		return fail(err)
	}
	k, err := storeKey(op, key)
	if err != nil {
		return fail(err)
	}
	return fail(s.Delete(context.Background(), k))
}

//export tego_store_close
func tego_store_close(h C.te_store_t) (rc C.int) {
	const op = "store close"
	defer enter(op, &rc)()
	s, err := stores.Delete(op, uint64(h))
	if err != nil {
		return fail(err)
	}
	return fail(s.Close())
}
