package main

/*
#include <string.h>
#include "te.h"
typedef const char te_cchar;
typedef const int32_t te_cblock;
*/
import "C"

import (
	"unsafe"

	"github.com/tecache/te/capi/internal/glue"
	"github.com/tecache/te/engine"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/kvcache"
)

// Layouts and plans belong to no engine (owner 0): te_destroy leaves them.
var (
	layouts = glue.NewTable[*kvcache.Layout](glue.KindLayout)
	plans   = glue.NewTable[*kvcache.Plan](glue.KindPlan)
)

// layoutJSON copies the caller's layout JSON, refusing oversized input
// before copying it.
func layoutJSON(op string, p *C.te_cchar) (string, error) {
	if p == nil {
		return "", errs.New(errs.InvalidArgument, op, "json is NULL")
	}
	if n := C.strnlen((*C.char)(p), glue.MaxLayoutJSON+1); n > glue.MaxLayoutJSON {
		return "", errs.New(errs.TooLarge, op, "layout JSON exceeds %d bytes", glue.MaxLayoutJSON)
	}
	return cstr(p), nil
}

// blockList copies n block ids from the caller.
func blockList(op, what string, p *C.te_cblock, n C.size_t) ([]int, error) {
	if p == nil {
		return nil, errs.New(errs.InvalidArgument, op, "%s blocks is NULL", what)
	}
	if n > glue.MaxBlocks {
		return nil, errs.New(errs.TooLarge, op, "%d %s block ids exceed %d", n, what, glue.MaxBlocks)
	}
	return glue.Blocks(op, what, unsafe.Slice((*int32)(unsafe.Pointer(p)), int(n)))
}

// putSized copies v into the caller's struct out, whose first field is its
// uint32 size: only the bytes within that size are written, so a caller
// compiled against an older, shorter struct is served.
func putSized(op string, out unsafe.Pointer, v unsafe.Pointer, known uintptr) error {
	size := uintptr(*(*C.uint32_t)(out))
	if size < 4 || size > maxConfigSize {
		return errs.New(errs.InvalidArgument, op, "out->size is %d; set it to sizeof the struct", size)
	}
	*(*C.uint32_t)(v) = C.uint32_t(min(size, known))
	copy(unsafe.Slice((*byte)(out), min(size, known)), unsafe.Slice((*byte)(v), known))
	return nil
}

//export tego_layout_create
func tego_layout_create(json *C.te_cchar, out *C.te_layout_t) (rc C.int) {
	defer enter("layout create", &rc)()
	if out == nil {
		return null("layout create", "out")
	}
	*out = 0
	s, err := layoutJSON("layout create", json)
	if err != nil {
		return fail(err)
	}
	l, err := glue.ParseLayout("layout create", s)
	if err != nil {
		return fail(err)
	}
	*out = C.te_layout_t(layouts.Put(0, l))
	return 0
}

//export tego_layout_bytes
func tego_layout_bytes(json *C.te_cchar, block, layer *C.uint64_t) (rc C.int) {
	defer enter("layout bytes", &rc)()
	s, err := layoutJSON("layout bytes", json)
	if err != nil {
		return fail(err)
	}
	b, l, err := glue.ParseShape("layout bytes", s)
	if err != nil {
		return fail(err)
	}
	if block != nil {
		*block = C.uint64_t(b)
	}
	if layer != nil {
		*layer = C.uint64_t(l)
	}
	return 0
}

//export tego_layout_info
func tego_layout_info(h C.te_layout_t, out *C.te_layout_info_t) (rc C.int) {
	defer enter("layout info", &rc)()
	l, _, err := layouts.Get("layout info", uint64(h))
	if err != nil {
		return fail(err)
	}
	if out == nil {
		return null("layout info", "out")
	}
	in, err := glue.InfoOf(l)
	if err != nil {
		return fail(err)
	}
	v := C.te_layout_info_t{
		num_layers: C.int32_t(in.NumLayers), first_layer: C.int32_t(in.FirstLayer), num_blocks: C.int32_t(in.NumBlocks),
		components: C.int32_t(in.Components), regions: C.int32_t(in.Regions),
		block_bytes: C.uint64_t(in.BlockBytes), layer_bytes: C.uint64_t(in.LayerBytes),
	}
	return fail(putSized("layout info", unsafe.Pointer(out), unsafe.Pointer(&v), unsafe.Sizeof(v)))
}

//export tego_layout_regions
func tego_layout_regions(h C.te_layout_t, out *C.te_span_t, capacity C.size_t, count *C.size_t) (rc C.int) {
	defer enter("layout regions", &rc)()
	l, _, err := layouts.Get("layout regions", uint64(h))
	if err != nil {
		return fail(err)
	}
	if count == nil {
		return null("layout regions", "count")
	}
	if out == nil && capacity > 0 {
		return null("layout regions", "out")
	}
	rs, err := l.Regions()
	if err != nil {
		return fail(err)
	}
	*count = C.size_t(len(rs))
	if capacity == 0 {
		return 0
	}
	dst := unsafe.Slice(out, int(min(capacity, C.size_t(len(rs)))))
	for i := range dst {
		dst[i] = C.te_span_t{addr: C.uint64_t(rs[i].Addr), length: C.uint64_t(rs[i].Length)}
	}
	return 0
}

//export tego_layout_free
func tego_layout_free(h C.te_layout_t) (rc C.int) {
	defer enter("layout free", &rc)()
	_, err := layouts.Delete("layout free", uint64(h))
	return fail(err)
}

