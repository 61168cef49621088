package ibv

import "unsafe"

// The Go mirrors of rdma-core's structs (verbs.h of rdma-core 44, LP64 Linux).
// Field order, sizes and padding match the C definitions exactly; layout_test
// checks each field against the headers. Structs the library allocates and we
// only read (ibv_cq, ibv_qp) are mirrored up to the fields we use.

// GID is union ibv_gid: 16 raw bytes (subnet prefix and interface id, both
// big-endian).
type GID [16]byte

// Sge is struct ibv_sge: one local buffer of a work request.
type Sge struct {
	Addr   uint64
	Length uint32
	Lkey   uint32
}

// SendWR is struct ibv_send_wr with the rdma member of the wr union spelled
// out (remote_addr, rkey); the other union members are padding.
type SendWR struct {
	WRID       uint64
	Next       uintptr // *SendWR in C memory
	SgList     uintptr // *Sge in C memory
	NumSge     int32
	Opcode     uint32
	SendFlags  uint32
	ImmData    uint32 // union { imm_data; invalidate_rkey }
	RemoteAddr uint64 // wr.rdma.remote_addr
	Rkey       uint32 // wr.rdma.rkey
	_          [20]byte
	XRCRemote  uint32 // qp_type.xrc.remote_srqn
	_          [4]byte
	_          [48]byte // union { bind_mw; tso }
}

// RecvWR is struct ibv_recv_wr.
type RecvWR struct {
	WRID   uint64
	Next   uintptr
	SgList uintptr
	NumSge int32
	_      [4]byte
}

// WC is struct ibv_wc: one work completion.
type WC struct {
	WRID         uint64
	Status       uint32
	Opcode       uint32
	VendorErr    uint32
	ByteLen      uint32
	ImmData      uint32 // union { imm_data; invalidated_rkey }
	QPNum        uint32
	SrcQP        uint32
	WCFlags      uint32
	PkeyIndex    uint16
	Slid         uint16
	SL           uint8
	DlidPathBits uint8
	_            [2]byte
}

// QPCap is struct ibv_qp_cap.
type QPCap struct {
	MaxSendWR     uint32
	MaxRecvWR     uint32
	MaxSendSge    uint32
	MaxRecvSge    uint32
	MaxInlineData uint32
}

// QPInitAttr is struct ibv_qp_init_attr.
type QPInitAttr struct {
	QPContext uintptr
	SendCQ    uintptr
	RecvCQ    uintptr
	SRQ       uintptr
	Cap       QPCap
	QPType    uint32
	SqSigAll  int32
	_         [4]byte
}

// GlobalRoute is struct ibv_global_route.
type GlobalRoute struct {
	DGID         GID
	FlowLabel    uint32
	SGIDIndex    uint8
	HopLimit     uint8
	TrafficClass uint8
	_            [1]byte
}

// AHAttr is struct ibv_ah_attr: the address vector of a connected QP.
type AHAttr struct {
	GRH         GlobalRoute
	DLID        uint16
	SL          uint8
	SrcPathBits uint8
	StaticRate  uint8
	IsGlobal    uint8
	PortNum     uint8
	_           [1]byte
}

// QPAttr is struct ibv_qp_attr, the argument of ibv_modify_qp.
type QPAttr struct {
	QPState          uint32
	CurQPState       uint32
	PathMTU          uint32
	PathMigState     uint32
	QKey             uint32
	RQPSN            uint32
	SQPSN            uint32
	DestQPNum        uint32
	QPAccessFlags    uint32
	Cap              QPCap
	AHAttr           AHAttr
	AltAHAttr        AHAttr
	PkeyIndex        uint16
	AltPkeyIndex     uint16
	EnSQDAsyncNotify uint8
	SQDraining       uint8
	MaxRdAtomic      uint8
	MaxDestRdAtomic  uint8
	MinRNRTimer      uint8
	PortNum          uint8
	Timeout          uint8
	RetryCnt         uint8
	RNRRetry         uint8
	AltPortNum       uint8
	AltTimeout       uint8
	_                [1]byte
	RateLimit        uint32
	_                [4]byte
}

