package main

/*
#include "te.h"
typedef const char te_cchar;
typedef const te_region_t te_cregion;
typedef void *const te_caddr;
*/
import "C"

import (
	"unsafe"

	"github.com/tecache/te/engine"
	"github.com/tecache/te/internal/errs"
)

// maxBatchItems bounds the n of the batch calls before anything is read.
const maxBatchItems = 1 << 24

//export tego_register
func tego_register(h C.te_engine_t, p unsafe.Pointer, length C.uint64_t, location *C.te_cchar, remote C.int32_t) (rc C.int) {
	defer enter("register", &rc)()
	e, err := getEngine("register", h)
	if err != nil {
		return fail(err)
	}
	if p == nil {
		return null("register", "addr")
	}
	return fail(e.RegisterMemory(addr(p), uint64(length), cstr(location), remote != 0))
}

//export tego_unregister
func tego_unregister(h C.te_engine_t, p unsafe.Pointer) (rc C.int) {
	defer enter("unregister", &rc)()
	e, err := getEngine("unregister", h)
	if err != nil {
		return fail(err)
	}
	if p == nil {
		return null("unregister", "addr")
	}
	return fail(e.UnregisterMemory(addr(p)))
}

//export tego_register_batch
func tego_register_batch(h C.te_engine_t, regions *C.te_cregion, n C.size_t) (rc C.int) {
	defer enter("register batch", &rc)()
	e, err := getEngine("register batch", h)
	if err != nil {
		return fail(err)
	}
	if regions == nil {
		return null("register batch", "regions")
	}
	if n == 0 || n > maxBatchItems {
		return fail(errs.New(errs.InvalidArgument, "register batch", "n is %d, want 1..%d", n, maxBatchItems))
	}
	rs := make([]engine.MemoryRegion, n)
	for i, r := range unsafe.Slice((*C.te_region_t)(unsafe.Pointer(regions)), int(n)) {
		if r.addr == nil {
			return fail(errs.New(errs.InvalidArgument, "register batch", "region %d: addr is NULL", i))
		}
		rs[i] = engine.MemoryRegion{Addr: addr(r.addr), Length: uint64(r.length),
			Location: C.GoString(r.location), Remote: r.remote != 0}
	}
	return fail(e.RegisterMemoryBatch(rs))
}

//export tego_unregister_batch
func tego_unregister_batch(h C.te_engine_t, addrs *C.te_caddr, n C.size_t) (rc C.int) {
	defer enter("unregister batch", &rc)()
	e, err := getEngine("unregister batch", h)
	if err != nil {
		return fail(err)
	}
	if addrs == nil {
		return null("unregister batch", "addrs")
	}
	if n == 0 || n > maxBatchItems {
		return fail(errs.New(errs.InvalidArgument, "unregister batch", "n is %d, want 1..%d", n, maxBatchItems))
	}
	as := make([]uint64, n)
	for i, p := range unsafe.Slice((*unsafe.Pointer)(unsafe.Pointer(addrs)), int(n)) {
		if p == nil {
			return fail(errs.New(errs.InvalidArgument, "unregister batch", "address %d is NULL", i))
		}
		as[i] = addr(p)
	}
	return fail(e.UnregisterMemoryBatch(as))
}
