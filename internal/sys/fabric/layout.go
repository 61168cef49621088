package fabric

// Go mirrors of the libfabric structs te reads or fills, for LP64 Linux
// (amd64, arm64), and the constants it passes. Every offset, size and value
// here is compared with libfabric-dev's headers by layout_test.go.

// APIVersion is the libfabric API version te asks fi_getinfo for:
// FI_VERSION(1, 12), the oldest that has everything te uses (FI_HMEM and
// fi_mr_attr's iface/device, FI_MR_ENDPOINT, FI_CONTEXT2), so a cluster on
// an older distribution's libfabric still loads it.
const APIVersion = 1<<16 | 12

// Capability and operation flags (fabric.h).
const (
	FlagMsg          = 1 << 1  // FI_MSG
	FlagRMA          = 1 << 2  // FI_RMA
	FlagRead         = 1 << 8  // FI_READ
	FlagWrite        = 1 << 9  // FI_WRITE
	FlagRecv         = 1 << 10 // FI_RECV
	FlagSend         = 1 << 11 // FI_SEND (FI_TRANSMIT)
	FlagRemoteRead   = 1 << 12 // FI_REMOTE_READ
	FlagRemoteWrite  = 1 << 13 // FI_REMOTE_WRITE
	FlagHMEM         = 1 << 47 // FI_HMEM
	FlagSource       = 1 << 57 // FI_SOURCE: node names the source address
	FlagDeliveryComp = 1 << 28 // FI_DELIVERY_COMPLETE
)

// Mode bits an application may accept (fabric.h).
const (
	ModeContext  = 1 << 59 // FI_CONTEXT: op_context points at a struct fi_context
	ModeContext2 = 1 << 52 // FI_CONTEXT2: ... at a struct fi_context2
)

// Memory registration modes (fi_domain_attr.mr_mode; fabric.h).
const (
	MRLocal       = 1 << 2  // FI_MR_LOCAL: local buffers need a descriptor
	MRRaw         = 1 << 3  // FI_MR_RAW
	MRVirtAddr    = 1 << 4  // FI_MR_VIRT_ADDR: remote addresses are virtual, else offsets
	MRAllocated   = 1 << 5  // FI_MR_ALLOCATED: only mapped memory registers
	MRProvKey     = 1 << 6  // FI_MR_PROV_KEY: the provider picks keys
	MRMMUNotify   = 1 << 7  // FI_MR_MMU_NOTIFY
	MRRMAEvent    = 1 << 8  // FI_MR_RMA_EVENT
	MREndpoint    = 1 << 9  // FI_MR_ENDPOINT: regions bind to an endpoint
	MRHMEM        = 1 << 10 // FI_MR_HMEM: device memory needs registering
	MRCollective  = 1 << 11 // FI_MR_COLLECTIVE
	MRHandled     = MRLocal | MRVirtAddr | MRAllocated | MRProvKey | MREndpoint | MRHMEM
	mrModeUnknown = ^uint64(MRHandled)
)

// Enumerations (fabric.h, fi_domain.h, fi_eq.h, fi_endpoint.h).
const (
	EPRDM            = 3 // FI_EP_RDM
	ThreadSafe       = 1 // FI_THREAD_SAFE
	ProgressAuto     = 1 // FI_PROGRESS_AUTO
	ProgressManual   = 2 // FI_PROGRESS_MANUAL
	AVTable          = 2 // FI_AV_TABLE
	CQFormatContext  = 1 // FI_CQ_FORMAT_CONTEXT
	WaitNone         = 0 // FI_WAIT_NONE
	WaitUnspec       = 1 // FI_WAIT_UNSPEC
	WaitFD           = 3 // FI_WAIT_FD
	HMEMSystem       = 0 // FI_HMEM_SYSTEM
	HMEMCUDA         = 1 // FI_HMEM_CUDA
	HMEMROCR         = 2 // FI_HMEM_ROCR
	ctlEnable        = 6 // FI_ENABLE
	errAgain         = 11
	errAvail         = 259 // FI_EAVAIL
	errCanceled      = 125 // FI_ECANCELED
	errNoData        = 61  // FI_ENODATA
	addrNotAvail     = ^uint64(0)
	contextSize      = 64 // sizeof(struct fi_context2), the larger of the two
	fiContext2Size   = 64
	fiContextSize    = 32
	maxAddrLen       = 256
	cqEntryBatch     = 64
	cqContextEntrySz = 8 // sizeof(struct fi_cq_entry)
)

// Fid is struct fid, the head of every libfabric object.
type Fid struct {
	Fclass  uint64
	Context uintptr
	Ops     uintptr // struct fi_ops *
}

// FiOps is struct fi_ops, the operations every fid has.
type FiOps struct {
	Size    uint64
	Close   uintptr
	Bind    uintptr
	Control uintptr
	OpsOpen uintptr
	ToStr   uintptr
	OpsSet  uintptr
}

// Info is struct fi_info.
type Info struct {
	Next        uintptr
	Caps        uint64
	Mode        uint64
	AddrFormat  uint32
	_           uint32
	SrcAddrLen  uint64
	DestAddrLen uint64
	SrcAddr     uintptr
	DestAddr    uintptr
	Handle      uintptr
	TxAttr      uintptr // struct fi_tx_attr *
	RxAttr      uintptr
	EPAttr      uintptr // struct fi_ep_attr *
	DomainAttr  uintptr // struct fi_domain_attr *
	FabricAttr  uintptr // struct fi_fabric_attr *
	Nic         uintptr
}

