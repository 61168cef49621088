package cudaipc

import (
	"encoding/base64"
	"encoding/hex"
	"strconv"

	"github.com/tecache/te/engine/segment"
	"github.com/tecache/te/internal/errs"
	cu "github.com/tecache/te/internal/sys/cuda"
)

// Keys this transport adds to BufferDesc.Extra (te_extra in the JSON) for a
// GPU buffer it exported.
const (
	// ExtraHandle is the CUipcMemHandle of the allocation holding the
	// buffer: its 64 bytes in standard base64.
	ExtraHandle = "cuda_ipc"
	// ExtraOffset is the buffer's offset from the allocation's base, in
	// decimal: opening a handle maps the whole allocation.
	ExtraOffset = "cuda_ipc_off"
	// ExtraUUID is the device's UUID in hex, so a peer whose
	// CUDA_VISIBLE_DEVICES numbers devices differently finds the same GPU.
	ExtraUUID = "cuda_uuid"
)

// export is what a descriptor says about an exported buffer.
type export struct {
	Handle cu.IPCMemHandle
	Offset uint64
	UUID   string // hex; empty when the owner's driver has no cuDeviceGetUuid
}

// EncodeHandle returns the Extra form of an IPC handle.
func EncodeHandle(h cu.IPCMemHandle) string { return base64.StdEncoding.EncodeToString(h.Reserved[:]) }

// DecodeHandle parses the Extra form of an IPC handle.
func DecodeHandle(s string) (cu.IPCMemHandle, error) {
	var h cu.IPCMemHandle
	if base64.StdEncoding.DecodedLen(len(s)) > cu.IPCHandleSize+2 {
		return h, errs.New(errs.Metadata, "cudaipc", "IPC handle of %d characters is too long", len(s))
	}
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil || len(b) != cu.IPCHandleSize {
		return h, errs.New(errs.Metadata, "cudaipc", "IPC handle is not %d bytes of base64", cu.IPCHandleSize)
	}
	copy(h.Reserved[:], b)
	return h, nil
}

// setExport records an export in a buffer's descriptor.
func setExport(b *segment.BufferDesc, e export) {
	if b.Extra == nil {
		b.Extra = map[string]string{}
	}
	b.Extra[ExtraHandle] = EncodeHandle(e.Handle)
	b.Extra[ExtraOffset] = strconv.FormatUint(e.Offset, 10)
	if e.UUID != "" {
		b.Extra[ExtraUUID] = e.UUID
	}
}

// exportOf reads a buffer's export; ok is false when the buffer has none
// (host memory, or GPU memory that could not be exported).
func exportOf(b *segment.BufferDesc) (e export, ok bool, err error) {
	s, ok := b.Extra[ExtraHandle]
	if !ok {
		return e, false, nil
	}
	if e.Handle, err = DecodeHandle(s); err != nil {
		return e, true, err
	}
	if e.Offset, err = strconv.ParseUint(b.Extra[ExtraOffset], 10, 64); err != nil {
		return e, true, errs.New(errs.Metadata, "cudaipc", "buffer at %#x has a bad %s %q", b.Addr, ExtraOffset, b.Extra[ExtraOffset])
	}
	if e.Offset+b.Length < e.Offset {
		return e, true, errs.New(errs.Metadata, "cudaipc", "buffer at %#x: offset %d overflows", b.Addr, e.Offset)
	}
	if u := b.Extra[ExtraUUID]; u != "" {
		if _, herr := hex.DecodeString(u); herr != nil || len(u) != 32 {
			return e, true, errs.New(errs.Metadata, "cudaipc", "buffer at %#x has a bad %s %q", b.Addr, ExtraUUID, u)
		}
		e.UUID = u
	}
	return e, true, nil
}
