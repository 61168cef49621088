package segment

import (
	"encoding/json"
	"sort"
	"strings"

	"github.com/tecache/te/internal/errs"
)

// MaxDescSize bounds an encoded descriptor; decoders refuse larger input before
// parsing it.
const MaxDescSize = 16 << 20

// MaxBuffers bounds the number of buffers one descriptor may carry.
const MaxBuffers = 1 << 20

// Desc is what an engine publishes about itself: Mooncake's SegmentDesc with
// te's extensions under te_* names. Field names follow Mooncake where the
// concept is the same so descriptors written by either can be read by both.
type Desc struct {
	Name        string       `json:"name"`
	Protocol    string       `json:"protocol"`
	TCPDataPort int          `json:"tcp_data_port,omitempty"`
	Devices     []Device     `json:"devices,omitempty"`
	Buffers     []BufferDesc `json:"buffers"`
	Timestamp   string       `json:"timestamp,omitempty"`

	// TCPProtoVersion is Mooncake's tcp_proto_version: 2 is its
	// acknowledged data framing, absent means 1 (spec.md, "Mooncake
	// interop"). te publishes 2 beside its tcp data port.
	TCPProtoVersion int `json:"tcp_proto_version,omitempty"`

	// Version grows with every change an engine publishes; with Instance it
	// lets a peer tell a changed descriptor from the one it cached.
	Version uint64 `json:"te_version,omitempty"`
	// Instance is random per engine start: a peer restarted under the same
	// name has a new one.
	Instance string `json:"te_instance,omitempty"`
	// RPC is the control-plane address (handshake, notify, probe).
	RPC string `json:"te_rpc,omitempty"`
	// Transports lists the installed transports in preference order.
	Transports []string `json:"te_transports,omitempty"`
	// Endpoints maps a transport name to its data address.
	Endpoints map[string]string `json:"te_endpoints,omitempty"`
	// Host identifies the machine and process, for same-host transports.
	Host *HostID `json:"te_host,omitempty"`

	// CXLName and CXLBase are Mooncake's cxl fields: the shared device
	// this engine mapped and where it mapped it. A buffer inside the
	// mapping also carries its Offset there. Mooncake publishes cxl
	// buffers by offset alone; Validate derives their Addr (CXLBase +
	// Offset), so both kinds are addressed the same way.
	CXLName string `json:"cxl_name,omitempty"`
	CXLBase uint64 `json:"cxl_base_addr,omitempty"`
	// CXLID identifies the device (te only): engines whose IDs match map
	// the same memory. CXLSize is the size of the mapping.
	CXLID   string `json:"te_cxl_id,omitempty"`
	CXLSize uint64 `json:"te_cxl_size,omitempty"`
}

// Device is an RDMA device as Mooncake publishes it.
type Device struct {
	Name string `json:"name"`
	LID  uint16 `json:"lid"`
	GID  string `json:"gid"`
}

// HostID says where an engine runs, so same-host transports are chosen only
// when the peer really is on this host and in reach.
type HostID struct {
	BootID string `json:"boot_id"`
	PidNS  string `json:"pid_ns"`
	Pid    int    `json:"pid"`
}

// BufferDesc describes one registered, remote-accessible buffer.
type BufferDesc struct {
	Name   string   `json:"name"` // memory location, e.g. cpu:0 or cuda:1
	Addr   uint64   `json:"addr"`
	Length uint64   `json:"length"`
	Rkey   []uint32 `json:"rkey"`
	Lkey   []uint32 `json:"lkey"`
	// Key is the capability key of this registration: random per
	// registration and checked by the owner on every software-path access
	// (the tcp analogue of an rkey).
	Key uint64 `json:"te_key,omitempty"`
	// Extra carries transport-specific fields (an IPC handle, say).
	Extra map[string]string `json:"te_extra,omitempty"`
	// Offset is where a buffer inside the owner's cxl mapping starts in
	// the device (Mooncake's "offset"); Protocol is Mooncake's per-buffer
	// protocol ("cxl" for such a buffer).
	Offset   uint64 `json:"offset,omitempty"`
	Protocol string `json:"protocol,omitempty"`
	// MRStep and MRSpan describe a buffer longer than a NIC's
	// max_mr_size, registered as several memory regions on every NIC:
	// region k covers [Addr+k*MRStep, +MRSpan), the last one ends at End().
	// Neighbours overlap by MRSpan-MRStep bytes, so every access of at
	// most that many bytes lies inside one region and no slice is cut at
	// a region's edge. Lkey/Rkey are region 0's keys (all that a peer
	// unaware of the split reads: it reaches the first MRSpan bytes);
	// MoreLkey/MoreRkey hold regions 1 and up, one key per NIC each. Both
	// steps are zero for a buffer of one region per NIC.
	MRStep   uint64     `json:"te_mr_step,omitempty"`
	MRSpan   uint64     `json:"te_mr_span,omitempty"`
	MoreRkey [][]uint32 `json:"te_rkeys,omitempty"`
	MoreLkey [][]uint32 `json:"te_lkeys,omitempty"`
}

