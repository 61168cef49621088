// Package fabric drives libfabric (the OpenFabrics Interfaces library: AWS
// EFA, HPE Slingshot's cxi, and its tcp, shm and sockets providers) from Go
// without cgo: the library is loaded at run time with purego
// (TE_FABRIC_LIBRARY, default libfabric.so.1), its exported entry points
// (fi_getinfo, fi_fabric, fi_dupinfo, fi_freeinfo, fi_strerror) are called
// by symbol, and the rest of the API, static inline functions in its
// headers, is called as those functions do: through the ops tables of the
// fid structures (fi_domain, fi_endpoint, fi_av_insert, fi_mr_regattr,
// fi_write, fi_read, fi_cq_read, fi_close, ...).
//
// te asks fi_getinfo for API version 1.12 (APIVersion), reliable-datagram
// endpoints (FI_EP_RDM) with one-sided RMA, FI_THREAD_SAFE domains and
// address vectors of type FI_AV_TABLE, and accepts the FI_CONTEXT and
// FI_CONTEXT2 modes. Every struct it mirrors and every constant it passes
// is compared with libfabric-dev's headers by layout_test.go
// (testdata/layout_amd64.golden records them for machines without the
// headers).
//
// The caller handles the memory-registration modes in MRHandled: a
// provider that needs another (FI_MR_RAW, FI_MR_MMU_NOTIFY, ...) is not
// offered by fi_getinfo and Offer.MRMode says which of the handled ones
// it uses.
package fabric
