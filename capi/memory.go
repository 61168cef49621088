package main

/*
#include "te.h"
typedef const char te_cchar;
typedef const te_region_t te_cregion;
typedef void *const te_caddr;
typedef const te_range_t te_crange;
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

// fileFlags are the TE_FILE_* flags te_register_file knows.
const fileFlags = C.TE_FILE_REMOTE | C.TE_FILE_CREATE | C.TE_FILE_READ_ONLY | C.TE_FILE_NO_DIRECT

//export tego_register_file
func tego_register_file(h C.te_engine_t, path *C.te_cchar, fd C.int32_t, offset, length C.uint64_t, flags C.uint32_t,
	out *unsafe.Pointer) (rc C.int) {
	defer enter("register file", &rc)()
	e, err := getEngine("register file", h)
	if err != nil {
		return fail(err)
	}
	if out == nil {
		return null("register file", "addr")
	}
	*out = nil
	if flags&^fileFlags != 0 {
		return fail(errs.New(errs.InvalidArgument, "register file", "unknown flags %#x", uint32(flags&^fileFlags)))
	}
	o := engine.FileOptions{Remote: flags&C.TE_FILE_REMOTE != 0, Create: flags&C.TE_FILE_CREATE != 0,
		ReadOnly: flags&C.TE_FILE_READ_ONLY != 0, NoDirect: flags&C.TE_FILE_NO_DIRECT != 0}
	var a uint64
	switch {
	case path != nil && fd >= 0:
		return fail(errs.New(errs.InvalidArgument, "register file", "both a path and fd %d: give one", fd))
	case path != nil:
		a, err = e.RegisterFile(cstr(path), uint64(offset), uint64(length), o)
	case fd >= 0:
		a, err = e.RegisterFileFD(int(fd), uint64(offset), uint64(length), o)
	default:
		return fail(errs.New(errs.InvalidArgument, "register file", "neither a path nor a file descriptor"))
	}
	if err != nil {
		return fail(err)
	}
	*out = ptr(a)
	return 0
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

// ptr turns an address the engine handed out (a storage buffer's, never
// dereferenced) into the C caller's void*.
func ptr(a uint64) unsafe.Pointer { return *(*unsafe.Pointer)(unsafe.Pointer(&a)) }

//export tego_grant_window_to
func tego_grant_window_to(h C.te_engine_t, peer *C.te_cchar, ranges *C.te_crange, n C.size_t, key *C.uint64_t) (rc C.int) {
	defer enter("grant window", &rc)()
	var name string
	if peer != nil {
		name = cstr(peer)
	}
	return grantWindow(h, ranges, n, key, func(e *engine.Engine, rs []engine.Range) (uint64, error) { return e.GrantWindowTo(name, rs) })
}

//export tego_grant_window_to_first
func tego_grant_window_to_first(h C.te_engine_t, ranges *C.te_crange, n C.size_t, key *C.uint64_t) (rc C.int) {
	defer enter("grant window", &rc)()
	return grantWindow(h, ranges, n, key, (*engine.Engine).GrantWindowToFirst)
}

// grantWindow checks the arguments of a grant and stores the key grant
// returns in *key (0 on failure).
func grantWindow(h C.te_engine_t, ranges *C.te_crange, n C.size_t, key *C.uint64_t, grant func(*engine.Engine, []engine.Range) (uint64, error)) C.int {
	if key != nil {
		*key = 0
	}
	e, err := getEngine("grant window", h)
	if err != nil {
		return fail(err)
	}
	if ranges == nil {
		return null("grant window", "ranges")
	}
	if key == nil {
		return null("grant window", "key")
	}
	if n == 0 || n > maxBatchItems {
		return fail(errs.New(errs.InvalidArgument, "grant window", "n is %d, want 1..%d", n, maxBatchItems))
	}
	rs := make([]engine.Range, n)
	for i, r := range unsafe.Slice((*C.te_range_t)(unsafe.Pointer(ranges)), int(n)) {
		rs[i] = engine.Range{Addr: uint64(r.addr), Length: uint64(r.length)}
	}
	k, err := grant(e, rs)
	if err != nil {
		return fail(err)
	}
	*key = C.uint64_t(k)
	return 0
}

//export tego_bind_window
func tego_bind_window(h C.te_engine_t, key C.uint64_t, peer *C.te_cchar) (rc C.int) {
	defer enter("bind window", &rc)()
	e, err := getEngine("bind window", h)
	if err != nil {
		return fail(err)
	}
	if peer == nil {
		return null("bind window", "peer")
	}
	return fail(e.BindWindow(uint64(key), cstr(peer)))
}

//export tego_revoke_window
func tego_revoke_window(h C.te_engine_t, key C.uint64_t) (rc C.int) {
	defer enter("revoke window", &rc)()
	e, err := getEngine("revoke window", h)
	if err != nil {
		return fail(err)
	}
	return fail(e.RevokeWindow(uint64(key)))
}
