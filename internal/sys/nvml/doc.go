// Package nvml reads from NVIDIA's management library (libnvidia-ml.so.1,
// installed with the driver) the one thing te needs of it: the NVLink fabric
// a GPU belongs to. On a multi-node NVLink system (GB200/GB300 NVL72) the
// fabric manager registers every GPU of a rack with a cluster UUID and a
// clique id; GPUs with the same pair map each other's CUDA fabric handles,
// so the pair names the domain the cudaipc transport publishes.
//
// The library is loaded at run time with purego (no cgo; NVIDIA's Go
// bindings need it), once per process, with the fault handlers kept
// (sigkeep). TE_NVML_LIBRARY names another file (the fake the tests build).
// Where it is missing, or the GPUs report no completed fabric registration
// (every GPU that is not in an NVLink rack), there is no domain, and the
// reason says which.
//
// nvmlDeviceGetGpuFabricInfoV (driver R550 and later) is called with its
// version 2 structure, which every driver with the call accepts; older
// drivers with fabric support (R535-R545) have only
// nvmlDeviceGetGpuFabricInfo. Both layouts are checked against nvml.h
// (testdata/nvml_h_facts.txt records them).
//
// No Go pointer crosses into the library: arguments and results live in a
// page from mmap.
package nvml
