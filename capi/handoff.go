package main

/*
#include "te.h"
typedef const char te_cchar;
typedef const int32_t te_cblock;
*/
import "C"

import (
	"context"
	"unsafe"

	"github.com/tecache/te/capi/internal/glue"
	"github.com/tecache/te/engine"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/kvcache/handoff"
)

type handoffEntry struct {
	c *handoff.Client
}

// Handoff clients are owned by their engine, transfers by their client.
var (
	handoffs  = glue.NewTable[handoffEntry](glue.KindHandoff)
	transfers = glue.NewTable[*glue.Xfer](glue.KindTransfer)
)

// dropHandoffs releases the handoff clients of engine h (te_destroy): their
// unfinished transfers are aborted while the engine still runs, so that a
// moving side can report and a waiting side's blocks are released.
func dropHandoffs(h uint64) {
	for _, client := range handoffs.DropOwnerHandles(h) {
		destroyClient(client.H(), client.V())
	}
}

func destroyClient(h uint64, he handoffEntry) {
	glue.ReleaseAll(transfers.DropOwner(h))
	he.c.Close()
}

// engineNotifies is what te_notify_drain returns for engine h: when handoff
// clients read the engine's notifications, the ones they do not consume.
func engineNotifies(h uint64, e *engine.Engine) []engine.Notification {
	cs := handoffs.Owned(h)
	if len(cs) == 0 {
		return e.Notifies()
	}
	var out []engine.Notification
	for _, he := range cs {
		out = append(out, he.c.Notifies()...)
	}
	return out
}

//export tego_handoff_create
func tego_handoff_create(h C.te_engine_t, sidecar *C.te_cchar, out *C.te_handoff_t) (rc C.int) {
	defer enter("handoff create", &rc)()
	e, err := getEngine("handoff create", h)
	if err != nil {
		return fail(err)
	}
	if sidecar == nil {
		return null("handoff create", "sidecar")
	}
	if out == nil {
		return null("handoff create", "out")
	}
	*out = 0
	syncEnv() // TE_AUTH_SECRET as the host has it now (ops.go)
	c, err := handoff.New(e, handoff.Options{Sidecar: cstr(sidecar)})
	if err != nil {
		return fail(err)
	}
	*out = C.te_handoff_t(handoffs.Put(uint64(h), handoffEntry{c}))
	return 0
}

//export tego_handoff_destroy
func tego_handoff_destroy(h C.te_handoff_t) (rc C.int) {
	defer enter("handoff destroy", &rc)()
	he, err := handoffs.Delete("handoff destroy", uint64(h))
	if err != nil {
		return fail(err)
	}
	destroyClient(uint64(h), he)
	return 0
}

func declare(op string, prefill bool, h C.te_handoff_t, id *C.te_cchar, lh C.te_layout_t, blocks *C.te_cblock, n C.size_t,
	mode C.int32_t, timeoutMS C.int64_t, out *C.te_xfer_t) C.int {
	he, _, err := handoffs.Get(op, uint64(h))
	if err != nil {
		return fail(err)
	}
	if out == nil {
		return null(op, "out")
	}
	*out = 0
	if id == nil {
		return null(op, "id")
	}
	l, _, err := layouts.Get(op, uint64(lh))
	if err != nil {
		return fail(err)
	}
	bs, err := blockList(op, "", blocks, n)
	if err != nil {
		return fail(err)
	}
	m, err := glue.ModeOf(op, int32(mode))
	if err != nil {
		return fail(err)
	}
	to, err := glue.DeclTimeout(op, int64(timeoutMS))
	if err != nil {
		return fail(err)
	}
	r := handoff.Request{ID: cstr(id), Layout: l, Blocks: bs, Mode: m, Timeout: to}
	var t *handoff.Transfer
	if prefill {
		t, err = he.c.Ready(context.Background(), r)
	} else {
		t, err = he.c.Expect(context.Background(), r)
	}
	if err != nil {
		return fail(err)
	}
	*out = C.te_xfer_t(transfers.Put(uint64(h), glue.NewXfer(t)))
	return 0
}

//export tego_handoff_expect
func tego_handoff_expect(h C.te_handoff_t, id *C.te_cchar, layout C.te_layout_t, blocks *C.te_cblock, n C.size_t,
	mode C.int32_t, timeoutMS C.int64_t, out *C.te_xfer_t) (rc C.int) {
	defer enter("handoff expect", &rc)()
	return declare("handoff expect", false, h, id, layout, blocks, n, mode, timeoutMS, out)
}

