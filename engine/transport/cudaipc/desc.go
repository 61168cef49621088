package cudaipc

import (
	"encoding/base64"
	"encoding/hex"
	"strconv"
	"strings"

	"github.com/tecache/te/engine/segment"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/sys/gpu"
)

// Keys this transport adds to BufferDesc.Extra (te_extra in the JSON) for a
// CUDA buffer it exported. A buffer of another runtime uses the same keys
// with its kind in place of "cuda" (hip_ipc, hip_ipc_off, hip_uuid; see
// ExtraKeys), so a peer only ever opens a handle with the runtime that made
// it, and a peer that predates HIP finds no handle it would misread.
const (
	// ExtraHandle is the IPC handle (CUipcMemHandle) of the allocation
	// holding the buffer: its 64 bytes in standard base64.
	ExtraHandle = "cuda_ipc"
	// ExtraOffset is the buffer's offset from the allocation's base, in
	// decimal: opening a handle maps the whole allocation.
	ExtraOffset = "cuda_ipc_off"
	// ExtraUUID is the device's UUID in hex, so a peer whose
	// CUDA_VISIBLE_DEVICES numbers devices differently finds the same GPU.
	ExtraUUID = "cuda_uuid"
)

// Keys of multi-node NVLink (MNNVL): a CUDA buffer whose allocation was made
// fabric-capable (cuMemCreate with CU_MEM_HANDLE_TYPE_FABRIC) also carries
// its fabric handle, which a GPU on another host of the same NVLink domain
// maps; the segment publishes its domain in Desc.Endpoints.
const (
	// ExtraFabric is the allocation's CUmemFabricHandle: 64 bytes in
	// standard base64.
	ExtraFabric = "cuda_fabric"
	// ExtraFabricOffset is the buffer's offset in that allocation, and
	// ExtraFabricSize the allocation's size (the peer maps all of it), in
	// decimal.
	ExtraFabricOffset = "cuda_fabric_off"
	ExtraFabricSize   = "cuda_fabric_size"
	// EndpointDomain is the Desc.Endpoints key of the engine's NVLink
	// domain (TE_MNNVL_DOMAIN or cudaipc.mnnvl_domain): engines with equal
	// domains map each other's fabric handles.
	EndpointDomain = "cudaipc.mnnvl"
)

// maxDomain bounds a published domain.
const maxDomain = 256

// ExtraKeys returns the Extra keys of an export of runtime kind: handle,
// offset and device UUID.
func ExtraKeys(kind string) (handle, offset, uuid string) {
	if kind == "cuda" {
		return ExtraHandle, ExtraOffset, ExtraUUID
	}
	return kind + "_ipc", kind + "_ipc_off", kind + "_uuid"
}

// export is what a descriptor says about an exported buffer.
type export struct {
	Handle gpu.IPCHandle // or the fabric handle, when Fabric
	Offset uint64
	UUID   string // hex; empty when the owner's runtime cannot tell
	// Fabric: Handle is a CUmemFabricHandle of an allocation of Size bytes.
	Fabric bool
	Size   uint64
}

// EncodeHandle returns the Extra form of an IPC handle.
func EncodeHandle(h gpu.IPCHandle) string { return base64.StdEncoding.EncodeToString(h[:]) }

// DecodeHandle parses the Extra form of an IPC handle.
func DecodeHandle(s string) (gpu.IPCHandle, error) {
	var h gpu.IPCHandle
	if base64.StdEncoding.DecodedLen(len(s)) > len(h)+2 {
		return h, errs.New(errs.Metadata, "cudaipc", "IPC handle of %d characters is too long", len(s))
	}
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil || len(b) != len(h) {
		return h, errs.New(errs.Metadata, "cudaipc", "IPC handle is not %d bytes of base64", len(h))
	}
	copy(h[:], b)
	return h, nil
}

