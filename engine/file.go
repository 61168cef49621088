package engine

import (
	"strconv"

	"github.com/tecache/te/engine/segment"
	"github.com/tecache/te/engine/transport"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/sys/mem"
)

// Storage segments: a registered file range is a buffer of the segment like
// memory, at addresses reserved for it and never mapped (see package
// engine/transport/file). Requests address it as Remote = the address
// RegisterFile returned + the offset in the range.

// LocationFile is the location of storage buffers in descriptors.
const LocationFile = segment.KindFile

// FileOptions tune RegisterFile.
type FileOptions struct {
	// Remote publishes the range in the descriptor: peers reach it with
	// the cluster secret and the buffer's key. Without it the file is
	// private: in no descriptor a peer reads, refused to every request
	// but this engine's own (which address it through the engine's own
	// segment, as they address a published file), so only the process
	// that registered it moves its bytes (NIXL's local storage).
	Remote bool
	// Create makes the file (mode 0600) if it does not exist and extends
	// it to hold the range.
	Create bool
	// ReadOnly refuses writes into the file (also taken when the file or
	// descriptor cannot be written).
	ReadOnly bool
	// NoDirect keeps every I/O buffered (page cache) even where O_DIRECT
	// works.
	NoDirect bool
}

// RegisterFile registers [offset, offset+length) of the file at path as a
// storage buffer and returns the address the range starts at. length 0 means
// up to the file's current end. The file is opened by the engine (and closed
// by UnregisterMemory(addr), which first waits for the I/O in flight).
func (e *Engine) RegisterFile(path string, offset, length uint64, o FileOptions) (uint64, error) {
	if path == "" {
		return 0, errs.New(errs.InvalidArgument, "register file", "empty path")
	}
	return e.registerFile(transport.FileSpec{Path: path, FD: -1, Offset: offset, Length: length,
		Create: o.Create, ReadOnly: o.ReadOnly, NoDirect: o.NoDirect}, o.Remote)
}

// RegisterFileFD is RegisterFile for a file the caller opened: the engine
// works on its own duplicates of fd, so the caller may close fd at once.
func (e *Engine) RegisterFileFD(fd int, offset, length uint64, o FileOptions) (uint64, error) {
	if fd < 0 {
		return 0, errs.New(errs.InvalidArgument, "register file", "fd %d", fd)
	}
	return e.registerFile(transport.FileSpec{FD: fd, Offset: offset, Length: length,
		Create: o.Create, ReadOnly: o.ReadOnly, NoDirect: o.NoDirect}, o.Remote)
}

func (e *Engine) registerFile(spec transport.FileSpec, remote bool) (uint64, error) {
	if err := e.live("register file"); err != nil {
		return 0, err
	}
	var opener transport.FileOpener
	for _, t := range e.transports {
		if o, ok := t.(transport.FileOpener); ok && t.Caps().FileMemory {
			opener = o
			break
		}
	}
	if opener == nil {
		return 0, errs.New(errs.TransportUnavailable, "register file", "no installed transport opens files").
			WithHint("install the file transport (Config.Transports)")
	}
	e.regMu.Lock()
	defer e.regMu.Unlock()
	st, n, err := opener.OpenFile(spec)
	if err != nil {
		return 0, err
	}
	addr, err := mem.Reserve(n)
	if err != nil {
		st.Close()
		return 0, err
	}
	fail := func(err error) (uint64, error) {
		st.Close()
		mem.Unreserve(addr, n)
		return 0, err
	}
	r, err := segment.NewRegion(addr, n, "cpu", remote)
	if err != nil {
		return fail(err)
	}
	r.Location = segment.Location{Kind: LocationFile, Index: -1}
	r.Desc.Name = LocationFile
	r.Storage = st
	if a, ok := st.(interface{ Align() (uint64, uint64) }); ok {
		memAlign, offAlign := a.Align()
		r.Desc.Extra = map[string]string{"te_file_align": strconv.FormatUint(offAlign, 10),
			"te_file_mem_align": strconv.FormatUint(memAlign, 10)}
	}
	if c := st.StageSize(); c > 0 {
		// The size of the owner's file I/O: an initiator slices requests
		// to the file no smaller, so each reaches the disk whole.
		if r.Desc.Extra == nil {
			r.Desc.Extra = map[string]string{}
		}
		r.Desc.Extra[segment.ExtraFileChunk] = strconv.FormatUint(c, 10)
	}
	var done []transport.Transport
	for _, t := range e.transports {
		if !t.Caps().FileMemory {
			continue // never handed an address it would touch
		}
		if err := t.Register(r); err != nil {
			for _, u := range done {
				u.Unregister(r)
			}
			return fail(errs.Wrap(errs.CodeOf(err), "register file", err, "transport %s refused the file", t.Name()))
		}
		done = append(done, t)
	}
	if _, _, err := e.reg.Add(r); err != nil {
		for _, u := range done {
			u.Unregister(r)
		}
		return fail(err)
	}
	if err := e.publish(); err != nil {
		e.cfg.Logger.Warn("te: publishing descriptor", "err", err)
	}
	return addr, nil
}

// registeredWith reports whether region r was registered with transport t:
// storage regions only with the transports that move files.
func registeredWith(t transport.Transport, r *segment.Region) bool {
	return r.Storage == nil || t.Caps().FileMemory
}

// releaseStorage closes the storage of unregistered regions (waiting for
// their I/O) and gives their addresses back; called once they are dropped.
func releaseStorage(rs []*segment.Region) error {
	var first error
	for _, r := range rs {
		if r.Storage == nil {
			continue
		}
		if err := r.Storage.Close(); err != nil && first == nil {
			first = err
		}
		if err := mem.Unreserve(r.Addr, r.Length); err != nil && first == nil {
			first = err
		}
	}
	return first
}
