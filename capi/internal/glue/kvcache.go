package glue

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"

	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/kvcache"
)

// Handle kinds of the kvcache and handoff part of the C ABI.
const (
	KindLayout   Kind = 4
	KindPlan     Kind = 5
	KindHandoff  Kind = 6 // a handoff client
	KindTransfer Kind = 7 // one handoff transfer
)

func kvKindName(k Kind) string {
	switch k {
	case KindLayout:
		return "layout"
	case KindPlan:
		return "plan"
	case KindHandoff:
		return "handoff"
	case KindTransfer:
		return "transfer"
	}
	return "unknown"
}

// MaxLayoutJSON bounds the layout JSON te_layout_create reads: a model with
// thousands of layers and three base addresses each stays far below it.
const MaxLayoutJSON = 16 << 20

// MaxBlocks bounds a block-id list (the engine's batch bound).
const MaxBlocks = 1 << 24

// ParseLayout decodes and validates the JSON form of a kvcache.Layout.
// Unknown fields are refused so that a misspelt name ("numblocks") is
// reported rather than read as zero.
func ParseLayout(op string, s string) (*kvcache.Layout, error) {
	if s == "" {
		return nil, errs.New(errs.InvalidArgument, op, "layout JSON is empty")
	}
	if len(s) > MaxLayoutJSON {
		return nil, errs.New(errs.TooLarge, op, "layout JSON exceeds %d bytes", MaxLayoutJSON)
	}
	l, err := decodeLayout(s)
	if err != nil {
		var te *errs.Error
		if errors.As(err, &te) {
			return nil, err
		}
		return nil, errs.Wrap(errs.InvalidArgument, op, err, "layout JSON").
			WithHint(`e.g. {"format":"vllm","order":"HND","dtype":"bf16","num_blocks":64,"block_size":16,"num_heads":8,"head_dim":128,"bases":[...]}`)
	}
	if err := l.Validate(); err != nil {
		return nil, err
	}
	return l, nil
}

// ParseShape decodes a layout JSON for its shape only: base addresses may be
// absent. It returns the bytes of one block of one component and of one
// layer.
func ParseShape(op string, s string) (block, layer uint64, err error) {
	if s == "" {
		return 0, 0, errs.New(errs.InvalidArgument, op, "layout JSON is empty")
	}
	if len(s) > MaxLayoutJSON {
		return 0, 0, errs.New(errs.TooLarge, op, "layout JSON exceeds %d bytes", MaxLayoutJSON)
	}
	l, err := decodeLayout(s)
	if err != nil {
		var te *errs.Error
		if errors.As(err, &te) {
			return 0, 0, err
		}
		return 0, 0, errs.Wrap(errs.InvalidArgument, op, err, "layout JSON")
	}
	if block, err = l.BlockBytes(); err != nil {
		return 0, 0, err
	}
	if layer, err = l.LayerBytes(); err != nil {
		return 0, 0, err
	}
	return block, layer, nil
}

func decodeLayout(s string) (*kvcache.Layout, error) {
	d := json.NewDecoder(bytes.NewReader([]byte(s)))
	d.DisallowUnknownFields()
	var l kvcache.Layout
	if err := d.Decode(&l); err != nil {
		return nil, err
	}
	if _, err := d.Token(); err != io.EOF {
		return nil, errors.New("trailing data after the layout object")
	}
	return &l, nil
}

// LayoutInfo summarises a validated layout for te_layout_info.
type LayoutInfo struct {
	NumLayers, FirstLayer, NumBlocks, Components int
	BlockBytes, LayerBytes                       uint64
	Regions                                      int
}

// InfoOf returns the summary of a validated layout.
func InfoOf(l *kvcache.Layout) (LayoutInfo, error) {
	bb, err := l.BlockBytes()
	if err != nil {
		return LayoutInfo{}, err
	}
	lb, err := l.LayerBytes()
	if err != nil {
		return LayoutInfo{}, err
	}
	rs, err := l.Regions()
	if err != nil {
		return LayoutInfo{}, err
	}
	return LayoutInfo{NumLayers: l.NumLayers(), FirstLayer: l.FirstLayer, NumBlocks: l.NumBlocks,
		Components: l.Components(), BlockBytes: bb, LayerBytes: lb, Regions: len(rs)}, nil
}

// Blocks converts a C block-id list; a NULL list (ok false) with n > 0 is
// the caller's error, reported by the caller.
func Blocks(op, what string, ids []int32) ([]int, error) {
	if len(ids) == 0 {
		return nil, errs.New(errs.InvalidArgument, op, "%s block list is empty", what)
	}
	if len(ids) > MaxBlocks {
		return nil, errs.New(errs.TooLarge, op, "%d %s block ids exceed %d", len(ids), what, MaxBlocks)
	}
	out := make([]int, len(ids))
	for i, b := range ids {
		out[i] = int(b)
	}
	return out, nil
}

// LayerRange turns te_plan_create's [begin, end) into a kvcache range; 0, 0
// means every layer of the source layout.
func LayerRange(op string, begin, end int32) (kvcache.LayerRange, error) {
	if begin == 0 && end == 0 {
		return kvcache.LayerRange{}, nil
	}
	if begin < 0 || end <= begin {
		return kvcache.LayerRange{}, errs.New(errs.InvalidArgument, op, "layer range [%d, %d) is empty or negative", begin, end)
	}
	return kvcache.Layers(int(begin), int(end)), nil
}