// PortAttr is struct ibv_port_attr (the extended form that
// verbs_context->query_port fills; the compat form is a prefix of it).
type PortAttr struct {
	State         uint32
	MaxMTU        uint32
	ActiveMTU     uint32
	GIDTblLen     int32
	PortCapFlags  uint32
	MaxMsgSz      uint32
	BadPkeyCntr   uint32
	QKeyViolCntr  uint32
	PkeyTblLen    uint16
	LID           uint16
	SMLID         uint16
	LMC           uint8
	MaxVLNum      uint8
	SMSL          uint8
	SubnetTimeout uint8
	InitTypeReply uint8
	ActiveWidth   uint8
	ActiveSpeed   uint8
	PhysState     uint8
	LinkLayer     uint8
	Flags         uint8
	PortCapFlags2 uint16
	_             [2]byte
}

// DeviceAttr is struct ibv_device_attr.
type DeviceAttr struct {
	FwVer                 [64]byte
	NodeGUID              uint64
	SysImageGUID          uint64
	MaxMRSize             uint64
	PageSizeCap           uint64
	VendorID              uint32
	VendorPartID          uint32
	HwVer                 uint32
	MaxQP                 int32
	MaxQPWR               int32
	DeviceCapFlags        uint32
	MaxSge                int32
	MaxSgeRd              int32
	MaxCQ                 int32
	MaxCQE                int32
	MaxMR                 int32
	MaxPD                 int32
	MaxQPRdAtom           int32
	MaxEERdAtom           int32
	MaxResRdAtom          int32
	MaxQPInitRdAtom       int32
	MaxEEInitRdAtom       int32
	AtomicCap             uint32
	MaxEE                 int32
	MaxRDD                int32
	MaxMW                 int32
	MaxRawIPv6QP          int32
	MaxRawEthyQP          int32
	MaxMcastGrp           int32
	MaxMcastQPAttach      int32
	MaxTotalMcastQPAttach int32
	MaxAH                 int32
	MaxFMR                int32
	MaxMapPerFMR          int32
	MaxSRQ                int32
	MaxSRQWR              int32
	MaxSRQSge             int32
	MaxPkeys              uint16
	LocalCAAckDelay       uint8
	PhysPortCnt           uint8
	_                     [4]byte
}

// RawMR is struct ibv_mr, allocated by the library.
type RawMR struct {
	Context uintptr
	PD      uintptr
	Addr    uintptr
	Length  uint64
	Handle  uint32
	Lkey    uint32
	Rkey    uint32
	_       [4]byte
}

// RawPD is struct ibv_pd.
type RawPD struct {
	Context uintptr
	Handle  uint32
	_       [4]byte
}

// RawCompChannel is struct ibv_comp_channel.
type RawCompChannel struct {
	Context uintptr
	FD      int32
	Refcnt  int32
}

// RawDevice is struct ibv_device.
type RawDevice struct {
	Ops           [2]uintptr // struct _ibv_device_ops
	NodeType      int32
	TransportType int32
	Name          [64]byte
	DevName       [64]byte
	DevPath       [256]byte
	IBDevPath     [256]byte
}

// ContextOps is struct ibv_context_ops. Only poll_cq, req_notify_cq,
// post_send and post_recv are called; the rest are placeholders the header
// keeps for ABI compatibility.
type ContextOps struct {
	CompatQueryDevice uintptr
	CompatQueryPort   uintptr
	CompatAllocPD     uintptr
	CompatDeallocPD   uintptr
	CompatRegMR       uintptr
	CompatReregMR     uintptr
	CompatDeregMR     uintptr
	AllocMW           uintptr
	BindMW            uintptr
	DeallocMW         uintptr
	CompatCreateCQ    uintptr
	PollCQ            uintptr
	ReqNotifyCQ       uintptr
	CompatCQEvent     uintptr
	CompatResizeCQ    uintptr
	CompatDestroyCQ   uintptr
	CompatCreateSRQ   uintptr
	CompatModifySRQ   uintptr
	CompatQuerySRQ    uintptr
	CompatDestroySRQ  uintptr
	PostSRQRecv       uintptr
	CompatCreateQP    uintptr
	CompatQueryQP     uintptr
	CompatModifyQP    uintptr
	CompatDestroyQP   uintptr
	PostSend          uintptr
	PostRecv          uintptr
	CompatCreateAH    uintptr
	CompatDestroyAH   uintptr
	CompatAttachMcast uintptr
	CompatDetachMcast uintptr
	CompatAsyncEvent  uintptr
}

// RawContext is struct ibv_context.
type RawContext struct {
	Device         uintptr
	Ops            ContextOps
	CmdFD          int32
	AsyncFD        int32
	NumCompVectors int32
	_              [4]byte
	Mutex          [pthreadMutexSize]byte
	ABICompat      uintptr
}

