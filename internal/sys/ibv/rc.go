package ibv

// RCParams are what connecting one RC queue pair to a peer's needs: the local
// port and GID index, and the peer's QP number, LID and GID.
type RCParams struct {
	Port      uint8
	GIDIndex  uint8
	MTU       uint32 // enum ibv_mtu: the smaller of both ports' active MTU
	RemoteQPN uint32
	RemoteLID uint16
	RemoteGID GID
	// Global routes with a GRH: required on RoCE (Ethernet), optional on
	// InfiniBand within a subnet.
	Global    bool
	LocalPSN  uint32
	RemotePSN uint32
	// MaxRdAtomic bounds outstanding RDMA READs in both directions; clamp
	// it to the devices' max_qp_rd_atom.
	MaxRdAtomic  uint8
	SL           uint8
	TrafficClass uint8
	// Timeout, RetryCnt and RNRRetry default to 14 (about 67 ms), 7 and 7.
	Timeout  uint8
	RetryCnt uint8
	RNRRetry uint8
}

// RCAccess is the remote access a connected QP allows: the peer may read
// and write memory registered with the matching MR access flags.
const RCAccess = AccessLocalWrite | AccessRemoteRead | AccessRemoteWrite

// ConnectRC moves a fresh (RESET) RC queue pair through INIT, RTR and RTS so
// it talks to the peer's queue pair described by p.
func ConnectRC(qp *QP, p RCParams) error {
	if p.Timeout == 0 {
		p.Timeout = 14
	}
	if p.RetryCnt == 0 {
		p.RetryCnt = 7
	}
	if p.RNRRetry == 0 {
		p.RNRRetry = 7
	}
	if p.MaxRdAtomic == 0 {
		p.MaxRdAtomic = 1
	}
	a := QPAttr{QPState: QPStateInit, PortNum: p.Port, QPAccessFlags: RCAccess}
	if err := qp.Modify(&a, QPAttrState|QPAttrPkeyIndex|QPAttrPort|QPAttrAccessFlags); err != nil {
		return err
	}
	a = QPAttr{
		QPState: QPStateRTR, PathMTU: p.MTU, DestQPNum: p.RemoteQPN, RQPSN: p.RemotePSN,
		MaxDestRdAtomic: p.MaxRdAtomic, MinRNRTimer: 12,
	}
	a.AHAttr = AHAttr{DLID: p.RemoteLID, SL: p.SL, PortNum: p.Port}
	if p.Global {
		a.AHAttr.IsGlobal = 1
		a.AHAttr.GRH = GlobalRoute{DGID: p.RemoteGID, SGIDIndex: p.GIDIndex, HopLimit: 0xff, TrafficClass: p.TrafficClass}
	}
	if err := qp.Modify(&a, QPAttrState|QPAttrAV|QPAttrPathMTU|QPAttrDestQPN|QPAttrRQPSN|
		QPAttrMaxDestRdAtomic|QPAttrMinRNRTimer); err != nil {
		return err
	}
	a = QPAttr{
		QPState: QPStateRTS, Timeout: p.Timeout, RetryCnt: p.RetryCnt, RNRRetry: p.RNRRetry,
		SQPSN: p.LocalPSN, MaxRdAtomic: p.MaxRdAtomic,
	}
	return qp.Modify(&a, QPAttrState|QPAttrTimeout|QPAttrRetryCnt|QPAttrRNRRetry|QPAttrSQPSN|QPAttrMaxQPRdAtomic)
}

// ToError moves a queue pair to the error state: outstanding work requests
// complete with WCWRFlushErr, so nothing is left waiting on it.
func ToError(qp *QP) error {
	a := QPAttr{QPState: QPStateErr}
	return qp.Modify(&a, QPAttrState)
}