// MinMROverlap is the least overlap of a split buffer's memory regions.
const MinMROverlap = 4096

// MaxMRs bounds the memory regions per NIC one split buffer may have.
const MaxMRs = 1 << 16

// MRCount returns how many memory regions per NIC cover a buffer of
// length bytes cut with step and span (1 when step is 0).
func MRCount(length, step, span uint64) int {
	if step == 0 || length <= span {
		return 1
	}
	return 1 + int((length-span+step-1)/step)
}

// MRIndex returns the memory region of b that serves an access starting
// off bytes into b (and holding at most MRSpan-MRStep bytes).
func (b *BufferDesc) MRIndex(off uint64) int {
	if b.MRStep == 0 {
		return 0
	}
	return min(int(off/b.MRStep), len(b.MoreRkey))
}

// Keys returns the lkey and rkey vectors of memory region k of b.
func (b *BufferDesc) Keys(k int) (lkey, rkey []uint32) {
	if k == 0 {
		return b.Lkey, b.Rkey
	}
	if k-1 < len(b.MoreLkey) {
		lkey = b.MoreLkey[k-1]
	}
	return lkey, b.MoreRkey[k-1]
}

// checkSplit checks a split buffer's layout: steps that cut it into at
// most MaxMRs regions, and as many key vectors as regions, each as long as
// Rkey.
func (b *BufferDesc) checkSplit() bool {
	if b.MRStep == 0 && b.MRSpan == 0 && len(b.MoreRkey) == 0 && len(b.MoreLkey) == 0 {
		return true
	}
	// The overlap bounds an initiator's slices to the buffer: a peer must
	// not make them smaller than a page (a flood of tiny work requests).
	if b.MRStep == 0 || b.MRSpan < b.MRStep+MinMROverlap || b.MRSpan >= b.Length || b.Length/b.MRStep >= MaxMRs {
		return false
	}
	n := MRCount(b.Length, b.MRStep, b.MRSpan)
	if len(b.MoreRkey) != n-1 || (len(b.MoreLkey) != 0 && len(b.MoreLkey) != n-1) {
		return false
	}
	for i, r := range b.MoreRkey {
		if len(r) != len(b.Rkey) || (len(b.MoreLkey) != 0 && len(b.MoreLkey[i]) != len(b.Rkey)) {
			return false
		}
	}
	return true
}

// KindFile is the location kind of a registered file (a storage region),
// and the Name of its buffers in descriptors.
const KindFile = "file"

// ExtraFileChunk is the BufferDesc.Extra key of a registered file's I/O
// size at its owner (bytes, decimal).
const ExtraFileChunk = "te_file_chunk"

// End returns Addr+Length.
func (b *BufferDesc) End() uint64 { return b.Addr + b.Length }

// Contains reports whether [addr, addr+n) lies inside b, overflow checked.
func (b *BufferDesc) Contains(addr, n uint64) bool {
	if n == 0 || addr < b.Addr {
		return false
	}
	end := addr + n
	if end < addr {
		return false
	}
	return end <= b.Addr+b.Length
}

// HasTransport reports whether the descriptor lists transport t. A Mooncake
// engine's descriptor lists none; it has tcp when it publishes a data port.
func (d *Desc) HasTransport(t string) bool {
	if d.IsMooncake() {
		return t == "tcp" && d.TCPDataPort > 0
	}
	for _, x := range d.Transports {
		if x == t {
			return true
		}
	}
	return false
}