//export tego_handoff_ready
func tego_handoff_ready(h C.te_handoff_t, id *C.te_cchar, layout C.te_layout_t, blocks *C.te_cblock, n C.size_t,
	mode C.int32_t, timeoutMS C.int64_t, out *C.te_xfer_t) (rc C.int) {
	defer enter("handoff ready", &rc)()
	return declare("handoff ready", true, h, id, layout, blocks, n, mode, timeoutMS, out)
}

//export tego_handoff_send_layer
func tego_handoff_send_layer(h C.te_xfer_t, layer C.int32_t, timeoutMS C.int64_t) (rc C.int) {
	defer enter("handoff send layer", &rc)()
	x, _, err := transfers.Get("handoff send layer", uint64(h))
	if err != nil {
		return fail(err)
	}
	return fail(x.SendLayer(int(layer), int64(timeoutMS)))
}

func putResult(op string, out *C.te_handoff_result_t, r handoff.Result) error {
	if out == nil {
		return nil
	}
	v := C.te_handoff_result_t{
		mode: C.int32_t(glue.ModeNumber(r.Mode)), bytes: C.uint64_t(r.Bytes),
		block_requests: C.uint64_t(r.BlockRequests), requests: C.uint64_t(r.Requests),
		elapsed_ns: C.uint64_t(r.Elapsed.Nanoseconds()),
	}
	if r.Mover {
		v.mover = 1
	}
	if r.Recorded {
		v.recorded = 1
	}
	copyCut(unsafe.Slice((*byte)(unsafe.Pointer(&v.transport[0])), len(v.transport)), r.Transport)
	return putSized(op, unsafe.Pointer(out), unsafe.Pointer(&v), unsafe.Sizeof(v))
}

func waitXfer(op string, h C.te_xfer_t, timeoutMS C.int64_t, out *C.te_handoff_result_t) C.int {
	x, _, err := transfers.Get(op, uint64(h))
	if err != nil {
		return fail(err)
	}
	if out != nil && (out.size < 4 || out.size > maxConfigSize) {
		// Checked before waiting: a transfer must not finish unseen.
		return fail(errs.New(errs.InvalidArgument, op, "out->size is %d; set it to sizeof(te_handoff_result_t)", out.size))
	}
	r, werr := x.Wait(int64(timeoutMS))
	if err := putResult(op, out, r); err != nil {
		return fail(err)
	}
	return fail(werr)
}

//export tego_handoff_wait
func tego_handoff_wait(h C.te_xfer_t, timeoutMS C.int64_t, out *C.te_handoff_result_t) (rc C.int) {
	defer enter("handoff wait", &rc)()
	return waitXfer("handoff wait", h, timeoutMS, out)
}

//export tego_handoff_send
func tego_handoff_send(h C.te_xfer_t, timeoutMS C.int64_t, out *C.te_handoff_result_t) (rc C.int) {
	defer enter("handoff send", &rc)()
	return waitXfer("handoff send", h, timeoutMS, out)
}

//export tego_handoff_abort
func tego_handoff_abort(h C.te_xfer_t, reason *C.te_cchar) (rc C.int) {
	defer enter("handoff abort", &rc)()
	x, _, err := transfers.Get("handoff abort", uint64(h))
	if err != nil {
		return fail(err)
	}
	return fail(x.Abort(context.Background(), cstr(reason)))
}

//export tego_handoff_status
func tego_handoff_status(h C.te_xfer_t, out *C.te_handoff_status_t) (rc C.int) {
	defer enter("handoff status", &rc)()
	x, _, err := transfers.Get("handoff status", uint64(h))
	if err != nil {
		return fail(err)
	}
	if out == nil {
		return null("handoff status", "out")
	}
	st, err := x.T.Status(context.Background())
	if err != nil {
		return fail(err)
	}
	v := C.te_handoff_status_t{
		state: C.int32_t(glue.StateNumber(st.State)), mode: C.int32_t(glue.ModeNumber(st.Mode)),
		error: C.int32_t(-int32(st.Code)), bytes: C.uint64_t(st.Bytes),
	}
	if st.Settled {
		v.settled = 1
	}
	copyCut(unsafe.Slice((*byte)(unsafe.Pointer(&v.reason[0])), len(v.reason)), st.Reason)
	return fail(putSized("handoff status", unsafe.Pointer(out), unsafe.Pointer(&v), unsafe.Sizeof(v)))
}

//export tego_handoff_free
func tego_handoff_free(h C.te_xfer_t) (rc C.int) {
	defer enter("handoff free", &rc)()
	x, err := transfers.Delete("handoff free", uint64(h))
	if err != nil {
		return fail(err)
	}
	x.Release(glue.AbortTimeout())
	return 0
}
