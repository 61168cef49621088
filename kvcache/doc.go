// Package kvcache maps the KV caches of LLM serving systems to transfer
// plans: lists of (source address, destination address, length) that move
// the KV of a request's blocks from a prefill instance to a decode instance.
//
// # Layouts
//
// A Layout describes one rank's cache: Format, Order, DType, NumBlocks,
// BlockSize, the KV heads it holds (NumHeads from HeadStart) and HeadDim,
// and the base address of every layer. Per layer, row-major:
//
//	VLLM NHD          [2, num_blocks, block_size, kv_heads, head_dim]   Bases
//	VLLM HND          [2, num_blocks, kv_heads, block_size, head_dim]   Bases
//	VLLM, K/V split   [num_blocks, ...] for K and for V                KBases, VBases
//	FlashInfer NHD    [num_blocks, 2, block_size, kv_heads, head_dim]   Bases
//	FlashInfer HND    [num_blocks, 2, kv_heads, block_size, head_dim]   Bases
//	MLA               [num_blocks, block_size, dim]                     Bases
//	SGLang            [num_pages*page_size, kv_heads, head_dim] for K and V, by page
//	                                                                    KBases, VBases
//
// Index 0 of the "2" axis is K, 1 is V. Element sizes come from the dtype
// (fp16/bf16 2 bytes, fp8 1, fp32 4); the dtype is named so that a bf16
// cache is never copied into an fp16 one. Validate checks a layout (every
// dimension positive, products without overflow, base addresses for every
// layer in the form the format needs, no two tensors overlapping); Regions
// lists the memory to register with the engine. A Layout marshals to JSON
// with names ("format":"vllm", "order":"HND", "dtype":"bf16"), which is how
// the two sides describe their caches to each other.
//
// # Plans
//
// NewPlan(src, dst, srcBlocks, dstBlocks, layers) maps source block
// srcBlocks[i] to destination block dstBlocks[i] for every layer of the
// range and for K and V. Transfers that are consecutive in memory on both
// sides become one: adjacent block ids in a layer's K or V region, a block's
// K and V in FlashInfer, a layer's K region followed by its V region, and
// one layer followed by the next when the tensors sit back to back on both
// sides. Plan.Stats counts requests before coalescing (one per layer, K/V,
// block and contiguous piece of a block) and after, and the bytes moved.
//
// The layouts must agree on dtype, block size and head dim; they may differ
// in format and head order (converting NHD to HND costs one transfer per
// token and head).
//
// # Tensor parallelism
//
// When prefill and decode run with different tensor-parallel sizes, each
// rank holds a range of the model's KV heads (HeadRange gives the range
// vLLM and SGLang assign; SourceRanks says which source ranks a destination
// rank needs). A plan copies the heads both layouts hold. This follows
// vLLM's NIXL and Mooncake connectors: usually decode TP >= prefill TP, and
// decode rank r reads heads [(r mod ratio)*H/TPd, ...) of each block of
// prefill rank r/ratio; when prefill TP is larger, one decode block is
// assembled from several prefill ranks, one plan each; MLA caches are
// replicated, not split.
//
// What a head range costs depends on the order. In HND blocks a head range
// is one contiguous byte range (at head offset * block_size * head_dim *
// element size), so each block and K/V is one transfer — the reason vLLM's
// NIXL connector asks for HND. In NHD blocks the heads are interleaved per
// token, so each block needs block_size transfers of heads*head_dim*element
// bytes (16 transfers of 1 KiB for a Llama-3-8B block split over 2 decode
// ranks, instead of one of 16 KiB), and adjacent blocks no longer merge.
// The plan is still exact; prefer HND when TP sizes differ.
//
// # Submitting
//
// A plan is grouped by layer: Plan.Layer(i) lists layer i's transfers and
// SubmitLayer(batch, segment, plan, i, op) submits them to an engine batch
// without waiting, so the transfer of layer i overlaps the computation of
// layer i+1; wait on the batch after the last layer. Submit sends the whole
// plan at once. The plan always runs from source to destination; with
// engine.Write the caller is the source side pushing into the peer
// (Mooncake and SGLang style), with engine.Read the destination side
// pulling from it (NIXL style).
package kvcache