// Find returns the buffer that holds [addr, addr+n) entirely. Buffers are kept
// sorted by Decode and by the engine, so this is a binary search.
func (d *Desc) Find(addr, n uint64) (*BufferDesc, error) {
	if n == 0 {
		return nil, errs.New(errs.InvalidArgument, "segment", "zero length")
	}
	if addr+n < addr {
		return nil, errs.New(errs.InvalidArgument, "segment", "range [%#x,+%d) overflows", addr, n)
	}
	i := sort.Search(len(d.Buffers), func(i int) bool { return d.Buffers[i].Addr > addr }) - 1
	if i < 0 || !d.Buffers[i].Contains(addr, n) {
		return nil, errs.New(errs.AddressNotRegistered, "segment",
			"[%#x,+%d) is not inside one buffer of segment %q", addr, n, d.Name)
	}
	return &d.Buffers[i], nil
}

// Encode returns the JSON form of d.
func (d *Desc) Encode() ([]byte, error) {
	b, err := json.Marshal(d)
	if err != nil {
		return nil, errs.Wrap(errs.Internal, "segment", err, "encode descriptor")
	}
	return b, nil
}

// Decode parses and validates a descriptor. Malformed input gives a Metadata
// error, never a panic: descriptors come from peers and stores we do not
// control.
func Decode(b []byte) (*Desc, error) {
	if len(b) > MaxDescSize {
		return nil, errs.New(errs.Metadata, "segment", "descriptor of %d bytes exceeds %d", len(b), MaxDescSize)
	}
	var d Desc
	if err := json.Unmarshal(b, &d); err != nil {
		return nil, errs.Wrap(errs.Metadata, "segment", err, "malformed descriptor")
	}
	if err := d.Validate(); err != nil {
		return nil, err
	}
	return &d, nil
}

// Validate checks a descriptor's invariants and sorts its buffers by address.
func (d *Desc) Validate() error {
	if d.Name == "" || len(d.Name) > 1024 || strings.ContainsRune(d.Name, 0) {
		return errs.New(errs.Metadata, "segment", "descriptor has an invalid name")
	}
	if len(d.Buffers) > MaxBuffers {
		return errs.New(errs.Metadata, "segment", "descriptor has %d buffers, more than %d", len(d.Buffers), MaxBuffers)
	}
	if d.CXLName != "" {
		for i := range d.Buffers {
			// A Mooncake cxl buffer has an offset and no address.
			if b := &d.Buffers[i]; b.Addr == 0 && b.Length != 0 {
				if d.CXLBase+b.Offset < d.CXLBase {
					return errs.New(errs.Metadata, "segment", "cxl buffer %d of %q overflows", i, d.Name)
				}
				b.Addr = d.CXLBase + b.Offset
			}
		}
	}
	sort.Slice(d.Buffers, func(i, j int) bool { return d.Buffers[i].Addr < d.Buffers[j].Addr })
	for i := range d.Buffers {
		b := &d.Buffers[i]
		if b.Length == 0 || b.Addr+b.Length < b.Addr {
			return errs.New(errs.Metadata, "segment", "buffer %d of %q has an invalid range", i, d.Name)
		}
		if !b.checkSplit() {
			return errs.New(errs.Metadata, "segment", "buffer %d of %q has an invalid memory region layout", i, d.Name)
		}
		if i > 0 && d.Buffers[i-1].End() > b.Addr {
			return errs.New(errs.Metadata, "segment", "buffers of %q overlap at %#x", d.Name, b.Addr)
		}
	}
	return nil
}

// Clone returns a deep copy of d.
func (d *Desc) Clone() *Desc {
	c := *d
	c.Devices = append([]Device(nil), d.Devices...)
	c.Buffers = make([]BufferDesc, len(d.Buffers))
	for i, b := range d.Buffers {
		b.Rkey = append([]uint32(nil), b.Rkey...)
		b.Lkey = append([]uint32(nil), b.Lkey...)
		b.MoreRkey = cloneKeys(b.MoreRkey)
		b.MoreLkey = cloneKeys(b.MoreLkey)
		if b.Extra != nil {
			m := make(map[string]string, len(b.Extra))
			for k, v := range b.Extra {
				m[k] = v
			}
			b.Extra = m
		}
		c.Buffers[i] = b
	}
	c.Transports = append([]string(nil), d.Transports...)
	if d.Endpoints != nil {
		c.Endpoints = make(map[string]string, len(d.Endpoints))
		for k, v := range d.Endpoints {
			c.Endpoints[k] = v
		}
	}
	if d.Host != nil {
		h := *d.Host
		c.Host = &h
	}
	return &c
}

func cloneKeys(v [][]uint32) [][]uint32 {
	if v == nil {
		return nil
	}
	out := make([][]uint32, len(v))
	for i, k := range v {
		out[i] = append([]uint32(nil), k...)
	}
	return out
}
