package ibv

import (
	"testing"
	"unsafe"

	"github.com/tecache/te/internal/sys/layouttest"
)

// cfield is one fact about a C layout: the offset and size of a member
// (member != "") or the size of the whole type.
type cfield struct {
	ctype, member string
	off, size     uintptr
}

// goLayout is what the Go mirrors claim, in the form the C program prints.
func goLayout() []cfield {
	var out []cfield
	add := func(ctype, member string, off, size uintptr) {
		out = append(out, cfield{ctype, member, off, size})
	}
	whole := func(ctype string, size uintptr) { add(ctype, "", 0, size) }

	var gid GID
	whole("union ibv_gid", unsafe.Sizeof(gid))

	var sge Sge
	whole("struct ibv_sge", unsafe.Sizeof(sge))
	add("struct ibv_sge", "addr", unsafe.Offsetof(sge.Addr), unsafe.Sizeof(sge.Addr))
	add("struct ibv_sge", "length", unsafe.Offsetof(sge.Length), unsafe.Sizeof(sge.Length))
	add("struct ibv_sge", "lkey", unsafe.Offsetof(sge.Lkey), unsafe.Sizeof(sge.Lkey))

	var wr SendWR
	const sw = "struct ibv_send_wr"
	whole(sw, unsafe.Sizeof(wr))
	add(sw, "wr_id", unsafe.Offsetof(wr.WRID), unsafe.Sizeof(wr.WRID))
	add(sw, "next", unsafe.Offsetof(wr.Next), unsafe.Sizeof(wr.Next))
	add(sw, "sg_list", unsafe.Offsetof(wr.SgList), unsafe.Sizeof(wr.SgList))
	add(sw, "num_sge", unsafe.Offsetof(wr.NumSge), unsafe.Sizeof(wr.NumSge))
	add(sw, "opcode", unsafe.Offsetof(wr.Opcode), unsafe.Sizeof(wr.Opcode))
	add(sw, "send_flags", unsafe.Offsetof(wr.SendFlags), unsafe.Sizeof(wr.SendFlags))
	add(sw, "imm_data", unsafe.Offsetof(wr.ImmData), unsafe.Sizeof(wr.ImmData))
	add(sw, "invalidate_rkey", unsafe.Offsetof(wr.ImmData), unsafe.Sizeof(wr.ImmData))
	add(sw, "wr", unsafe.Offsetof(wr.RemoteAddr), unsafe.Offsetof(wr.XRCRemote)-unsafe.Offsetof(wr.RemoteAddr))
	add(sw, "wr.rdma.remote_addr", unsafe.Offsetof(wr.RemoteAddr), unsafe.Sizeof(wr.RemoteAddr))
	add(sw, "wr.rdma.rkey", unsafe.Offsetof(wr.Rkey), unsafe.Sizeof(wr.Rkey))
	add(sw, "qp_type.xrc.remote_srqn", unsafe.Offsetof(wr.XRCRemote), unsafe.Sizeof(wr.XRCRemote))
	add(sw, "bind_mw", unsafe.Sizeof(wr)-48, 48)
	add(sw, "tso", unsafe.Sizeof(wr)-48, 16)

	var rw RecvWR
	const rs = "struct ibv_recv_wr"
	whole(rs, unsafe.Sizeof(rw))
	add(rs, "wr_id", unsafe.Offsetof(rw.WRID), unsafe.Sizeof(rw.WRID))
	add(rs, "next", unsafe.Offsetof(rw.Next), unsafe.Sizeof(rw.Next))
	add(rs, "sg_list", unsafe.Offsetof(rw.SgList), unsafe.Sizeof(rw.SgList))
	add(rs, "num_sge", unsafe.Offsetof(rw.NumSge), unsafe.Sizeof(rw.NumSge))

	var wc WC
	const ws = "struct ibv_wc"
	whole(ws, unsafe.Sizeof(wc))
	add(ws, "wr_id", unsafe.Offsetof(wc.WRID), unsafe.Sizeof(wc.WRID))
	add(ws, "status", unsafe.Offsetof(wc.Status), unsafe.Sizeof(wc.Status))
	add(ws, "opcode", unsafe.Offsetof(wc.Opcode), unsafe.Sizeof(wc.Opcode))
	add(ws, "vendor_err", unsafe.Offsetof(wc.VendorErr), unsafe.Sizeof(wc.VendorErr))
	add(ws, "byte_len", unsafe.Offsetof(wc.ByteLen), unsafe.Sizeof(wc.ByteLen))
	add(ws, "imm_data", unsafe.Offsetof(wc.ImmData), unsafe.Sizeof(wc.ImmData))
	add(ws, "qp_num", unsafe.Offsetof(wc.QPNum), unsafe.Sizeof(wc.QPNum))
	add(ws, "src_qp", unsafe.Offsetof(wc.SrcQP), unsafe.Sizeof(wc.SrcQP))
	add(ws, "wc_flags", unsafe.Offsetof(wc.WCFlags), unsafe.Sizeof(wc.WCFlags))
	add(ws, "pkey_index", unsafe.Offsetof(wc.PkeyIndex), unsafe.Sizeof(wc.PkeyIndex))
	add(ws, "slid", unsafe.Offsetof(wc.Slid), unsafe.Sizeof(wc.Slid))
	add(ws, "sl", unsafe.Offsetof(wc.SL), unsafe.Sizeof(wc.SL))
	add(ws, "dlid_path_bits", unsafe.Offsetof(wc.DlidPathBits), unsafe.Sizeof(wc.DlidPathBits))

	var qc QPCap
	const qcs = "struct ibv_qp_cap"
	whole(qcs, unsafe.Sizeof(qc))
	add(qcs, "max_send_wr", unsafe.Offsetof(qc.MaxSendWR), 4)
	add(qcs, "max_recv_wr", unsafe.Offsetof(qc.MaxRecvWR), 4)
	add(qcs, "max_send_sge", unsafe.Offsetof(qc.MaxSendSge), 4)
	add(qcs, "max_recv_sge", unsafe.Offsetof(qc.MaxRecvSge), 4)
	add(qcs, "max_inline_data", unsafe.Offsetof(qc.MaxInlineData), 4)

	var qi QPInitAttr
	const qis = "struct ibv_qp_init_attr"
	whole(qis, unsafe.Sizeof(qi))
	add(qis, "qp_context", unsafe.Offsetof(qi.QPContext), 8)
	add(qis, "send_cq", unsafe.Offsetof(qi.SendCQ), 8)
	add(qis, "recv_cq", unsafe.Offsetof(qi.RecvCQ), 8)
	add(qis, "srq", unsafe.Offsetof(qi.SRQ), 8)
	add(qis, "cap", unsafe.Offsetof(qi.Cap), unsafe.Sizeof(qi.Cap))
	add(qis, "qp_type", unsafe.Offsetof(qi.QPType), 4)
	add(qis, "sq_sig_all", unsafe.Offsetof(qi.SqSigAll), 4)

	var gr GlobalRoute
	const grs = "struct ibv_global_route"
	whole(grs, unsafe.Sizeof(gr))
	add(grs, "dgid", unsafe.Offsetof(gr.DGID), 16)
	add(grs, "flow_label", unsafe.Offsetof(gr.FlowLabel), 4)
	add(grs, "sgid_index", unsafe.Offsetof(gr.SGIDIndex), 1)
	add(grs, "hop_limit", unsafe.Offsetof(gr.HopLimit), 1)
	add(grs, "traffic_class", unsafe.Offsetof(gr.TrafficClass), 1)

	var ah AHAttr
	const ahs = "struct ibv_ah_attr"
	whole(ahs, unsafe.Sizeof(ah))
	add(ahs, "grh", unsafe.Offsetof(ah.GRH), unsafe.Sizeof(ah.GRH))
	add(ahs, "dlid", unsafe.Offsetof(ah.DLID), 2)
	add(ahs, "sl", unsafe.Offsetof(ah.SL), 1)
	add(ahs, "src_path_bits", unsafe.Offsetof(ah.SrcPathBits), 1)
	add(ahs, "static_rate", unsafe.Offsetof(ah.StaticRate), 1)
	add(ahs, "is_global", unsafe.Offsetof(ah.IsGlobal), 1)
	add(ahs, "port_num", unsafe.Offsetof(ah.PortNum), 1)

	var qa QPAttr
	const qas = "struct ibv_qp_attr"
	whole(qas, unsafe.Sizeof(qa))
	for _, f := range []struct {
		m         string
		off, size uintptr
	}{
		{"qp_state", unsafe.Offsetof(qa.QPState), 4},
		{"cur_qp_state", unsafe.Offsetof(qa.CurQPState), 4},
		{"path_mtu", unsafe.Offsetof(qa.PathMTU), 4},
		{"path_mig_state", unsafe.Offsetof(qa.PathMigState), 4},
		{"qkey", unsafe.Offsetof(qa.QKey), 4},
		{"rq_psn", unsafe.Offsetof(qa.RQPSN), 4},
		{"sq_psn", unsafe.Offsetof(qa.SQPSN), 4},
		{"dest_qp_num", unsafe.Offsetof(qa.DestQPNum), 4},
		{"qp_access_flags", unsafe.Offsetof(qa.QPAccessFlags), 4},
		{"cap", unsafe.Offsetof(qa.Cap), unsafe.Sizeof(qa.Cap)},
		{"ah_attr", unsafe.Offsetof(qa.AHAttr), unsafe.Sizeof(qa.AHAttr)},
		{"alt_ah_attr", unsafe.Offsetof(qa.AltAHAttr), unsafe.Sizeof(qa.AltAHAttr)},
		{"pkey_index", unsafe.Offsetof(qa.PkeyIndex), 2},
		{"alt_pkey_index", unsafe.Offsetof(qa.AltPkeyIndex), 2},
		{"en_sqd_async_notify", unsafe.Offsetof(qa.EnSQDAsyncNotify), 1},
		{"sq_draining", unsafe.Offsetof(qa.SQDraining), 1},
		{"max_rd_atomic", unsafe.Offsetof(qa.MaxRdAtomic), 1},
		{"max_dest_rd_atomic", unsafe.Offsetof(qa.MaxDestRdAtomic), 1},
		{"min_rnr_timer", unsafe.Offsetof(qa.MinRNRTimer), 1},
		{"port_num", unsafe.Offsetof(qa.PortNum), 1},
		{"timeout", unsafe.Offsetof(qa.Timeout), 1},
		{"retry_cnt", unsafe.Offsetof(qa.RetryCnt), 1},
		{"rnr_retry", unsafe.Offsetof(qa.RNRRetry), 1},
		{"alt_port_num", unsafe.Offsetof(qa.AltPortNum), 1},
		{"alt_timeout", unsafe.Offsetof(qa.AltTimeout), 1},
		{"rate_limit", unsafe.Offsetof(qa.RateLimit), 4},
	} {
		add(qas, f.m, f.off, f.size)
	}

	var pa PortAttr
	const pas = "struct ibv_port_attr"
	whole(pas, unsafe.Sizeof(pa))
	for _, f := range []struct {
		m         string
		off, size uintptr
	}{
		{"state", unsafe.Offsetof(pa.State), 4},
		{"max_mtu", unsafe.Offsetof(pa.MaxMTU), 4},
		{"active_mtu", unsafe.Offsetof(pa.ActiveMTU), 4},
		{"gid_tbl_len", unsafe.Offsetof(pa.GIDTblLen), 4},
		{"port_cap_flags", unsafe.Offsetof(pa.PortCapFlags), 4},
		{"max_msg_sz", unsafe.Offsetof(pa.MaxMsgSz), 4},
		{"bad_pkey_cntr", unsafe.Offsetof(pa.BadPkeyCntr), 4},
		{"qkey_viol_cntr", unsafe.Offsetof(pa.QKeyViolCntr), 4},
		{"pkey_tbl_len", unsafe.Offsetof(pa.PkeyTblLen), 2},
		{"lid", unsafe.Offsetof(pa.LID), 2},
		{"sm_lid", unsafe.Offsetof(pa.SMLID), 2},
		{"lmc", unsafe.Offsetof(pa.LMC), 1},
		{"max_vl_num", unsafe.Offsetof(pa.MaxVLNum), 1},
		{"sm_sl", unsafe.Offsetof(pa.SMSL), 1},
		{"subnet_timeout", unsafe.Offsetof(pa.SubnetTimeout), 1},
		{"init_type_reply", unsafe.Offsetof(pa.InitTypeReply), 1},
		{"active_width", unsafe.Offsetof(pa.ActiveWidth), 1},
		{"active_speed", unsafe.Offsetof(pa.ActiveSpeed), 1},
		{"phys_state", unsafe.Offsetof(pa.PhysState), 1},
		{"link_layer", unsafe.Offsetof(pa.LinkLayer), 1},
		{"flags", unsafe.Offsetof(pa.Flags), 1},
		{"port_cap_flags2", unsafe.Offsetof(pa.PortCapFlags2), 2},
	} {
		add(pas, f.m, f.off, f.size)
	}

	var da DeviceAttr
	const das = "struct ibv_device_attr"
	whole(das, unsafe.Sizeof(da))
	add(das, "fw_ver", unsafe.Offsetof(da.FwVer), 64)
	add(das, "node_guid", unsafe.Offsetof(da.NodeGUID), 8)
	add(das, "max_mr_size", unsafe.Offsetof(da.MaxMRSize), 8)
	add(das, "vendor_id", unsafe.Offsetof(da.VendorID), 4)
	add(das, "max_qp", unsafe.Offsetof(da.MaxQP), 4)
	add(das, "max_qp_wr", unsafe.Offsetof(da.MaxQPWR), 4)
	add(das, "max_sge", unsafe.Offsetof(da.MaxSge), 4)
	add(das, "max_cq", unsafe.Offsetof(da.MaxCQ), 4)
	add(das, "max_cqe", unsafe.Offsetof(da.MaxCQE), 4)
	add(das, "max_mr", unsafe.Offsetof(da.MaxMR), 4)
	add(das, "max_qp_rd_atom", unsafe.Offsetof(da.MaxQPRdAtom), 4)
	add(das, "max_qp_init_rd_atom", unsafe.Offsetof(da.MaxQPInitRdAtom), 4)
	add(das, "atomic_cap", unsafe.Offsetof(da.AtomicCap), 4)
	add(das, "max_srq_sge", unsafe.Offsetof(da.MaxSRQSge), 4)
	add(das, "max_pkeys", unsafe.Offsetof(da.MaxPkeys), 2)
	add(das, "local_ca_ack_delay", unsafe.Offsetof(da.LocalCAAckDelay), 1)
	add(das, "phys_port_cnt", unsafe.Offsetof(da.PhysPortCnt), 1)

	var mr RawMR
	const mrs = "struct ibv_mr"
	whole(mrs, unsafe.Sizeof(mr))
	add(mrs, "context", unsafe.Offsetof(mr.Context), 8)
	add(mrs, "pd", unsafe.Offsetof(mr.PD), 8)
	add(mrs, "addr", unsafe.Offsetof(mr.Addr), 8)
	add(mrs, "length", unsafe.Offsetof(mr.Length), 8)
	add(mrs, "handle", unsafe.Offsetof(mr.Handle), 4)
	add(mrs, "lkey", unsafe.Offsetof(mr.Lkey), 4)
	add(mrs, "rkey", unsafe.Offsetof(mr.Rkey), 4)

	var pd RawPD
	whole("struct ibv_pd", unsafe.Sizeof(pd))
	add("struct ibv_pd", "context", unsafe.Offsetof(pd.Context), 8)
	add("struct ibv_pd", "handle", unsafe.Offsetof(pd.Handle), 4)

	var ch RawCompChannel
	whole("struct ibv_comp_channel", unsafe.Sizeof(ch))
	add("struct ibv_comp_channel", "context", unsafe.Offsetof(ch.Context), 8)
	add("struct ibv_comp_channel", "fd", unsafe.Offsetof(ch.FD), 4)
	add("struct ibv_comp_channel", "refcnt", unsafe.Offsetof(ch.Refcnt), 4)

	var dev RawDevice
	const dvs = "struct ibv_device"
	whole(dvs, unsafe.Sizeof(dev))
	add(dvs, "_ops", unsafe.Offsetof(dev.Ops), unsafe.Sizeof(dev.Ops))
	add(dvs, "node_type", unsafe.Offsetof(dev.NodeType), 4)
	add(dvs, "transport_type", unsafe.Offsetof(dev.TransportType), 4)
	add(dvs, "name", unsafe.Offsetof(dev.Name), 64)
	add(dvs, "dev_name", unsafe.Offsetof(dev.DevName), 64)
	add(dvs, "dev_path", unsafe.Offsetof(dev.DevPath), 256)
	add(dvs, "ibdev_path", unsafe.Offsetof(dev.IBDevPath), 256)

	var ops ContextOps
	const ops_ = "struct ibv_context_ops"
	whole(ops_, unsafe.Sizeof(ops))
	add(ops_, "_compat_query_device", unsafe.Offsetof(ops.CompatQueryDevice), 8)
	add(ops_, "alloc_mw", unsafe.Offsetof(ops.AllocMW), 8)
	add(ops_, "poll_cq", unsafe.Offsetof(ops.PollCQ), 8)
	add(ops_, "req_notify_cq", unsafe.Offsetof(ops.ReqNotifyCQ), 8)
	add(ops_, "post_srq_recv", unsafe.Offsetof(ops.PostSRQRecv), 8)
	add(ops_, "post_send", unsafe.Offsetof(ops.PostSend), 8)
	add(ops_, "post_recv", unsafe.Offsetof(ops.PostRecv), 8)
	add(ops_, "_compat_async_event", unsafe.Offsetof(ops.CompatAsyncEvent), 8)

	var cx RawContext
	const cxs = "struct ibv_context"
	whole(cxs, unsafe.Sizeof(cx))
	add(cxs, "device", unsafe.Offsetof(cx.Device), 8)
	add(cxs, "ops", unsafe.Offsetof(cx.Ops), unsafe.Sizeof(cx.Ops))
	add(cxs, "ops.poll_cq", unsafe.Offsetof(cx.Ops)+unsafe.Offsetof(cx.Ops.PollCQ), 8)
	add(cxs, "ops.post_send", unsafe.Offsetof(cx.Ops)+unsafe.Offsetof(cx.Ops.PostSend), 8)
	add(cxs, "cmd_fd", unsafe.Offsetof(cx.CmdFD), 4)
	add(cxs, "async_fd", unsafe.Offsetof(cx.AsyncFD), 4)
	add(cxs, "num_comp_vectors", unsafe.Offsetof(cx.NumCompVectors), 4)
	add(cxs, "mutex", unsafe.Offsetof(cx.Mutex), unsafe.Sizeof(cx.Mutex))
	add(cxs, "abi_compat", unsafe.Offsetof(cx.ABICompat), 8)

	const vcs = "struct verbs_context"
	whole(vcs, uintptr(VerbsContextSize))
	add(vcs, "query_port", VerbsContextQueryPortOff, 8)
	add(vcs, "sz", VerbsContextSzOff, 8)
	add(vcs, "context", VerbsContextCtxOff, unsafe.Sizeof(cx))

	var cq CQHead
	const cqs = "struct ibv_cq"
	add(cqs, "context", unsafe.Offsetof(cq.Context), 8)
	add(cqs, "channel", unsafe.Offsetof(cq.Channel), 8)
	add(cqs, "cq_context", unsafe.Offsetof(cq.CQCtx), 8)
	add(cqs, "handle", unsafe.Offsetof(cq.Handle), 4)
	add(cqs, "cqe", unsafe.Offsetof(cq.CQE), 4)

	var qp QPHead
	const qps = "struct ibv_qp"
	add(qps, "context", unsafe.Offsetof(qp.Context), 8)
	add(qps, "qp_context", unsafe.Offsetof(qp.QPContext), 8)
	add(qps, "pd", unsafe.Offsetof(qp.PD), 8)
	add(qps, "send_cq", unsafe.Offsetof(qp.SendCQ), 8)
	add(qps, "recv_cq", unsafe.Offsetof(qp.RecvCQ), 8)
	add(qps, "srq", unsafe.Offsetof(qp.SRQ), 8)
	add(qps, "handle", unsafe.Offsetof(qp.Handle), 4)
	add(qps, "qp_num", unsafe.Offsetof(qp.QPNum), 4)
	add(qps, "state", unsafe.Offsetof(qp.State), 4)
	add(qps, "qp_type", unsafe.Offsetof(qp.QPType), 4)
	return out
}

