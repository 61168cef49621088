package main

/*
#include "te.h"
typedef const char te_cchar;
typedef const te_request_t te_crequest;
typedef const uint64_t te_cu64;
*/
import "C"

import (
	"context"
	"sync"
	"time"
	"unsafe"

	"github.com/tecache/te/engine"
	"github.com/tecache/te/internal/errs"
)

//export tego_open_segment
func tego_open_segment(h C.te_engine_t, name *C.te_cchar, out *C.te_segment_t) (rc C.int) {
	defer enter("open segment", &rc)()
	e, err := getEngine("open segment", h)
	if err != nil {
		return fail(err)
	}
	if name == nil {
		return null("open segment", "name")
	}
	if out == nil {
		return null("open segment", "out")
	}
	*out = 0
	s, err := e.OpenSegment(cstr(name))
	if err != nil {
		return fail(err)
	}
	*out = C.te_segment_t(segments.Put(uint64(h), segEntry{e, s}))
	return 0
}

//export tego_close_segment
func tego_close_segment(h C.te_segment_t) (rc C.int) {
	defer enter("close segment", &rc)()
	se, err := segments.Delete("close segment", uint64(h))
	if err != nil {
		return fail(err)
	}
	return fail(se.e.CloseSegment(se.s))
}

//export tego_segment_buffers
func tego_segment_buffers(h C.te_segment_t, out *C.te_buffer_desc_t, capacity C.size_t, count *C.size_t) (rc C.int) {
	defer enter("segment buffers", &rc)()
	se, _, err := segments.Get("segment buffers", uint64(h))
	if err != nil {
		return fail(err)
	}
	if count == nil {
		return null("segment buffers", "count")
	}
	if out == nil && capacity > 0 {
		return null("segment buffers", "out")
	}
	d, err := se.s.Descriptor()
	if err != nil {
		return fail(err)
	}
	*count = C.size_t(len(d.Buffers))
	if capacity == 0 {
		return 0
	}
	dst := unsafe.Slice(out, int(min(capacity, C.size_t(len(d.Buffers)))))
	for i := range dst {
		b := d.Buffers[i]
		dst[i].addr = C.uint64_t(b.Addr)
		dst[i].length = C.uint64_t(b.Length)
		loc := unsafe.Slice((*byte)(unsafe.Pointer(&dst[i].location[0])), len(dst[i].location))
		copyCut(loc, b.Name)
	}
	return 0
}

// copyCut writes s NUL-terminated into dst, cut to fit.
func copyCut(dst []byte, s string) {
	n := copy(dst[:len(dst)-1], s)
	dst[n] = 0
}

//export tego_allocate_batch
func tego_allocate_batch(h C.te_engine_t, capacity C.size_t, out *C.te_batch_t) (rc C.int) {
	defer enter("allocate batch", &rc)()
	e, err := getEngine("allocate batch", h)
	if err != nil {
		return fail(err)
	}
	if out == nil {
		return null("allocate batch", "out")
	}
	*out = 0
	if capacity == 0 || capacity > maxBatchItems {
		return fail(errs.New(errs.InvalidArgument, "allocate batch", "capacity %d outside 1..%d", capacity, maxBatchItems))
	}
	b, err := e.AllocateBatch(int(capacity))
	if err != nil {
		return fail(err)
	}
	*out = C.te_batch_t(batches.Put(uint64(h), batchEntry{e, b}))
	return 0
}

// requests converts the caller's requests, resolving segment handles (the
// last one is remembered: batches usually target one segment). windows, when
// not NULL, holds n window keys, one per request (0: none).
func requests(op string, owner uint64, reqs *C.te_crequest, windows *C.te_cu64, n C.size_t) ([]engine.Request, error) {
	if reqs == nil {
		return nil, errs.New(errs.InvalidArgument, op, "requests is NULL")
	}
	if n == 0 || n > maxBatchItems {
		return nil, errs.New(errs.InvalidArgument, op, "n is %d, want 1..%d", n, maxBatchItems)
	}
	out := getRequests(int(n))
	var wins []C.uint64_t
	if windows != nil {
		wins = unsafe.Slice((*C.uint64_t)(unsafe.Pointer(windows)), int(n))
	}
	var lastH uint64
	var lastS *engine.Segment
	for i, r := range unsafe.Slice((*C.te_request_t)(unsafe.Pointer(reqs)), int(n)) {
		sh := uint64(r.segment)
		if sh != lastH || lastS == nil {
			se, o, err := segments.Get(op, sh)
			if err != nil {
				putRequests(out)
				return nil, errs.New(errs.InvalidArgument, op, "request %d: %s", i, err.(*errs.Error).Msg)
			}
			if o != owner {
				putRequests(out)
				return nil, errs.New(errs.InvalidArgument, op, "request %d: segment handle belongs to another engine", i)
			}
			lastH, lastS = sh, se.s
		}
		out[i] = engine.Request{Op: engine.Opcode(uint8(r.opcode)), Local: addr(r.local), Segment: lastS,
			Remote: uint64(r.remote), Length: uint64(r.length)}
		if wins != nil {
			out[i].Window = uint64(wins[i])
		}
		if r.opcode != C.TE_READ && r.opcode != C.TE_WRITE {
			putRequests(out)
			return nil, errs.New(errs.InvalidArgument, op, "request %d: opcode %d is neither TE_READ nor TE_WRITE", i, r.opcode)
		}
	}
	return out, nil
}

