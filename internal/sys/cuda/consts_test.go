package cuda

import (
	"bufio"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unsafe"
)

// headerFacts parses enum lines (NAME = VALUE) and #defines from cuda.h text.
func headerFacts(t *testing.T, path string) (vals map[string]uint64, maps map[string]string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	vals, maps = map[string]uint64{}, map[string]string{}
	enum := regexp.MustCompile(`^\s*((?:CU|CUDA)_[A-Z0-9_]+)\s*=\s*(0x[0-9a-fA-F]+|\d+)\s*,?`)
	def := regexp.MustCompile(`^\s*#define\s+(\w+)\s+(.+?)\s*$`)
	api := regexp.MustCompile(`^(?:__CUDA_API_PT(?:DS|SZ)\()?(cu\w+)\)?$`)
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if m := enum.FindStringSubmatch(line); m != nil {
			v, err := strconv.ParseUint(m[2], 0, 64)
			if err == nil {
				vals[m[1]] = v
			}
			continue
		}
		if m := def.FindStringSubmatch(line); m != nil {
			if v, err := strconv.ParseUint(m[2], 0, 64); err == nil {
				vals[m[1]] = v
			} else if a := api.FindStringSubmatch(m[2]); a != nil && strings.HasPrefix(m[1], "cu") {
				if _, seen := maps[m[1]]; !seen { // the first (non per-thread) mapping
					maps[m[1]] = a[1]
				}
			}
		}
	}
	return vals, maps
}

// golden lists every constant this package defines under its cuda.h name.
var golden = map[string]uint64{
	"CU_IPC_HANDLE_SIZE":                              IPCHandleSize,
	"CUDA_SUCCESS":                                    uint64(Success),
	"CUDA_ERROR_INVALID_VALUE":                        uint64(ErrInvalidValue),
	"CUDA_ERROR_OUT_OF_MEMORY":                        uint64(ErrOutOfMemory),
	"CUDA_ERROR_NOT_INITIALIZED":                      uint64(ErrNotInitialized),
	"CUDA_ERROR_DEINITIALIZED":                        uint64(ErrDeinitialized),
	"CUDA_ERROR_STUB_LIBRARY":                         uint64(ErrStubLibrary),
	"CUDA_ERROR_INSUFFICIENT_DRIVER":                  uint64(ErrInsufficientDrv),
	"CUDA_ERROR_NO_DEVICE":                            uint64(ErrNoDevice),
	"CUDA_ERROR_INVALID_DEVICE":                       uint64(ErrInvalidDevice),
	"CUDA_ERROR_INVALID_CONTEXT":                      uint64(ErrInvalidContext),
	"CUDA_ERROR_MAP_FAILED":                           uint64(ErrMapFailed),
	"CUDA_ERROR_ALREADY_MAPPED":                       uint64(ErrAlreadyMapped),
	"CUDA_ERROR_PEER_ACCESS_UNSUPPORTED":              uint64(ErrPeerAccessUnsupp),
	"CUDA_ERROR_OPERATING_SYSTEM":                     uint64(ErrOperatingSystem),
	"CUDA_ERROR_INVALID_HANDLE":                       uint64(ErrInvalidHandle),
	"CUDA_ERROR_NOT_FOUND":                            uint64(ErrNotFound),
	"CUDA_ERROR_NOT_READY":                            uint64(ErrNotReady),
	"CUDA_ERROR_ILLEGAL_ADDRESS":                      uint64(ErrIllegalAddress),
	"CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED":          uint64(ErrPeerAccessEnabled),
	"CUDA_ERROR_NOT_PERMITTED":                        uint64(ErrNotPermitted),
	"CUDA_ERROR_NOT_SUPPORTED":                        uint64(ErrNotSupported),
	"CUDA_ERROR_UNKNOWN":                              uint64(ErrUnknown),
	"CU_POINTER_ATTRIBUTE_CONTEXT":                    uint64(AttrContext),
	"CU_POINTER_ATTRIBUTE_MEMORY_TYPE":                uint64(AttrMemoryType),
	"CU_POINTER_ATTRIBUTE_DEVICE_POINTER":             uint64(AttrDevicePointer),
	"CU_POINTER_ATTRIBUTE_HOST_POINTER":               uint64(AttrHostPointer),
	"CU_POINTER_ATTRIBUTE_BUFFER_ID":                  uint64(AttrBufferID),
	"CU_POINTER_ATTRIBUTE_IS_MANAGED":                 uint64(AttrIsManaged),
	"CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL":             uint64(AttrDeviceOrdinal),
	"CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE": uint64(AttrIsLegacyIPC),
	"CU_POINTER_ATTRIBUTE_RANGE_START_ADDR":           uint64(AttrRangeStartAddr),
	"CU_POINTER_ATTRIBUTE_RANGE_SIZE":                 uint64(AttrRangeSize),
	"CU_POINTER_ATTRIBUTE_MAPPED":                     uint64(AttrMapped),
	"CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES":       uint64(AttrAllowedHandles),
	"CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE": uint64(AttrGPUDirectRDMACap),
	"CU_MEMORYTYPE_HOST":                              uint64(MemoryHost),
	"CU_MEMORYTYPE_DEVICE":                            uint64(MemoryDevice),
	"CU_MEMORYTYPE_ARRAY":                             uint64(MemoryArray),
	"CU_MEMORYTYPE_UNIFIED":                           uint64(MemoryUnified),
	"CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS":              uint64(IPCLazyEnablePeerAccess),
	"CU_MEMHOSTALLOC_PORTABLE":                        uint64(HostAllocPortable),
	"CU_MEMHOSTALLOC_DEVICEMAP":                       uint64(HostAllocDeviceMap),
	"CU_MEMHOSTALLOC_WRITECOMBINED":                   uint64(HostAllocWriteCombined),
	"CU_STREAM_DEFAULT":                               uint64(StreamDefault),
	"CU_STREAM_NON_BLOCKING":                          uint64(StreamNonBlocking),
	"CU_EVENT_DEFAULT":                                uint64(EventDefault),
	"CU_EVENT_BLOCKING_SYNC":                          uint64(EventBlockingSync),
	"CU_EVENT_DISABLE_TIMING":                         uint64(EventDisableTiming),
	"CU_EVENT_INTERPROCESS":                           uint64(EventInterprocess),
}