// TestLayout compares every Go mirror with the C definitions: always with
// the golden file of this architecture, and with the installed headers when
// a C compiler and libibverbs-dev are present (CI installs both).
func TestLayout(t *testing.T) {
	var facts []layouttest.Fact
	for _, f := range goLayout() {
		if f.member == "" {
			facts = append(facts, layouttest.Size(f.ctype, f.size))
		} else {
			facts = append(facts, layouttest.Member(f.ctype, f.member, f.off, f.size))
		}
	}
	layouttest.Check(t, "infiniband/verbs.h", "offsetof/sizeof from rdma-core's verbs.h (Debian libibverbs-dev 44.0-2), "+
		"written by TestLayout with TE_UPDATE_GOLDEN=1", facts)
}

// TestLayoutArm64 checks testdata/layout_arm64.golden against verbs.h built
// for arm64 (the cross compiler, its program under qemu-user): the arm64
// mirrors (layout_arm64.go) meet that file in make test-arm64.
func TestLayoutArm64(t *testing.T) {
	var facts []layouttest.Fact
	for _, f := range goLayout() {
		if f.member == "" {
			facts = append(facts, layouttest.Size(f.ctype, f.size))
		} else {
			facts = append(facts, layouttest.Member(f.ctype, f.member, f.off, f.size))
		}
	}
	layouttest.CheckArch(t, "arm64", "infiniband/verbs.h", facts)
}