// The Go requests a te_submit is turned into live only for the call (the
// engine copies what it keeps into the batch's slots), so their buffers are
// pooled: a submit allocates nothing per request.
var requestPool sync.Pool

func getRequests(n int) []engine.Request {
	if p, ok := requestPool.Get().(*[]engine.Request); ok && cap(*p) >= n {
		return (*p)[:n]
	}
	return make([]engine.Request, n, max(n, 128))
}

func putRequests(rs []engine.Request) {
	clear(rs)
	rs = rs[:0]
	requestPool.Put(&rs)
}

//export tego_submit
func tego_submit(h C.te_batch_t, reqs *C.te_crequest, n C.size_t) (rc C.int) {
	defer enter("submit", &rc)()
	return submit(h, reqs, nil, n, false, nil, nil, nil, 0)
}

//export tego_submit_with_notify
func tego_submit_with_notify(h C.te_batch_t, reqs *C.te_crequest, n C.size_t, segment, name, msg *C.te_cchar, msgLen C.size_t) (rc C.int) {
	defer enter("submit", &rc)()
	return submit(h, reqs, nil, n, true, segment, name, msg, msgLen)
}

//export tego_submit_windows
func tego_submit_windows(h C.te_batch_t, reqs *C.te_crequest, windows *C.te_cu64, n C.size_t) (rc C.int) {
	defer enter("submit", &rc)()
	return submit(h, reqs, windows, n, false, nil, nil, nil, 0)
}

//export tego_submit_windows_with_notify
func tego_submit_windows_with_notify(h C.te_batch_t, reqs *C.te_crequest, windows *C.te_cu64, n C.size_t, segment, name, msg *C.te_cchar, msgLen C.size_t) (rc C.int) {
	defer enter("submit", &rc)()
	return submit(h, reqs, windows, n, true, segment, name, msg, msgLen)
}

// submit is the four submit calls: windows may be NULL (no window for any
// request); with notify, (name, msg) goes to segment once all completed.
func submit(h C.te_batch_t, reqs *C.te_crequest, windows *C.te_cu64, n C.size_t, notify bool, segment, name, msg *C.te_cchar, msgLen C.size_t) C.int {
	be, owner, err := batches.Get("submit", uint64(h))
	if err != nil {
		return fail(err)
	}
	if notify {
		if segment == nil || name == nil {
			return null("submit", "notify segment or name")
		}
		if msg == nil && msgLen > 0 {
			return null("submit", "msg")
		}
		if err := notifyLimits("submit", name, msgLen); err != nil {
			return fail(err)
		}
	}
	rs, err := requests("submit", owner, reqs, windows, n)
	if err != nil {
		return fail(err)
	}
	defer putRequests(rs)
	if !notify {
		return fail(be.b.Submit(rs...))
	}
	return fail(be.b.SubmitWithNotify(cstr(segment), cstr(name), cbytes(msg, msgLen), rs...))
}

//export tego_task_status
func tego_task_status(h C.te_batch_t, index C.size_t, out *C.te_task_status_t) (rc C.int) {
	defer enter("task status", &rc)()
	if out == nil {
		return null("task status", "out")
	}
	// INVALID on every error, a handle freed by another thread included:
	// a caller that reads out->state regardless reads no garbage.
	*out = C.te_task_status_t{state: C.TE_TASK_INVALID}
	be, _, err := batches.Get("task status", uint64(h))
	if err != nil {
		return fail(err)
	}
	if index > maxBatchItems {
		return fail(errs.New(errs.InvalidArgument, "task status", "index %d", index))
	}
	ts, err := be.b.TaskStatus(int(index))
	if err != nil {
		return fail(err)
	}
	out.state = C.int32_t(ts.State)
	out.error = C.int32_t(-int32(errs.CodeOf(ts.Err)))
	out.transferred = C.uint64_t(ts.Transferred)
	copyCut(unsafe.Slice((*byte)(unsafe.Pointer(&out.transport[0])), len(out.transport)), ts.Transport)
	return 0
}