// CQHead is the start of struct ibv_cq, up to the fields te reads.
type CQHead struct {
	Context uintptr
	Channel uintptr
	CQCtx   uintptr
	Handle  uint32
	CQE     int32
}

// QPHead is the start of struct ibv_qp, up to the fields te reads.
type QPHead struct {
	Context   uintptr
	QPContext uintptr
	PD        uintptr
	SendCQ    uintptr
	RecvCQ    uintptr
	SRQ       uintptr
	Handle    uint32
	QPNum     uint32
	State     uint32
	QPType    uint32
}

// struct verbs_context ends with a struct ibv_context; the fields before it
// are reached by subtracting from the ibv_context pointer, as the header's
// verbs_get_ctx does.
const (
	// VerbsContextCtxOff is offsetof(struct verbs_context, context).
	VerbsContextCtxOff = 40 * 8
	// VerbsContextSzOff is offsetof(struct verbs_context, sz).
	VerbsContextSzOff = VerbsContextCtxOff - 8
	// VerbsContextQueryPortOff is offsetof(struct verbs_context, query_port).
	VerbsContextQueryPortOff = 0
	// VerbsContextSize is sizeof(struct verbs_context).
	VerbsContextSize = VerbsContextCtxOff + int(unsafe.Sizeof(RawContext{}))
	// abiIsExtended is __VERBS_ABI_IS_EXTENDED, the marker in abi_compat.
	abiIsExtended = ^uintptr(0)
)

// Enum values from verbs.h.
const (
	AccessLocalWrite        = 1
	AccessRemoteWrite       = 1 << 1
	AccessRemoteRead        = 1 << 2
	AccessRelaxedOrdering   = 1 << 20
	accessOptionalRangeMask = (((1 << 29) << 1) - 1) &^ ((1 << 20) - 1)

	QPTypeRC = 2

	QPStateReset = 0
	QPStateInit  = 1
	QPStateRTR   = 2
	QPStateRTS   = 3
	QPStateErr   = 6

	QPAttrState           = 1 << 0
	QPAttrAccessFlags     = 1 << 3
	QPAttrPkeyIndex       = 1 << 4
	QPAttrPort            = 1 << 5
	QPAttrAV              = 1 << 7
	QPAttrPathMTU         = 1 << 8
	QPAttrTimeout         = 1 << 9
	QPAttrRetryCnt        = 1 << 10
	QPAttrRNRRetry        = 1 << 11
	QPAttrRQPSN           = 1 << 12
	QPAttrMaxQPRdAtomic   = 1 << 13
	QPAttrMinRNRTimer     = 1 << 15
	QPAttrSQPSN           = 1 << 16
	QPAttrMaxDestRdAtomic = 1 << 17
	QPAttrDestQPN         = 1 << 20

	WRRDMAWrite = 0
	WRRDMARead  = 4

	SendSignaled = 1 << 1

	MTU256  = 1
	MTU512  = 2
	MTU1024 = 3
	MTU2048 = 4
	MTU4096 = 5

	PortActive = 4

	LinkLayerUnspecified = 0
	LinkLayerInfiniBand  = 1
	LinkLayerEthernet    = 2

	WCSuccess      = 0
	WCWRFlushErr   = 5
	WCRemAccessErr = 10
	WCRetryExcErr  = 12
)

var wcStatusNames = [...]string{
	"success", "local length error", "local QP operation error", "local EE context operation error",
	"local protection error", "WR flushed", "memory window bind error", "bad response error",
	"local access error", "remote invalid request error", "remote access error", "remote operation error",
	"transport retry counter exceeded", "RNR retry counter exceeded", "local RDD violation error",
	"remote invalid RD request", "remote aborted error", "invalid EE context number",
	"invalid EE context state", "fatal error", "response timeout error", "general error",
	"tag matching error", "tag matching rendezvous incomplete",
}

// WCStatusString names a completion status as ibv_wc_status_str does.
func WCStatusString(s uint32) string {
	if int(s) < len(wcStatusNames) {
		return wcStatusNames[s]
	}
	return "unknown"
}

// MTUBytes returns the size in bytes of an enum ibv_mtu value (0 if invalid).
func MTUBytes(m uint32) int {
	if m < MTU256 || m > MTU4096 {
		return 0
	}
	return 128 << m
}
