package kvcache

import (
	"strings"

	"github.com/tecache/te/internal/errs"
)

// DType is the element type of a KV cache. The zero value is invalid, so a
// layout that forgot to set it is caught.
type DType uint8

// Element types. FP8 comes in two encodings of the same size; they are kept
// apart because copying e4m3 bytes into an e5m2 cache silently corrupts it.
const (
	FP16 DType = iota + 1
	BF16
	FP8E4M3
	FP8E5M2
	FP32
)

var dtypeNames = [...]string{FP16: "fp16", BF16: "bf16", FP8E4M3: "fp8_e4m3", FP8E5M2: "fp8_e5m2", FP32: "fp32"}

// Size returns the element size in bytes (0 for an invalid DType).
func (d DType) Size() int {
	switch d {
	case FP16, BF16:
		return 2
	case FP8E4M3, FP8E5M2:
		return 1
	case FP32:
		return 4
	}
	return 0
}

func (d DType) valid() bool { return d.Size() != 0 }

// String returns the name used in JSON and error messages ("bf16", ...).
func (d DType) String() string {
	if d.valid() {
		return dtypeNames[d]
	}
	return "invalid"
}

// ParseDType parses a dtype name. It accepts the names String returns plus
// the spellings serving systems use: "float16", "half", "bfloat16",
// "float32", "float", "fp8" (= fp8_e4m3, vLLM's default fp8), "fp8_e4m3fn".
func ParseDType(s string) (DType, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "fp16", "float16", "half", "f16":
		return FP16, nil
	case "bf16", "bfloat16":
		return BF16, nil
	case "fp8", "fp8_e4m3", "fp8_e4m3fn", "float8_e4m3fn", "e4m3":
		return FP8E4M3, nil
	case "fp8_e5m2", "float8_e5m2", "e5m2":
		return FP8E5M2, nil
	case "fp32", "float32", "float", "f32":
		return FP32, nil
	}
	return 0, errs.New(errs.InvalidArgument, "kvcache", "unknown dtype %q", s).
		WithHint("use fp16, bf16, fp8_e4m3, fp8_e5m2 or fp32")
}

// MarshalText encodes the dtype by name.
func (d DType) MarshalText() ([]byte, error) {
	if !d.valid() {
		return nil, errs.New(errs.InvalidArgument, "kvcache", "invalid dtype %d", uint8(d))
	}
	return []byte(d.String()), nil
}

// UnmarshalText decodes a dtype name (see ParseDType).
func (d *DType) UnmarshalText(b []byte) error {
	v, err := ParseDType(string(b))
	if err != nil {
		return err
	}
	*d = v
	return nil
}

// Format is the family of a KV cache layout: how a layer's cache is shaped.
// The zero value is invalid.
type Format uint8

// Layout formats. Shapes are per layer, in row-major order.
const (
	// VLLM is vLLM's FlashAttention cache: [2, num_blocks, block_size,
	// kv_heads, head_dim] (NHD) or [2, num_blocks, kv_heads, block_size,
	// head_dim] (HND), K at index 0 and V at 1. When vLLM keeps K and V as
	// separate tensors per layer, give KBases and VBases instead of Bases;
	// each is then [num_blocks, ...] for one of them.
	VLLM Format = iota + 1
	// FlashInfer is [num_blocks, 2, block_size, kv_heads, head_dim] (NHD) or
	// [num_blocks, 2, kv_heads, block_size, head_dim] (HND): a block's K and
	// V are next to each other.
	FlashInfer
	// MLA is [num_blocks, block_size, dim]: one latent vector per token, no
	// K/V split and no heads (vLLM's MLA backends; SGLang's MLA pool with
	// page_size as the block size).
	MLA
	// SGLang is SGLang's token pool: per layer a K buffer and a V buffer,
	// each [num_pages*page_size, kv_heads, head_dim], addressed by page
	// (block = page, BlockSize = page_size). Give KBases and VBases.
	SGLang
)

var formatNames = [...]string{VLLM: "vllm", FlashInfer: "flashinfer", MLA: "mla", SGLang: "sglang"}

func (f Format) valid() bool { return f >= VLLM && f <= SGLang }

// String returns the format's name ("vllm", "flashinfer", "mla", "sglang").
func (f Format) String() string {
	if f.valid() {
		return formatNames[f]
	}
	return "invalid"
}

// ParseFormat parses a format name.
func ParseFormat(s string) (Format, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "vllm", "flash_attn", "flashattention", "flash-attn":
		return VLLM, nil
	case "flashinfer":
		return FlashInfer, nil
	case "mla":
		return MLA, nil
	case "sglang":
		return SGLang, nil
	}
	return 0, errs.New(errs.InvalidArgument, "kvcache", "unknown layout format %q", s).
		WithHint("use vllm, flashinfer, mla or sglang")
}

// MarshalText encodes the format by name.
func (f Format) MarshalText() ([]byte, error) {
	if !f.valid() {
		return nil, errs.New(errs.InvalidArgument, "kvcache", "invalid layout format %d", uint8(f))
	}
	return []byte(f.String()), nil
}

// UnmarshalText decodes a format name.
func (f *Format) UnmarshalText(b []byte) error {
	v, err := ParseFormat(string(b))
	if err != nil {
		return err
	}
	*f = v
	return nil
}

// Order is the order of the token and head dimensions inside a block. The
// zero value is NHD, vLLM's default.
type Order uint8

// Orders.
const (
	// NHD: [block_size, kv_heads, head_dim]; a head's data is strided per
	// token inside a block.
	NHD Order = iota
	// HND: [kv_heads, block_size, head_dim]; a head's data for the whole
	// block is one contiguous run (vLLM's NIXL connector asks for it).
	HND
)

// String returns "NHD" or "HND".
func (o Order) String() string {
	switch o {
	case NHD:
		return "NHD"
	case HND:
		return "HND"
	}
	return "invalid"
}

// ParseOrder parses "NHD" or "HND" (any case).
func ParseOrder(s string) (Order, error) {
	switch strings.ToUpper(strings.TrimSpace(s)) {
	case "NHD", "":
		return NHD, nil
	case "HND":
		return HND, nil
	}
	return 0, errs.New(errs.InvalidArgument, "kvcache", "unknown order %q", s).WithHint("use NHD or HND")
}

// MarshalText encodes the order by name.
func (o Order) MarshalText() ([]byte, error) {
	if o > HND {
		return nil, errs.New(errs.InvalidArgument, "kvcache", "invalid order %d", uint8(o))
	}
	return []byte(o.String()), nil
}

// UnmarshalText decodes an order name.
func (o *Order) UnmarshalText(b []byte) error {
	v, err := ParseOrder(string(b))
	if err != nil {
		return err
	}
	*o = v
	return nil
}
