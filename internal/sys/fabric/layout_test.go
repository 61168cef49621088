package fabric

import (
	"testing"
	"unsafe"

	lt "github.com/tecache/te/internal/sys/layouttest"
)

// goFacts is what the Go mirrors claim, keyed as the C program prints them.
func goFacts() []lt.Fact {
	var f []lt.Fact
	m := func(ctype, member string, off, size uintptr) { f = append(f, lt.Member(ctype, member, off, size)) }
	sz := func(ctype string, size uintptr) { f = append(f, lt.Size(ctype, size)) }
	c := func(name string, v uint64) { f = append(f, lt.Const(name, v)) }

	var fid Fid
	sz("struct fid", unsafe.Sizeof(fid))
	m("struct fid", "fclass", unsafe.Offsetof(fid.Fclass), unsafe.Sizeof(fid.Fclass))
	m("struct fid", "context", unsafe.Offsetof(fid.Context), unsafe.Sizeof(fid.Context))
	m("struct fid", "ops", unsafe.Offsetof(fid.Ops), unsafe.Sizeof(fid.Ops))

	var fo FiOps
	const fos = "struct fi_ops"
	sz(fos, unsafe.Sizeof(fo))
	m(fos, "size", unsafe.Offsetof(fo.Size), 8)
	m(fos, "close", unsafe.Offsetof(fo.Close), 8)
	m(fos, "bind", unsafe.Offsetof(fo.Bind), 8)
	m(fos, "control", unsafe.Offsetof(fo.Control), 8)
	m(fos, "ops_open", unsafe.Offsetof(fo.OpsOpen), 8)
	m(fos, "tostr", unsafe.Offsetof(fo.ToStr), 8)
	m(fos, "ops_set", unsafe.Offsetof(fo.OpsSet), 8)

	var in Info
	const is = "struct fi_info"
	sz(is, unsafe.Sizeof(in))
	m(is, "next", unsafe.Offsetof(in.Next), 8)
	m(is, "caps", unsafe.Offsetof(in.Caps), 8)
	m(is, "mode", unsafe.Offsetof(in.Mode), 8)
	m(is, "addr_format", unsafe.Offsetof(in.AddrFormat), 4)
	m(is, "src_addrlen", unsafe.Offsetof(in.SrcAddrLen), 8)
	m(is, "dest_addrlen", unsafe.Offsetof(in.DestAddrLen), 8)
	m(is, "src_addr", unsafe.Offsetof(in.SrcAddr), 8)
	m(is, "dest_addr", unsafe.Offsetof(in.DestAddr), 8)
	m(is, "handle", unsafe.Offsetof(in.Handle), 8)
	m(is, "tx_attr", unsafe.Offsetof(in.TxAttr), 8)
	m(is, "rx_attr", unsafe.Offsetof(in.RxAttr), 8)
	m(is, "ep_attr", unsafe.Offsetof(in.EPAttr), 8)
	m(is, "domain_attr", unsafe.Offsetof(in.DomainAttr), 8)
	m(is, "fabric_attr", unsafe.Offsetof(in.FabricAttr), 8)
	m(is, "nic", unsafe.Offsetof(in.Nic), 8)

	var fa FabricAttr
	const fas = "struct fi_fabric_attr"
	sz(fas, unsafe.Sizeof(fa))
	m(fas, "fabric", unsafe.Offsetof(fa.Fabric), 8)
	m(fas, "name", unsafe.Offsetof(fa.Name), 8)
	m(fas, "prov_name", unsafe.Offsetof(fa.ProvName), 8)
	m(fas, "prov_version", unsafe.Offsetof(fa.ProvVersion), 4)
	m(fas, "api_version", unsafe.Offsetof(fa.APIVersion), 4)

	var da DomainAttr
	const das = "struct fi_domain_attr"
	sz(das, unsafe.Sizeof(da))
	m(das, "domain", unsafe.Offsetof(da.Domain), 8)
	m(das, "name", unsafe.Offsetof(da.Name), 8)
	m(das, "threading", unsafe.Offsetof(da.Threading), 4)
	m(das, "control_progress", unsafe.Offsetof(da.ControlProgress), 4)
	m(das, "data_progress", unsafe.Offsetof(da.DataProgress), 4)
	m(das, "resource_mgmt", unsafe.Offsetof(da.ResourceMgmt), 4)
	m(das, "av_type", unsafe.Offsetof(da.AVType), 4)
	m(das, "mr_mode", unsafe.Offsetof(da.MRMode), 4)
	m(das, "mr_key_size", unsafe.Offsetof(da.MRKeySize), 8)
	m(das, "mr_iov_limit", unsafe.Offsetof(da.MRIovLimit), 8)
	m(das, "caps", unsafe.Offsetof(da.Caps), 8)
	m(das, "mode", unsafe.Offsetof(da.Mode), 8)
	m(das, "auth_key", unsafe.Offsetof(da.AuthKey), 8)
	m(das, "mr_cnt", unsafe.Offsetof(da.MRCnt), 8)
	m(das, "tclass", unsafe.Offsetof(da.TClass), 4)

	var ea EPAttr
	const eas = "struct fi_ep_attr"
	m(eas, "type", unsafe.Offsetof(ea.Type), 4)
	m(eas, "protocol", unsafe.Offsetof(ea.Protocol), 4)
	m(eas, "protocol_version", unsafe.Offsetof(ea.ProtocolVersion), 4)
	m(eas, "max_msg_size", unsafe.Offsetof(ea.MaxMsgSize), 8)

	var ta TxAttr
	const tas = "struct fi_tx_attr"
	sz(tas, unsafe.Sizeof(ta))
	m(tas, "caps", unsafe.Offsetof(ta.Caps), 8)
	m(tas, "op_flags", unsafe.Offsetof(ta.OpFlags), 8)
	m(tas, "inject_size", unsafe.Offsetof(ta.InjectSize), 8)
	m(tas, "size", unsafe.Offsetof(ta.Size), 8)
	m(tas, "rma_iov_limit", unsafe.Offsetof(ta.RMAIovLimit), 8)
	m(tas, "tclass", unsafe.Offsetof(ta.TClass), 4)

	var ff FabricFid
	m("struct fid_fabric", "fid", unsafe.Offsetof(ff.Fid), unsafe.Sizeof(ff.Fid))
	m("struct fid_fabric", "ops", unsafe.Offsetof(ff.Ops), 8)
	m("struct fid_fabric", "api_version", unsafe.Offsetof(ff.APIVersion), 4)
	var of OpsFabric
	m("struct fi_ops_fabric", "domain", unsafe.Offsetof(of.Domain), 8)

	var df DomainFid
	sz("struct fid_domain", unsafe.Sizeof(df))
	m("struct fid_domain", "ops", unsafe.Offsetof(df.Ops), 8)
	m("struct fid_domain", "mr", unsafe.Offsetof(df.MR), 8)
	var od OpsDomain
	m("struct fi_ops_domain", "av_open", unsafe.Offsetof(od.AVOpen), 8)
	m("struct fi_ops_domain", "cq_open", unsafe.Offsetof(od.CQOpen), 8)
	m("struct fi_ops_domain", "endpoint", unsafe.Offsetof(od.Endpoint), 8)
	var om OpsMR
	sz("struct fi_ops_mr", unsafe.Sizeof(om))
	m("struct fi_ops_mr", "reg", unsafe.Offsetof(om.Reg), 8)
	m("struct fi_ops_mr", "regv", unsafe.Offsetof(om.RegV), 8)
	m("struct fi_ops_mr", "regattr", unsafe.Offsetof(om.RegAttr), 8)

	var af AVFid
	sz("struct fid_av", unsafe.Sizeof(af))
	m("struct fid_av", "ops", unsafe.Offsetof(af.Ops), 8)
	var oa OpsAV
	m("struct fi_ops_av", "insert", unsafe.Offsetof(oa.Insert), 8)
	m("struct fi_ops_av", "remove", unsafe.Offsetof(oa.Remove), 8)

	var cf CQFid
	sz("struct fid_cq", unsafe.Sizeof(cf))
	m("struct fid_cq", "ops", unsafe.Offsetof(cf.Ops), 8)
	var oc OpsCQ
	m("struct fi_ops_cq", "read", unsafe.Offsetof(oc.Read), 8)
	m("struct fi_ops_cq", "readfrom", unsafe.Offsetof(oc.ReadFrom), 8)
	m("struct fi_ops_cq", "readerr", unsafe.Offsetof(oc.ReadErr), 8)
	m("struct fi_ops_cq", "sread", unsafe.Offsetof(oc.SRead), 8)

	var ef EPFid
	m("struct fid_ep", "ops", unsafe.Offsetof(ef.Ops), 8)
	m("struct fid_ep", "cm", unsafe.Offsetof(ef.CM), 8)
	m("struct fid_ep", "msg", unsafe.Offsetof(ef.Msg), 8)
	m("struct fid_ep", "rma", unsafe.Offsetof(ef.RMA), 8)
	var ocm OpsCM
	m("struct fi_ops_cm", "setname", unsafe.Offsetof(ocm.SetName), 8)
	m("struct fi_ops_cm", "getname", unsafe.Offsetof(ocm.GetName), 8)
	var or OpsRMA
	m("struct fi_ops_rma", "read", unsafe.Offsetof(or.Read), 8)
	m("struct fi_ops_rma", "readv", unsafe.Offsetof(or.ReadV), 8)
	m("struct fi_ops_rma", "readmsg", unsafe.Offsetof(or.ReadMsg), 8)
	m("struct fi_ops_rma", "write", unsafe.Offsetof(or.Write), 8)
	m("struct fi_ops_rma", "writev", unsafe.Offsetof(or.WriteV), 8)
	m("struct fi_ops_rma", "writemsg", unsafe.Offsetof(or.WriteMsg), 8)

	var mf MRFid
	sz("struct fid_mr", unsafe.Sizeof(mf))
	m("struct fid_mr", "mem_desc", unsafe.Offsetof(mf.MemDesc), 8)
	m("struct fid_mr", "key", unsafe.Offsetof(mf.Key), 8)

	var ma MRAttr
	const mas = "struct fi_mr_attr"
	m(mas, "mr_iov", unsafe.Offsetof(ma.MRIov), 8)
	m(mas, "iov_count", unsafe.Offsetof(ma.IovCount), 8)
	m(mas, "access", unsafe.Offsetof(ma.Access), 8)
	m(mas, "offset", unsafe.Offsetof(ma.Offset), 8)
	m(mas, "requested_key", unsafe.Offsetof(ma.RequestedKey), 8)
	m(mas, "context", unsafe.Offsetof(ma.Context), 8)
	m(mas, "auth_key_size", unsafe.Offsetof(ma.AuthKeySize), 8)
	m(mas, "auth_key", unsafe.Offsetof(ma.AuthKey), 8)
	m(mas, "iface", unsafe.Offsetof(ma.Iface), 4)
	m(mas, "device", unsafe.Offsetof(ma.Device), 8)
	// fi_mr_attr grew after 1.12 (hmem_data in 1.18): te fills the 1.12
	// prefix and asks for API 1.12, so the library reads no further.
	f = append(f, lt.Fact{Key: "fi_mr_attr.prefix", Expr: "(size_t)0, offsetof(struct fi_mr_attr, device) + sizeof(((struct fi_mr_attr *)0)->device)",
		Go: [2]uint64{0, uint64(unsafe.Sizeof(ma))}})

	var iov Iovec
	sz("struct iovec", unsafe.Sizeof(iov))
	m("struct iovec", "iov_base", unsafe.Offsetof(iov.Base), 8)
	m("struct iovec", "iov_len", unsafe.Offsetof(iov.Len), 8)

	var aa AVAttr
	const aas = "struct fi_av_attr"
	sz(aas, unsafe.Sizeof(aa))
	m(aas, "type", unsafe.Offsetof(aa.Type), 4)
	m(aas, "rx_ctx_bits", unsafe.Offsetof(aa.RxCtxBits), 4)
	m(aas, "count", unsafe.Offsetof(aa.Count), 8)
	m(aas, "ep_per_node", unsafe.Offsetof(aa.EPPerNode), 8)
	m(aas, "name", unsafe.Offsetof(aa.Name), 8)
	m(aas, "map_addr", unsafe.Offsetof(aa.MapAddr), 8)
	m(aas, "flags", unsafe.Offsetof(aa.Flags), 8)

	var ca CQAttr
	const cas = "struct fi_cq_attr"
	sz(cas, unsafe.Sizeof(ca))
	m(cas, "size", unsafe.Offsetof(ca.Size), 8)
	m(cas, "flags", unsafe.Offsetof(ca.Flags), 8)
	m(cas, "format", unsafe.Offsetof(ca.Format), 4)
	m(cas, "wait_obj", unsafe.Offsetof(ca.WaitObj), 4)
	m(cas, "signaling_vector", unsafe.Offsetof(ca.SignalingVector), 4)
	m(cas, "wait_cond", unsafe.Offsetof(ca.WaitCond), 4)
	m(cas, "wait_set", unsafe.Offsetof(ca.WaitSet), 8)

	sz("struct fi_cq_entry", cqContextEntrySz)
	sz("struct fi_context", fiContextSize)
	sz("struct fi_context2", fiContext2Size)
	var ce CQErrEntry
	const ces = "struct fi_cq_err_entry"
	sz(ces, unsafe.Sizeof(ce))
	m(ces, "op_context", unsafe.Offsetof(ce.OpContext), 8)
	m(ces, "flags", unsafe.Offsetof(ce.Flags), 8)
	m(ces, "len", unsafe.Offsetof(ce.Len), 8)
	m(ces, "olen", unsafe.Offsetof(ce.OLen), 8)
	m(ces, "err", unsafe.Offsetof(ce.Err), 4)
	m(ces, "prov_errno", unsafe.Offsetof(ce.ProvErrno), 4)
	m(ces, "err_data", unsafe.Offsetof(ce.ErrData), 8)
	m(ces, "err_data_size", unsafe.Offsetof(ce.ErrDataSize), 8)

	c("FI_MSG", FlagMsg)
	c("FI_RMA", FlagRMA)
	c("FI_READ", FlagRead)
	c("FI_WRITE", FlagWrite)
	c("FI_RECV", FlagRecv)
	c("FI_SEND", FlagSend)
	c("FI_REMOTE_READ", FlagRemoteRead)
	c("FI_REMOTE_WRITE", FlagRemoteWrite)
	c("FI_HMEM", FlagHMEM)
	c("FI_SOURCE", FlagSource)
	c("FI_DELIVERY_COMPLETE", FlagDeliveryComp)
	c("FI_CONTEXT", ModeContext)
	c("FI_CONTEXT2", ModeContext2)
	c("FI_MR_LOCAL", MRLocal)
	c("FI_MR_RAW", MRRaw)
	c("FI_MR_VIRT_ADDR", MRVirtAddr)
	c("FI_MR_ALLOCATED", MRAllocated)
	c("FI_MR_PROV_KEY", MRProvKey)
	c("FI_MR_MMU_NOTIFY", MRMMUNotify)
	c("FI_MR_RMA_EVENT", MRRMAEvent)
	c("FI_MR_ENDPOINT", MREndpoint)
	c("FI_MR_HMEM", MRHMEM)
	c("FI_MR_COLLECTIVE", MRCollective)
	c("FI_EP_RDM", EPRDM)
	c("FI_THREAD_SAFE", ThreadSafe)
	c("FI_PROGRESS_AUTO", ProgressAuto)
	c("FI_PROGRESS_MANUAL", ProgressManual)
	c("FI_AV_TABLE", AVTable)
	c("FI_CQ_FORMAT_CONTEXT", CQFormatContext)
	c("FI_WAIT_NONE", WaitNone)
	c("FI_WAIT_UNSPEC", WaitUnspec)
	c("FI_WAIT_FD", WaitFD)
	c("FI_HMEM_SYSTEM", HMEMSystem)
	c("FI_HMEM_CUDA", HMEMCUDA)
	c("FI_HMEM_ROCR", HMEMROCR)
	c("FI_ENABLE", ctlEnable)
	c("FI_EAGAIN", errAgain)
	c("FI_EAVAIL", errAvail)
	c("FI_ECANCELED", errCanceled)
	c("FI_ENODATA", errNoData)
	c("FI_ADDR_NOTAVAIL", addrNotAvail)
	c("FI_VERSION(1, 12)", APIVersion)
	return f
}

// TestLayoutMatchesHeaders compares every mirrored struct and constant with
// libfabric-dev's headers (and, without them, with the golden file they
// wrote).
func TestLayoutMatchesHeaders(t *testing.T) {
	lt.Check(t, "rdma/fi_rma.h rdma/fi_cm.h", "offsetof/sizeof from libfabric-dev's headers (Debian 1.17.0-3), written by TestLayoutMatchesHeaders", goFacts())
}

// TestLayoutArm64 checks testdata/layout_arm64.golden against libfabric's
// headers built for arm64 (the cross compiler, its program under
// qemu-user); the arm64 build's mirrors meet that file in make test-arm64.
func TestLayoutArm64(t *testing.T) {
	lt.CheckArch(t, "arm64", "rdma/fi_rma.h rdma/fi_cm.h", goFacts())
}
