package uring

import (
	"testing"
	"unsafe"

	"github.com/tecache/te/internal/sys/layouttest"
)

func goFacts() []layouttest.Fact {
	var out []layouttest.Fact
	member := func(ctype, m string, off, size uintptr) { out = append(out, layouttest.Member(ctype, m, off, size)) }
	whole := func(ctype string, size uintptr) { out = append(out, layouttest.Size(ctype, size)) }
	constant := func(name string, v uint64) { out = append(out, layouttest.Const(name, v)) }

	var s SQE
	const ss = "struct io_uring_sqe"
	whole(ss, unsafe.Sizeof(s))
	member(ss, "opcode", unsafe.Offsetof(s.Opcode), unsafe.Sizeof(s.Opcode))
	member(ss, "flags", unsafe.Offsetof(s.Flags), unsafe.Sizeof(s.Flags))
	member(ss, "ioprio", unsafe.Offsetof(s.IOPrio), unsafe.Sizeof(s.IOPrio))
	member(ss, "fd", unsafe.Offsetof(s.FD), unsafe.Sizeof(s.FD))
	member(ss, "off", unsafe.Offsetof(s.Off), unsafe.Sizeof(s.Off))
	member(ss, "addr", unsafe.Offsetof(s.Addr), unsafe.Sizeof(s.Addr))
	member(ss, "len", unsafe.Offsetof(s.Len), unsafe.Sizeof(s.Len))
	member(ss, "rw_flags", unsafe.Offsetof(s.OpFlags), unsafe.Sizeof(s.OpFlags))
	member(ss, "poll32_events", unsafe.Offsetof(s.OpFlags), unsafe.Sizeof(s.OpFlags))
	member(ss, "cancel_flags", unsafe.Offsetof(s.OpFlags), unsafe.Sizeof(s.OpFlags))
	member(ss, "user_data", unsafe.Offsetof(s.UserData), unsafe.Sizeof(s.UserData))
	member(ss, "buf_index", unsafe.Offsetof(s.BufIndex), unsafe.Sizeof(s.BufIndex))
	member(ss, "personality", unsafe.Offsetof(s.Personality), unsafe.Sizeof(s.Personality))
	member(ss, "file_index", unsafe.Offsetof(s.FileIndex), unsafe.Sizeof(s.FileIndex))
	member(ss, "addr3", unsafe.Offsetof(s.Addr3), unsafe.Sizeof(s.Addr3))

	var c CQE
	const cs = "struct io_uring_cqe"
	whole(cs, unsafe.Sizeof(c))
	member(cs, "user_data", unsafe.Offsetof(c.UserData), unsafe.Sizeof(c.UserData))
	member(cs, "res", unsafe.Offsetof(c.Res), unsafe.Sizeof(c.Res))
	member(cs, "flags", unsafe.Offsetof(c.Flags), unsafe.Sizeof(c.Flags))

	var so SQRingOffsets
	const sos = "struct io_sqring_offsets"
	whole(sos, unsafe.Sizeof(so))
	for _, f := range []struct {
		m   string
		off uintptr
	}{{"head", unsafe.Offsetof(so.Head)}, {"tail", unsafe.Offsetof(so.Tail)}, {"ring_mask", unsafe.Offsetof(so.RingMask)},
		{"ring_entries", unsafe.Offsetof(so.RingEntries)}, {"flags", unsafe.Offsetof(so.Flags)}, {"dropped", unsafe.Offsetof(so.Dropped)},
		{"array", unsafe.Offsetof(so.Array)}} {
		member(sos, f.m, f.off, 4)
	}
	var co CQRingOffsets
	const cos = "struct io_cqring_offsets"
	whole(cos, unsafe.Sizeof(co))
	for _, f := range []struct {
		m   string
		off uintptr
	}{{"head", unsafe.Offsetof(co.Head)}, {"tail", unsafe.Offsetof(co.Tail)}, {"ring_mask", unsafe.Offsetof(co.RingMask)},
		{"ring_entries", unsafe.Offsetof(co.RingEntries)}, {"overflow", unsafe.Offsetof(co.Overflow)}, {"cqes", unsafe.Offsetof(co.CQEs)},
		{"flags", unsafe.Offsetof(co.Flags)}} {
		member(cos, f.m, f.off, 4)
	}

	var p Params
	const ps = "struct io_uring_params"
	whole(ps, unsafe.Sizeof(p))
	member(ps, "sq_entries", unsafe.Offsetof(p.SQEntries), 4)
	member(ps, "cq_entries", unsafe.Offsetof(p.CQEntries), 4)
	member(ps, "flags", unsafe.Offsetof(p.Flags), 4)
	member(ps, "features", unsafe.Offsetof(p.Features), 4)
	member(ps, "wq_fd", unsafe.Offsetof(p.WQFD), 4)
	member(ps, "sq_off", unsafe.Offsetof(p.SQOff), unsafe.Sizeof(p.SQOff))
	member(ps, "cq_off", unsafe.Offsetof(p.CQOff), unsafe.Sizeof(p.CQOff))

	var ph probeHeader
	whole("struct io_uring_probe", unsafe.Sizeof(ph))
	member("struct io_uring_probe", "last_op", unsafe.Offsetof(ph.LastOp), 1)
	member("struct io_uring_probe", "ops_len", unsafe.Offsetof(ph.OpsLen), 1)
	var po probeOp
	whole("struct io_uring_probe_op", unsafe.Sizeof(po))
	member("struct io_uring_probe_op", "op", unsafe.Offsetof(po.Op), 1)
	member("struct io_uring_probe_op", "flags", unsafe.Offsetof(po.Flags), 2)

	for _, k := range []struct {
		n string
		v uint64
	}{
		{"IORING_OP_NOP", uint64(OpNop)}, {"IORING_OP_FSYNC", uint64(OpFsync)},
		{"IORING_OP_READ_FIXED", uint64(OpReadFixed)}, {"IORING_OP_WRITE_FIXED", uint64(OpWriteFixed)},
		{"IORING_OP_POLL_ADD", uint64(OpPollAdd)}, {"IORING_OP_ASYNC_CANCEL", uint64(OpAsyncCancel)},
		{"IORING_OP_READ", uint64(OpRead)}, {"IORING_OP_WRITE", uint64(OpWrite)},
		{"IORING_SETUP_CLAMP", uint64(SetupClamp)}, {"IORING_SETUP_SUBMIT_ALL", uint64(SetupSubmitAll)},
		{"IORING_SETUP_COOP_TASKRUN", uint64(SetupCoopTaskrun)}, {"IORING_SETUP_SINGLE_ISSUER", uint64(SetupSingleIssuer)},
		{"IORING_SETUP_DEFER_TASKRUN", uint64(SetupDeferTaskrun)}, {"IORING_ENTER_GETEVENTS", uint64(enterGetEvents)},
		{"IORING_FEAT_SINGLE_MMAP", uint64(featSingleMmap)}, {"IORING_OFF_SQ_RING", offSQRing},
		{"IORING_OFF_CQ_RING", offCQRing}, {"IORING_OFF_SQES", offSQEs},
		{"IORING_REGISTER_BUFFERS", registerBuffers}, {"IORING_UNREGISTER_BUFFERS", unregisterBuffers},
		{"IORING_REGISTER_PROBE", registerProbe}, {"IO_URING_OP_SUPPORTED", uint64(opSupported)},
	} {
		constant(k.n, k.v)
	}
	return out
}

// TestLayoutMatchesKernelHeader compares every offset, size and constant the
// Go side mirrors with linux/io_uring.h (linux-libc-dev) when a C compiler
// and the header are installed, and always with the golden file written on
// amd64. TE_UPDATE_GOLDEN=1 rewrites it.
func TestLayoutMatchesKernelHeader(t *testing.T) {
	layouttest.Check(t, "linux/io_uring.h", "written by TestLayoutMatchesKernelHeader from linux/io_uring.h", goFacts())
}

// TestLayoutArm64 checks testdata/layout_arm64.golden against
// linux/io_uring.h of the arm64 cross toolchain; the arm64 build's mirrors
// meet that file in make test-arm64.
func TestLayoutArm64(t *testing.T) {
	layouttest.CheckArch(t, "arm64", "linux/io_uring.h", goFacts())
}
