package rdma

import (
	"golang.org/x/sys/unix"

	"github.com/tecache/te/engine/segment"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/sys/gpu"
)

// GPU memory over RDMA (GPUDirect): the NIC reads and writes device memory
// itself, so a GPU buffer moves like host memory once every NIC holds a
// memory region of it. Registration asks the buffer's runtime (gpu.Driver
// of its location's kind: CUDA's cuMemGetHandleForAddressRange, HIP's
// hsa_amd_portable_export_dmabuf) for a dma-buf of the allocation and
// registers that (ibv_reg_dmabuf_mr); where either side lacks dma-buf, it
// registers the device address (ibv_reg_mr), which works when a peer-memory
// module (nvidia-peermem, amdgpu's) is loaded. A buffer the NICs refuse
// stays registered without keys: the refusal is logged and counted
// (gpu_refused), and requests on it go to a transport that stages (tcp).

// dmabufOf exports the allocation holding [addr, addr+length) of device dev
// of runtime kind as a dma-buf: from the allocation's base, page aligned
// as the runtimes require, with the region's offset in it.
func dmabufOf(kind string, addr, length uint64, dev int) (int, uint64, error) {
	d, known, err := gpu.Load(kind)
	if !known {
		return -1, 0, errs.New(errs.NotSupported, "rdma", "no %s runtime is built in", kind)
	}
	if err != nil {
		return -1, 0, err
	}
	base, size, err := d.AllocRange(dev, addr)
	if err != nil {
		return -1, 0, err
	}
	page := uint64(unix.Getpagesize())
	if base%page != 0 || addr+length > base+size {
		return -1, 0, errs.New(errs.NotSupported, "rdma", "allocation [%#x,+%d) is not page aligned", base, size)
	}
	fd, err := d.DmabufFD(dev, base, (size+page-1)/page*page)
	if err != nil {
		return -1, 0, err
	}
	return fd, addr - base, nil
}

// DeviceMemory says whether rdma can serve a request from the local region
// r to buf of d (transport.DeviceMover): the peer must be reachable, buf
// registered on its NICs, and r on this engine's (a GPU region the NICs
// refused has no keys, and goes to staging).
func (t *Transport) DeviceMemory(d *segment.Desc, buf *segment.BufferDesc, r *segment.Region) bool {
	return t.remoteOK(d, buf) && r != nil && len(r.Desc.Lkey) == len(t.nics) && len(t.nics) > 0
}

func (t *Transport) remoteOK(d *segment.Desc, buf *segment.BufferDesc) bool {
	if buf == nil || t.Reachable(d) != nil {
		return false
	}
	pi := t.peerOf(d)
	return len(pi.nics) > 0 && len(buf.Rkey) == len(pi.nics)
}
