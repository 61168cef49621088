package main

/*
#cgo CFLAGS: -I${SRCDIR}/../include
#include <stdlib.h>
#include <string.h>
#include "te.h"
#include "entry.h"

// const-qualified names for the exports' parameters, so the prototypes cgo
// writes match te.h's and the compiler checks one against the other.
typedef const char te_cchar;
typedef const te_config_t te_cconfig;
typedef const te_region_t te_cregion;
typedef const te_request_t te_crequest;
typedef void *const te_caddr;
*/
import "C"

import (
	"runtime/debug"
	"unsafe"

	"github.com/tecache/te/capi/internal/glue"
	"github.com/tecache/te/engine"
	"github.com/tecache/te/internal/errs"
)

func main() {}

type segEntry struct {
	e *engine.Engine
	s *engine.Segment
}

type batchEntry struct {
	e *engine.Engine
	b *engine.Batch
}

var (
	engines  = glue.NewTable[*engine.Engine](glue.KindEngine)
	segments = glue.NewTable[segEntry](glue.KindSegment)
	batches  = glue.NewTable[batchEntry](glue.KindBatch)
)

// fail records err as the calling thread's last error and returns its code.
// It runs on the thread of the C call (an export's goroutine is locked to
// it), so the message lands in that thread's storage in entry.c.
func fail(err error) C.int {
	if err == nil {
		return 0
	}
	msg := glue.CutMessage(err.Error(), C.TECAPI_MAX_MESSAGE-1)
	if msg == "" {
		C.tecapi_set_error(nil, 0)
	} else {
		C.tecapi_set_error((*C.char)(unsafe.Pointer(unsafe.StringData(msg))), C.size_t(len(msg)))
	}
	return C.int(glue.Code(err))
}

// enter starts every export as `defer enter(op, &rc)()`. A fault on a bad
// pointer the caller passed becomes a panic rather than a crash, and the
// returned function turns any panic into TE_ERR_INTERNAL.
func enter(op string, rc *C.int) func() {
	debug.SetPanicOnFault(true)
	return func() {
		if v := recover(); v != nil {
			*rc = fail(glue.FromPanic(op, v))
		}
	}
}

func null(op, what string) C.int {
	return fail(errs.New(errs.InvalidArgument, op, "%s is NULL", what))
}

func addr(p unsafe.Pointer) uint64 { return uint64(uintptr(p)) }

// cbuf views the caller's output buffer.
func cbuf(p *C.char, n C.size_t) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(p)), int(n))
}

// putString writes s into the caller's buffer, NUL-terminated.
func putString(op string, buf *C.char, n C.size_t, s string) C.int {
	if buf == nil || n == 0 {
		return fail(errs.New(errs.InvalidArgument, op, "output buffer is NULL or empty"))
	}
	if glue.CopyString(cbuf(buf, n), s) {
		return fail(errs.New(errs.BufferTooSmall, op, "%d bytes needed, buffer holds %d", len(s)+1, int(n)))
	}
	return 0
}

// cstr copies a C string; NULL reads as "".
func cstr(p *C.te_cchar) string { return C.GoString((*C.char)(p)) }

func cbytes(p *C.te_cchar, n C.size_t) string {
	if p == nil || n == 0 {
		return ""
	}
	return string(unsafe.Slice((*byte)(unsafe.Pointer(p)), int(n)))
}