// headers returns the header texts to check against: the recorded facts,
// plus the machine's cuda.h when a toolkit is installed.
func headers() []string {
	hs := []string{filepath.Join("testdata", "cuda_h_facts.txt")}
	for _, dir := range []string{os.Getenv("CUDA_HOME"), "/usr/local/cuda"} {
		if dir == "" {
			continue
		}
		p := filepath.Join(dir, "include", "cuda.h")
		if _, err := os.Stat(p); err == nil {
			return append(hs, p)
		}
	}
	return hs
}

func TestConstantsMatchHeader(t *testing.T) {
	for _, h := range headers() {
		vals, maps := headerFacts(t, h)
		for name, want := range golden {
			got, ok := vals[name]
			if !ok {
				t.Errorf("%s: %s not found", h, name)
				continue
			}
			if got != want {
				t.Errorf("%s: %s = %d, this package has %d", h, name, got, want)
			}
		}
		// The symbol bound first must be the one cuda.h maps the API name to.
		checked := 0
		for api, names := range Symbols() {
			target, ok := maps[api]
			if !ok {
				continue
			}
			checked++
			if names[0] != target {
				t.Errorf("%s: cuda.h maps %s to %s, Open binds %s first", h, api, target, names[0])
			}
		}
		if checked < 12 {
			t.Errorf("%s: only %d versioned names checked; the facts file lost lines?", h, checked)
		}
		t.Logf("%s: %d constants, %d versioned names checked", h, len(golden), checked)
	}
}

func TestLayouts(t *testing.T) {
	if s := unsafe.Sizeof(IPCMemHandle{}); s != IPCHandleSize {
		t.Errorf("IPCMemHandle is %d bytes, want %d (CUipcMemHandle)", s, IPCHandleSize)
	}
	if s := unsafe.Sizeof(UUID{}); s != 16 {
		t.Errorf("UUID is %d bytes, want 16 (CUuuid)", s)
	}
	if s := unsafe.Sizeof(Context(0)); s != 8 {
		t.Errorf("Context is %d bytes, want a pointer's 8", s)
	}
}

func TestResultNamesAndCodes(t *testing.T) {
	for r, n := range resultNames {
		if golden[n] != uint64(r) {
			t.Errorf("%s is %d in the golden table, %d in resultNames", n, golden[n], r)
		}
	}
	if Result(12345).Name() != "CUresult(12345)" {
		t.Errorf("unknown result named %q", Result(12345).Name())
	}
}
