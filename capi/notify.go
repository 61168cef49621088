package main

/*
#include <stdlib.h>
#include <string.h>
#include "te.h"
typedef const char te_cchar;
*/
import "C"

import (
	"unsafe"

	"github.com/tecache/te/engine"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/wire"
)

// notifyLimits refuses oversized notifications before their bytes are copied.
func notifyLimits(op string, name *C.te_cchar, msgLen C.size_t) error {
	if msgLen > wire.MaxNotifyMsg {
		return errs.New(errs.TooLarge, op, "message of %d bytes exceeds %d", msgLen, wire.MaxNotifyMsg)
	}
	if n := C.strnlen((*C.char)(name), wire.MaxNotifyName+1); n > wire.MaxNotifyName {
		return errs.New(errs.TooLarge, op, "notification name exceeds %d bytes", wire.MaxNotifyName)
	}
	return nil
}

//export tego_notify_send
func tego_notify_send(h C.te_engine_t, segment, name, msg *C.te_cchar, msgLen C.size_t) (rc C.int) {
	defer enter("notify", &rc)()
	e, err := getEngine("notify", h)
	if err != nil {
		return fail(err)
	}
	if segment == nil {
		return null("notify", "segment")
	}
	if name == nil {
		return null("notify", "name")
	}
	if msg == nil && msgLen > 0 {
		return null("notify", "msg")
	}
	if err := notifyLimits("notify", name, msgLen); err != nil {
		return fail(err)
	}
	return fail(e.SendNotify(cstr(segment), cstr(name), cbytes(msg, msgLen)))
}

//export tego_notify_drain
func tego_notify_drain(h C.te_engine_t, out **C.te_notify_t, count *C.size_t) (rc C.int) {
	defer enter("notify drain", &rc)()
	return drainExport(h, (*unsafe.Pointer)(unsafe.Pointer(out)), count, false)
}

//export tego_notify_drain_from
func tego_notify_drain_from(h C.te_engine_t, out **C.te_notify_from_t, count *C.size_t) (rc C.int) {
	defer enter("notify drain", &rc)()
	return drainExport(h, (*unsafe.Pointer)(unsafe.Pointer(out)), count, true)
}

// drainExport is te_notify_drain (senders false: te_notify_t entries) and
// te_notify_drain_from (te_notify_from_t entries).
func drainExport(h C.te_engine_t, out *unsafe.Pointer, count *C.size_t, senders bool) C.int {
	e, err := getEngine("notify drain", h)
	if err != nil {
		return fail(err)
	}
	if out == nil || count == nil {
		return null("notify drain", "out or count")
	}
	*out, *count = nil, 0
	entry := unsafe.Sizeof(C.te_notify_t{})
	if senders {
		entry = unsafe.Sizeof(C.te_notify_from_t{})
	}
	base, n, err := drainNotifies(h, e, "notify drain", entry, senders,
		func(base unsafe.Pointer, i int, name, msg, from, inst *C.char, msgLen int) {
			if !senders {
				e := &unsafe.Slice((*C.te_notify_t)(base), i+1)[i]
				e.name, e.msg, e.msg_len = name, msg, C.uint64_t(msgLen)
				return
			}
			e := &unsafe.Slice((*C.te_notify_from_t)(base), i+1)[i]
			e.name, e.msg, e.msg_len = name, msg, C.uint64_t(msgLen)
			e.sender, e.sender_instance = from, inst
		})
	if err != nil {
		return fail(err)
	}
	*out, *count = base, C.size_t(n)
	return 0
}

// drainNotifies drains engine h's notifications into one malloc'ed block,
// so that te_notify_free is a single free(): count entries of entry bytes,
// then each string with a NUL (with senders: the sender's name and
// instance too); set fills entry i. It returns nil and 0 when there are
// none.
func drainNotifies(h C.te_engine_t, e *engine.Engine, op string, entry uintptr, senders bool,
	set func(base unsafe.Pointer, i int, name, msg, from, inst *C.char, msgLen int)) (unsafe.Pointer, int, error) {
	ns := engineNotifies(uint64(h), e) // handoff clients keep the completions they read
	if len(ns) == 0 {
		return nil, 0, nil
	}
	total := entry * uintptr(len(ns))
	for _, n := range ns {
		total += uintptr(len(n.Name) + 1 + len(n.Msg) + 1)
		if senders {
			total += uintptr(len(n.From) + 1 + len(n.FromInstance) + 1)
		}
	}
	base := C.malloc(C.size_t(total))
	if base == nil {
		// The notifications are lost to this caller; say so.
		return nil, 0, errs.New(errs.NoMemory, op, "allocating %d bytes for %d notifications (dropped)", total, len(ns))
	}
	mem := unsafe.Slice((*byte)(base), total)
	off := entry * uintptr(len(ns))
	put := func(s string) *C.char {
		p := (*C.char)(unsafe.Pointer(&mem[off]))
		copy(mem[off:], s)
		mem[off+uintptr(len(s))] = 0
		off += uintptr(len(s)) + 1
		return p
	}
	for i, n := range ns {
		name, msg := put(n.Name), put(n.Msg)
		var from, inst *C.char
		if senders {
			from, inst = put(n.From), put(n.FromInstance)
		}
		set(base, i, name, msg, from, inst, len(n.Msg))
	}
	return base, len(ns), nil
}

//export tego_probe
func tego_probe(h C.te_engine_t, segment *C.te_cchar, out *C.te_probe_t) (rc C.int) {
	defer enter("probe", &rc)()
	e, err := getEngine("probe", h)
	if err != nil {
		return fail(err)
	}
	if segment == nil {
		return null("probe", "segment")
	}
	p, err := e.Probe(cstr(segment))
	if err != nil {
		return fail(err)
	}
	if out != nil {
		out.rtt_ns = C.uint64_t(p.RTT.Nanoseconds())
		out.version = C.uint64_t(p.Version)
		copyCut(unsafe.Slice((*byte)(unsafe.Pointer(&out.instance[0])), len(out.instance)), p.Instance)
	}
	return 0
}