// FabricAttr is struct fi_fabric_attr.
type FabricAttr struct {
	Fabric      uintptr
	Name        uintptr // char *
	ProvName    uintptr // char *
	ProvVersion uint32
	APIVersion  uint32
}

// DomainAttr is struct fi_domain_attr.
type DomainAttr struct {
	Domain          uintptr
	Name            uintptr // char *
	Threading       int32
	ControlProgress int32
	DataProgress    int32
	ResourceMgmt    int32
	AVType          int32
	MRMode          int32
	MRKeySize       uint64
	CQDataSize      uint64
	CQCnt           uint64
	EPCnt           uint64
	TxCtxCnt        uint64
	RxCtxCnt        uint64
	MaxEPTxCtx      uint64
	MaxEPRxCtx      uint64
	MaxEPStxCtx     uint64
	MaxEPSrxCtx     uint64
	CntrCnt         uint64
	MRIovLimit      uint64
	Caps            uint64
	Mode            uint64
	AuthKey         uintptr
	AuthKeySize     uint64
	MaxErrData      uint64
	MRCnt           uint64
	TClass          uint32
	_               uint32
}

// EPAttr is the head of struct fi_ep_attr (te reads its type and sizes).
type EPAttr struct {
	Type            int32
	Protocol        uint32
	ProtocolVersion uint32
	_               uint32
	MaxMsgSize      uint64
}

// TxAttr is struct fi_tx_attr.
type TxAttr struct {
	Caps        uint64
	Mode        uint64
	OpFlags     uint64
	MsgOrder    uint64
	CompOrder   uint64
	InjectSize  uint64
	Size        uint64
	IovLimit    uint64
	RMAIovLimit uint64
	TClass      uint32
	_           uint32
}

// FabricFid is the head of struct fid_fabric.
type FabricFid struct {
	Fid        Fid
	Ops        uintptr // struct fi_ops_fabric *
	APIVersion uint32
	_          uint32
}

// OpsFabric is struct fi_ops_fabric, up to the entry te calls.
type OpsFabric struct {
	Size   uint64
	Domain uintptr
}

// DomainFid is struct fid_domain.
type DomainFid struct {
	Fid Fid
	Ops uintptr // struct fi_ops_domain *
	MR  uintptr // struct fi_ops_mr *
}

// OpsDomain is struct fi_ops_domain, up to the entries te calls.
type OpsDomain struct {
	Size     uint64
	AVOpen   uintptr
	CQOpen   uintptr
	Endpoint uintptr
}

// OpsMR is struct fi_ops_mr.
type OpsMR struct {
	Size    uint64
	Reg     uintptr
	RegV    uintptr
	RegAttr uintptr
}

// AVFid is struct fid_av.
type AVFid struct {
	Fid Fid
	Ops uintptr // struct fi_ops_av *
}

// OpsAV is struct fi_ops_av, up to the entries te calls.
type OpsAV struct {
	Size      uint64
	Insert    uintptr
	InsertSvc uintptr
	InsertSym uintptr
	Remove    uintptr
}

// CQFid is struct fid_cq.
type CQFid struct {
	Fid Fid
	Ops uintptr // struct fi_ops_cq *
}

// OpsCQ is struct fi_ops_cq, up to the entries te calls.
type OpsCQ struct {
	Size     uint64
	Read     uintptr
	ReadFrom uintptr
	ReadErr  uintptr
	SRead    uintptr
}

// EPFid is struct fid_ep.
type EPFid struct {
	Fid Fid
	Ops uintptr // struct fi_ops_ep *
	CM  uintptr // struct fi_ops_cm *
	Msg uintptr
	RMA uintptr // struct fi_ops_rma *
}

// OpsCM is struct fi_ops_cm, up to getname.
type OpsCM struct {
	Size    uint64
	SetName uintptr
	GetName uintptr
}

// OpsRMA is struct fi_ops_rma, up to write.
type OpsRMA struct {
	Size     uint64
	Read     uintptr
	ReadV    uintptr
	ReadMsg  uintptr
	Write    uintptr
	WriteV   uintptr
	WriteMsg uintptr
}

// MRFid is struct fid_mr.
type MRFid struct {
	Fid     Fid
	MemDesc uintptr
	Key     uint64
}

// MRAttr is struct fi_mr_attr as of API 1.12 (up to device).
type MRAttr struct {
	MRIov        uintptr // const struct iovec *
	IovCount     uint64
	Access       uint64
	Offset       uint64
	RequestedKey uint64
	Context      uintptr
	AuthKeySize  uint64
	AuthKey      uintptr
	Iface        int32
	_            uint32
	Device       uint64 // union: int cuda, ze, ...
}

// Iovec is struct iovec.
type Iovec struct {
	Base uintptr
	Len  uint64
}

// AVAttr is struct fi_av_attr.
type AVAttr struct {
	Type      int32
	RxCtxBits int32
	Count     uint64
	EPPerNode uint64
	Name      uintptr
	MapAddr   uintptr
	Flags     uint64
}

// CQAttr is struct fi_cq_attr.
type CQAttr struct {
	Size            uint64
	Flags           uint64
	Format          int32
	WaitObj         int32
	SignalingVector int32
	WaitCond        int32
	WaitSet         uintptr
}

// CQErrEntry is struct fi_cq_err_entry.
type CQErrEntry struct {
	OpContext   uintptr
	Flags       uint64
	Len         uint64
	Buf         uintptr
	Data        uint64
	Tag         uint64
	OLen        uint64
	Err         int32
	ProvErrno   int32
	ErrData     uintptr
	ErrDataSize uint64
}
