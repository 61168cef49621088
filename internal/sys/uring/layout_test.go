package uring

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"unsafe"
)

// fact is one number the C compiler knows: a member's offset and size, a
// type's size, or a constant's value.
type fact struct {
	key  string // "struct io_uring_sqe.fd", "struct io_uring_cqe", "IORING_OP_READ"
	expr string // the C expression for the value(s)
	goV  [2]uint64
}

func goFacts() []fact {
	var out []fact
	member := func(ctype, m string, off, size uintptr) {
		out = append(out, fact{ctype + "." + m, fmt.Sprintf("offsetof(%s, %s), sizeof(((%s *)0)->%s)", ctype, m, ctype, m),
			[2]uint64{uint64(off), uint64(size)}})
	}
	whole := func(ctype string, size uintptr) {
		out = append(out, fact{ctype, fmt.Sprintf("(size_t)0, sizeof(%s)", ctype), [2]uint64{0, uint64(size)}})
	}
	constant := func(name string, v uint64) {
		out = append(out, fact{name, fmt.Sprintf("(size_t)0, (size_t)(%s)", name), [2]uint64{0, v}})
	}

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

func cProgram(fs []fact) string {
	var b strings.Builder
	b.WriteString("#include <stddef.h>\n#include <stdio.h>\n#include <linux/io_uring.h>\n\nint main(void) {\n")
	for _, f := range fs {
		fmt.Fprintf(&b, "\tprintf(\"%%s %%zu %%zu\\n\", %q, %s);\n", f.key, f.expr)
	}
	b.WriteString("\treturn 0;\n}\n")
	return b.String()
}

func parse(t *testing.T, data []byte) map[string][2]uint64 {
	t.Helper()
	m := map[string][2]uint64{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		j := strings.LastIndexByte(line[:i], ' ')
		a, err1 := strconv.ParseUint(line[j+1:i], 10, 64)
		v, err2 := strconv.ParseUint(line[i+1:], 10, 64)
		if j < 0 || err1 != nil || err2 != nil {
			t.Fatalf("bad layout line %q", line)
		}
		m[line[:j]] = [2]uint64{a, v}
	}
	return m
}

const golden = "testdata/layout_amd64.golden"

// TestLayoutMatchesKernelHeader compiles a program against linux/io_uring.h
// (linux-libc-dev) that prints every offset, size and constant the Go side
// mirrors, and compares. Without a C compiler or the header it compares with
// the golden file that program wrote on amd64. TE_UPDATE_GOLDEN=1 rewrites it.
func TestLayoutMatchesKernelHeader(t *testing.T) {
	fs := goFacts()
	var cOut []byte
	cc, ccErr := exec.LookPath("cc")
	_, hdrErr := os.Stat("/usr/include/linux/io_uring.h")
	if ccErr == nil && hdrErr == nil {
		dir := t.TempDir()
		src := filepath.Join(dir, "layout.c")
		if err := os.WriteFile(src, []byte(cProgram(fs)), 0o644); err != nil {
			t.Fatal(err)
		}
		bin := filepath.Join(dir, "layout")
		if out, err := exec.Command(cc, "-o", bin, src).CombinedOutput(); err != nil {
			t.Fatalf("compiling the layout program: %v\n%s", err, out)
		}
		out, err := exec.Command(bin).Output()
		if err != nil {
			t.Fatal(err)
		}
		cOut = out
		if os.Getenv("TE_UPDATE_GOLDEN") == "1" && runtime.GOARCH == "amd64" {
			if err := os.WriteFile(golden, append([]byte("# written by TestLayoutMatchesKernelHeader from linux/io_uring.h\n"), out...), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	} else {
		if runtime.GOARCH != "amd64" {
			t.Skipf("no C compiler or linux/io_uring.h, and the golden file is for amd64")
		}
		b, err := os.ReadFile(golden)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("no C compiler or kernel header (%v, %v): comparing with %s", ccErr, hdrErr, golden)
		cOut = b
	}
	c := parse(t, cOut)
	for _, f := range fs {
		v, ok := c[f.key]
		if !ok {
			t.Errorf("%s: not in the C output", f.key)
			continue
		}
		if v != f.goV {
			t.Errorf("%s: Go says (%d, %d), C says (%d, %d)", f.key, f.goV[0], f.goV[1], v[0], v[1])
		}
	}
}