//export tego_plan_create
func tego_plan_create(src, dst C.te_layout_t, srcBlocks *C.te_cblock, nSrc C.size_t, dstBlocks *C.te_cblock, nDst C.size_t,
	layerBegin, layerEnd C.int32_t, out *C.te_plan_t) (rc C.int) {
	const op = "plan create"
	defer enter(op, &rc)()
	if out == nil {
		return null(op, "out")
	}
	*out = 0
	sl, _, err := layouts.Get(op, uint64(src))
	if err != nil {
		return fail(err)
	}
	dl, _, err := layouts.Get(op, uint64(dst))
	if err != nil {
		return fail(err)
	}
	sb, err := blockList(op, "source", srcBlocks, nSrc)
	if err != nil {
		return fail(err)
	}
	db, err := blockList(op, "destination", dstBlocks, nDst)
	if err != nil {
		return fail(err)
	}
	lr, err := glue.LayerRange(op, int32(layerBegin), int32(layerEnd))
	if err != nil {
		return fail(err)
	}
	p, err := kvcache.NewPlan(sl, dl, sb, db, lr)
	if err != nil {
		return fail(err)
	}
	*out = C.te_plan_t(plans.Put(0, p))
	return 0
}

//export tego_plan_stats
func tego_plan_stats(h C.te_plan_t, out *C.te_plan_stats_t) (rc C.int) {
	defer enter("plan stats", &rc)()
	p, _, err := plans.Get("plan stats", uint64(h))
	if err != nil {
		return fail(err)
	}
	if out == nil {
		return null("plan stats", "out")
	}
	s, lr := p.Stats(), p.Layers()
	v := C.te_plan_stats_t{
		layers: C.int32_t(s.Layers), layer_begin: C.int32_t(lr.Start), layer_end: C.int32_t(lr.End),
		blocks: C.int32_t(s.Blocks), pieces: C.int32_t(s.Pieces), bytes: C.uint64_t(s.Bytes),
		block_requests: C.uint64_t(s.BlockRequests), requests: C.uint64_t(s.Requests), merged: C.uint64_t(s.Merged),
		max_layer_requests: C.uint64_t(p.MaxLayerTransfers()),
	}
	return fail(putSized("plan stats", unsafe.Pointer(out), unsafe.Pointer(&v), unsafe.Sizeof(v)))
}

//export tego_plan_transfers
func tego_plan_transfers(h C.te_plan_t, layer C.int32_t, out *C.te_plan_transfer_t, capacity C.size_t, count *C.size_t) (rc C.int) {
	defer enter("plan transfers", &rc)()
	p, _, err := plans.Get("plan transfers", uint64(h))
	if err != nil {
		return fail(err)
	}
	if count == nil {
		return null("plan transfers", "count")
	}
	if out == nil && capacity > 0 {
		return null("plan transfers", "out")
	}
	var ts []kvcache.Transfer
	if layer == C.TE_PLAN_ALL_LAYERS {
		ts = p.Transfers()
	} else if ts = p.Layer(int(layer)); ts == nil {
		lr := p.Layers()
		return fail(errs.New(errs.InvalidArgument, "plan transfers", "layer %d outside the plan's layers [%d, %d)", layer, lr.Start, lr.End))
	}
	*count = C.size_t(len(ts))
	if capacity == 0 {
		return 0
	}
	dst := unsafe.Slice(out, int(min(capacity, C.size_t(len(ts)))))
	for i := range dst {
		dst[i] = C.te_plan_transfer_t{src: C.uint64_t(ts[i].Src), dst: C.uint64_t(ts[i].Dst), length: C.uint64_t(ts[i].Length)}
	}
	return 0
}

// planTarget resolves the batch, segment and plan of a plan submission and
// checks that the batch and the segment come from one engine.
func planTarget(op string, bh C.te_batch_t, sh C.te_segment_t, ph C.te_plan_t, opcode C.int32_t) (*engine.Batch, *engine.Segment, *kvcache.Plan, engine.Opcode, error) {
	be, owner, err := batches.Get(op, uint64(bh))
	if err != nil {
		return nil, nil, nil, 0, err
	}
	se, sowner, err := segments.Get(op, uint64(sh))
	if err != nil {
		return nil, nil, nil, 0, err
	}
	if sowner != owner {
		return nil, nil, nil, 0, errs.New(errs.InvalidArgument, op, "segment handle belongs to another engine than the batch")
	}
	p, _, err := plans.Get(op, uint64(ph))
	if err != nil {
		return nil, nil, nil, 0, err
	}
	if opcode != C.TE_READ && opcode != C.TE_WRITE {
		return nil, nil, nil, 0, errs.New(errs.InvalidArgument, op, "opcode %d is neither TE_READ nor TE_WRITE", opcode)
	}
	return be.b, se.s, p, engine.Opcode(uint8(opcode)), nil
}

//export tego_plan_submit_layer
func tego_plan_submit_layer(bh C.te_batch_t, sh C.te_segment_t, ph C.te_plan_t, layer, opcode C.int32_t) (rc C.int) {
	defer enter("plan submit layer", &rc)()
	b, s, p, op, err := planTarget("plan submit layer", bh, sh, ph, opcode)
	if err != nil {
		return fail(err)
	}
	return fail(kvcache.SubmitLayer(b, s, p, int(layer), op))
}

//export tego_plan_submit
func tego_plan_submit(bh C.te_batch_t, sh C.te_segment_t, ph C.te_plan_t, opcode C.int32_t) (rc C.int) {
	defer enter("plan submit", &rc)()
	b, s, p, op, err := planTarget("plan submit", bh, sh, ph, opcode)
	if err != nil {
		return fail(err)
	}
	return fail(kvcache.Submit(b, s, p, op))
}

//export tego_plan_free
func tego_plan_free(h C.te_plan_t) (rc C.int) {
	defer enter("plan free", &rc)()
	_, err := plans.Delete("plan free", uint64(h))
	return fail(err)
}