// kindOf is the runtime a buffer's location names ("hip" for "hip:0"), or
// "" for memory that is not a GPU's.
func kindOf(b *segment.BufferDesc) string {
	k, _, _ := strings.Cut(b.Name, ":")
	if !gpu.IsDevice(k) {
		return ""
	}
	return k
}

// setExport records an export of runtime kind in a buffer's descriptor.
func setExport(b *segment.BufferDesc, kind string, e export) {
	if b.Extra == nil {
		b.Extra = map[string]string{}
	}
	kh, ko, ku := ExtraKeys(kind)
	b.Extra[kh] = EncodeHandle(e.Handle)
	b.Extra[ko] = strconv.FormatUint(e.Offset, 10)
	if e.UUID != "" {
		b.Extra[ku] = e.UUID
	}
}

// exportOf reads a buffer's export and the runtime that made it (the kind
// of the buffer's location); ok is false when the buffer has none (host
// memory, or GPU memory that could not be exported).
func exportOf(b *segment.BufferDesc) (kind string, e export, ok bool, err error) {
	kind = kindOf(b)
	if kind == "" {
		return "", e, false, nil
	}
	kh, ko, ku := ExtraKeys(kind)
	s, ok := b.Extra[kh]
	if !ok {
		return kind, e, false, nil
	}
	if e.Handle, err = DecodeHandle(s); err != nil {
		return kind, e, true, err
	}
	if e.Offset, err = strconv.ParseUint(b.Extra[ko], 10, 64); err != nil {
		return kind, e, true, errs.New(errs.Metadata, "cudaipc", "buffer at %#x has a bad %s %q", b.Addr, ko, b.Extra[ko])
	}
	if e.Offset+b.Length < e.Offset {
		return kind, e, true, errs.New(errs.Metadata, "cudaipc", "buffer at %#x: offset %d overflows", b.Addr, e.Offset)
	}
	if u := b.Extra[ku]; u != "" {
		if _, herr := hex.DecodeString(u); herr != nil || len(u) != 32 {
			return kind, e, true, errs.New(errs.Metadata, "cudaipc", "buffer at %#x has a bad %s %q", b.Addr, ku, u)
		}
		e.UUID = u
	}
	return kind, e, true, nil
}

// setFabric records a fabric export in a buffer's descriptor.
func setFabric(b *segment.BufferDesc, e export) {
	if b.Extra == nil {
		b.Extra = map[string]string{}
	}
	b.Extra[ExtraFabric] = EncodeHandle(e.Handle)
	b.Extra[ExtraFabricOffset] = strconv.FormatUint(e.Offset, 10)
	b.Extra[ExtraFabricSize] = strconv.FormatUint(e.Size, 10)
	if e.UUID != "" {
		b.Extra[ExtraUUID] = e.UUID
	}
}

// fabricOf reads a CUDA buffer's fabric export; ok is false when it has
// none.
func fabricOf(b *segment.BufferDesc) (e export, ok bool, err error) {
	s, ok := b.Extra[ExtraFabric]
	if !ok || kindOf(b) != "cuda" {
		return e, false, nil
	}
	e.Fabric = true
	if e.Handle, err = DecodeHandle(s); err != nil {
		return e, true, err
	}
	off, oerr := strconv.ParseUint(b.Extra[ExtraFabricOffset], 10, 64)
	size, serr := strconv.ParseUint(b.Extra[ExtraFabricSize], 10, 64)
	if oerr != nil || serr != nil || size == 0 || off > size || b.Length > size-off {
		return e, true, errs.New(errs.Metadata, "cudaipc", "buffer at %#x has a bad fabric export (%s %q, %s %q, length %d)",
			b.Addr, ExtraFabricOffset, b.Extra[ExtraFabricOffset], ExtraFabricSize, b.Extra[ExtraFabricSize], b.Length)
	}
	e.Offset, e.Size = off, size
	if u := b.Extra[ExtraUUID]; u != "" {
		if _, herr := hex.DecodeString(u); herr == nil && len(u) == 32 {
			e.UUID = u
		}
	}
	return e, true, nil
}