func putBatchStatus(out *C.te_batch_status_t, s engine.BatchStatus) {
	if out == nil {
		return
	}
	*out = C.te_batch_status_t{
		state:       C.int32_t(s.State),
		error:       C.int32_t(-int32(errs.CodeOf(s.Err))),
		transferred: C.uint64_t(s.Transferred),
		tasks:       C.uint64_t(s.Tasks),
		completed:   C.uint64_t(s.Completed),
		failed:      C.uint64_t(s.Failed),
	}
}

//export tego_batch_status
func tego_batch_status(h C.te_batch_t, out *C.te_batch_status_t) (rc C.int) {
	defer enter("batch status", &rc)()
	be, _, err := batches.Get("batch status", uint64(h))
	if err != nil {
		return fail(err)
	}
	if out == nil {
		return null("batch status", "out")
	}
	putBatchStatus(out, be.b.Status())
	return 0
}

// maxWaitMS is about 34 years; longer timeouts mean "no limit" rather than
// overflowing a time.Duration.
const maxWaitMS = 1 << 40

//export tego_wait
func tego_wait(h C.te_batch_t, timeoutMS C.int64_t, out *C.te_batch_status_t) (rc C.int) {
	defer enter("wait", &rc)()
	be, _, err := batches.Get("wait", uint64(h))
	if err != nil {
		return fail(err)
	}
	var st engine.BatchStatus
	switch {
	case timeoutMS == 0:
		select {
		case <-be.b.Done():
			st = be.b.Status()
		default:
			st = be.b.Status()
			err = errs.New(errs.Timeout, "wait", "batch not finished")
		}
	case timeoutMS < 0 || timeoutMS > maxWaitMS:
		st, err = be.b.Wait(-1)
	default:
		st, err = be.b.Wait(time.Duration(timeoutMS) * time.Millisecond)
	}
	putBatchStatus(out, st)
	if err != nil {
		return fail(err)
	}
	if st.State == engine.Completed || st.State == engine.Waiting {
		return 0
	}
	if st.Err != nil {
		return fail(st.Err)
	}
	// A task ended without an error value: name the state it ended in.
	code := errs.Internal
	switch st.State {
	case engine.Timeout:
		code = errs.Timeout
	case engine.Canceled:
		code = errs.Canceled
	}
	return fail(errs.New(code, "wait", "batch ended %v", st.State))
}

//export tego_batch_fd
func tego_batch_fd(h C.te_batch_t, fd *C.int32_t) (rc C.int) {
	defer enter("batch fd", &rc)()
	be, _, err := batches.Get("batch fd", uint64(h))
	if err != nil {
		return fail(err)
	}
	if fd == nil {
		return null("batch fd", "fd")
	}
	*fd = -1
	n, err := be.b.EventFD()
	if err != nil {
		return fail(err)
	}
	*fd = C.int32_t(n)
	return 0
}

//export tego_batch_cancel
func tego_batch_cancel(h C.te_batch_t) (rc C.int) {
	defer enter("cancel batch", &rc)()
	be, _, err := batches.Get("cancel batch", uint64(h))
	if err != nil {
		return fail(err)
	}
	return fail(be.b.Cancel())
}

//export tego_batch_reset
func tego_batch_reset(h C.te_batch_t) (rc C.int) {
	defer enter("reset batch", &rc)()
	be, _, err := batches.Get("reset batch", uint64(h))
	if err != nil {
		return fail(err)
	}
	return fail(be.b.Reset())
}

//export tego_free_batch
func tego_free_batch(h C.te_batch_t) (rc C.int) {
	defer enter("free batch", &rc)()
	return fail(batches.DeleteIf("free batch", uint64(h), func(be batchEntry) error { return be.b.Free() }))
}

//export tego_warmup_segment
func tego_warmup_segment(h C.te_engine_t, name *C.te_cchar) (rc C.int) {
	defer enter("warmup segment", &rc)()
	e, err := getEngine("warmup segment", h)
	if err != nil {
		return fail(err)
	}
	if name == nil {
		return null("warmup segment", "name")
	}
	// No deadline of its own: the segment's open is bounded by the RPC
	// timeout, each connection by the transport's connect and handshake
	// timeouts.
	return fail(e.Warmup(context.Background(), cstr(name)))
}
