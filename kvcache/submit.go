package kvcache

import (
	"github.com/tecache/te/engine"
	"github.com/tecache/te/internal/errs"
)

// EngineRequests turns transfers into engine requests on segment seg, the
// peer's segment. The plan always runs from the source layout to the
// destination layout; op says which side this process is. With engine.Write
// (push: the source side, e.g. prefill, writes into the peer) the local
// address is the source and the remote one the destination; with
// engine.Read (pull: the destination side reads from the peer) the local
// address is the destination and the remote one the source.
func EngineRequests(ts []Transfer, seg *engine.Segment, op engine.Opcode) ([]engine.Request, error) {
	if op != engine.Read && op != engine.Write {
		return nil, errs.New(errs.InvalidArgument, "kvcache submit", "opcode %d is neither READ nor WRITE", op)
	}
	if seg == nil {
		return nil, errs.New(errs.InvalidArgument, "kvcache submit", "nil segment")
	}
	rs := make([]engine.Request, len(ts))
	for i, t := range ts {
		r := engine.Request{Op: op, Segment: seg, Length: t.Length}
		if op == engine.Write {
			r.Local, r.Remote = t.Src, t.Dst
		} else {
			r.Local, r.Remote = t.Dst, t.Src
		}
		rs[i] = r
	}
	return rs, nil
}

// SubmitLayer submits one layer of the plan to batch b and returns without
// waiting, so the next layer can be computed while this one moves. The batch
// needs room for len(p.Layer(layer)) more requests (p.MaxLayerTransfers()
// per layer). Wait on the batch once the last layer is submitted.
func SubmitLayer(b *engine.Batch, seg *engine.Segment, p *Plan, layer int, op engine.Opcode) error {
	if b == nil || p == nil {
		return errs.New(errs.InvalidArgument, "kvcache submit", "nil batch or plan")
	}
	ts := p.Layer(layer)
	if ts == nil {
		r := p.Layers()
		return errs.New(errs.InvalidArgument, "kvcache submit", "layer %d outside the plan's layers [%d, %d)", layer, r.Start, r.End)
	}
	rs, err := EngineRequests(ts, seg, op)
	if err != nil {
		return err
	}
	return b.Submit(rs...)
}

// Submit submits the whole plan (coalesced across layers) to batch b, which
// needs room for len(p.Transfers()) requests, and returns without waiting.
func Submit(b *engine.Batch, seg *engine.Segment, p *Plan, op engine.Opcode) error {
	if b == nil || p == nil {
		return errs.New(errs.InvalidArgument, "kvcache submit", "nil batch or plan")
	}
	rs, err := EngineRequests(p.Transfers(), seg, op)
	if err != nil {
		return err
	}
	return b.Submit(rs...)
}
