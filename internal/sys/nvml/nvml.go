package nvml

import (
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"os"
	"runtime"
	"strings"
	"sync"
	"unsafe"

	"github.com/ebitengine/purego"

	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/sys/mem"
	"github.com/tecache/te/internal/sys/sigkeep"
)

// DefaultLibrary is the soname Load opens (installed with the driver).
const DefaultLibrary = "libnvidia-ml.so.1"

// EnvLibrary names the environment variable that overrides DefaultLibrary.
const EnvLibrary = "TE_NVML_LIBRARY"

// nvml.h facts (testdata/nvml_h_facts.txt).
const (
	success       = 0  // NVML_SUCCESS
	errNotSupport = 3  // NVML_ERROR_NOT_SUPPORTED
	uuidLen       = 16 // NVML_GPU_FABRIC_UUID_LEN

	// nvmlGpuFabricInfo_v2_t: version, clusterUuid, status, cliqueId,
	// state, healthMask.
	v2Size, v2UUID, v2Status, v2Clique, v2State = 36, 4, 20, 24, 28
	v2Version                                   = v2Size | 2<<24 // nvmlGpuFabricInfo_v2
	// nvmlGpuFabricInfo_t (no version field).
	v1Size, v1UUID, v1Status, v1Clique, v1State = 28, 0, 16, 20, 24

	busIDLen = 32 // NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE
)

// Fabric states (NVML_GPU_FABRIC_STATE_*).
const (
	StateNotSupported = 0
	StateNotStarted   = 1
	StateInProgress   = 2
	StateCompleted    = 3
)

// Lib is the opened library. It is never closed (nvmlInit_v2 once per
// process; the library's state outlives every caller).
type Lib struct {
	Path string

	init     func() int32
	byBus    func(bus, out uintptr) int32
	fabricV  func(dev, out uintptr) int32 // optional (R550)
	fabric   func(dev, out uintptr) int32 // optional (R535)
	errorStr func(rc int32) uintptr       // optional

	mu      sync.Mutex // guards scratch
	scratch []byte
}

var (
	loadOnce sync.Once
	loaded   *Lib
	loadErr  error
)

// Load opens the library once per process (TE_NVML_LIBRARY or
// DefaultLibrary) and initializes it. The error, NotSupported, says why
// it cannot be used.
func Load() (*Lib, error) {
	loadOnce.Do(func() {
		path := os.Getenv(EnvLibrary)
		if path == "" {
			path = DefaultLibrary
		}
		loaded, loadErr = Open(path)
	})
	return loaded, loadErr
}

// Open loads the library at path, binds its entry points and calls
// nvmlInit_v2.
func Open(path string) (l *Lib, err error) {
	if runtime.GOOS != "linux" || (runtime.GOARCH != "amd64" && runtime.GOARCH != "arm64") {
		return nil, errs.New(errs.NotSupported, "nvml", "no bindings for %s/%s", runtime.GOOS, runtime.GOARCH)
	}
	h, derr := sigkeep.Dlopen(path, purego.RTLD_NOW|purego.RTLD_GLOBAL)
	if derr != nil {
		return nil, errs.Wrap(errs.NotSupported, "nvml", derr, "cannot load %s", path).
			WithHint("it ships with the NVIDIA driver; or set " + EnvLibrary)
	}
	defer func() {
		if p := recover(); p != nil {
			l, err = nil, errs.New(errs.Internal, "nvml", "binding %s: %v", path, p)
		}
	}()
	l = &Lib{Path: path}
	bind := func(fn any, name string, optional bool) error {
		sym, e := purego.Dlsym(h, name)
		if e != nil || sym == 0 {
			if optional {
				return nil
			}
			return errs.New(errs.NotSupported, "nvml", "%s has no %s", path, name)
		}
		purego.RegisterFunc(fn, sym)
		return nil
	}
	for _, b := range []struct {
		fn       any
		name     string
		optional bool
	}{
		{&l.init, "nvmlInit_v2", false},
		{&l.byBus, "nvmlDeviceGetHandleByPciBusId_v2", false},
		{&l.fabricV, "nvmlDeviceGetGpuFabricInfoV", true},
		{&l.fabric, "nvmlDeviceGetGpuFabricInfo", true},
		{&l.errorStr, "nvmlErrorString", true},
	} {
		if err := bind(b.fn, b.name, b.optional); err != nil {
			return nil, err
		}
	}
	if l.scratch, err = mem.Alloc(4096); err != nil {
		return nil, err
	}
	if rc := l.init(); rc != success {
		// No driver loaded, no permission, no GPU: NVML is not usable.
		return nil, errs.Wrap(errs.NotSupported, "nvml", l.fail("nvmlInit_v2", rc), "%s", path)
	}
	return l, nil
}

func (l *Lib) fail(call string, rc int32) error {
	msg := fmt.Sprintf("error %d", rc)
	if l.errorStr != nil {
		if p := l.errorStr(rc); p != 0 {
			msg = cstring(p)
		}
	}
	code := errs.Internal
	if rc == errNotSupport {
		code = errs.NotSupported
	}
	return errs.New(code, "nvml", "%s: %s", call, msg)
}

func cstring(p uintptr) string {
	var b []byte
	for i := uintptr(0); i < 256; i++ {
		c := mem.Bytes(uint64(p)+uint64(i), 1)[0] // the library's static string
		if c == 0 {
			break
		}
		b = append(b, c)
	}
	return string(b)
}

// Fabric is a GPU's NVLink fabric registration.
type Fabric struct {
	ClusterUUID [uuidLen]byte
	Clique      uint32
	State       uint8 // StateCompleted once the fabric manager registered it
	Status      int32 // NVML's result of the registration (0: success)
}

// Domain is the NVLink domain of a completed, successful registration
// ("<cluster UUID hex>:<clique id>"), or "" and why there is none.
func (f Fabric) Domain() (string, string) {
	switch {
	case f.State == StateNotSupported:
		return "", "the GPU is not on a multi-node NVLink fabric"
	case f.State != StateCompleted:
		return "", "the fabric manager has not finished registering the GPU (state " + stateName(f.State) + ")"
	case f.Status != success:
		return "", fmt.Sprintf("the GPU's fabric registration failed (NVML error %d)", f.Status)
	case f.ClusterUUID == [uuidLen]byte{}:
		return "", "the fabric reports no cluster UUID"
	}
	return fmt.Sprintf("%s:%d", hex.EncodeToString(f.ClusterUUID[:]), f.Clique), ""
}

func stateName(s uint8) string {
	switch s {
	case StateNotStarted:
		return "not started"
	case StateInProgress:
		return "in progress"
	}
	return fmt.Sprint(s)
}

// FabricOf returns the fabric registration of the GPU at PCI address bus
// (dddd:bb:dd.f). A driver without the call, or a GPU without fabric
// support, reads as StateNotSupported.
func (l *Lib) FabricOf(bus string) (Fabric, error) {
	if len(bus) >= busIDLen || strings.IndexByte(bus, 0) >= 0 {
		return Fabric{}, errs.New(errs.InvalidArgument, "nvml", "PCI bus id %q", bus)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.scratch
	clear(s[:256])
	copy(s[0:busIDLen], bus)
	base := uintptr(mem.Addr(s))
	if rc := l.byBus(base, base+64); rc != success {
		return Fabric{}, l.fail("nvmlDeviceGetHandleByPciBusId_v2("+bus+")", rc)
	}
	dev := *(*uintptr)(unsafe.Pointer(&s[64]))
	out := s[128:256]
	var f Fabric
	var rc int32
	switch {
	case l.fabricV != nil:
		binary.LittleEndian.PutUint32(out, v2Version)
		rc = l.fabricV(dev, base+128)
		copy(f.ClusterUUID[:], out[v2UUID:])
		f.Status = int32(binary.LittleEndian.Uint32(out[v2Status:]))
		f.Clique = binary.LittleEndian.Uint32(out[v2Clique:])
		f.State = out[v2State]
	case l.fabric != nil:
		rc = l.fabric(dev, base+128)
		copy(f.ClusterUUID[:], out[v1UUID:])
		f.Status = int32(binary.LittleEndian.Uint32(out[v1Status:]))
		f.Clique = binary.LittleEndian.Uint32(out[v1Clique:])
		f.State = out[v1State]
	default:
		return Fabric{State: StateNotSupported}, nil
	}
	switch rc {
	case success:
		return f, nil
	case errNotSupport:
		return Fabric{State: StateNotSupported}, nil
	}
	return Fabric{}, l.fail("nvmlDeviceGetGpuFabricInfo", rc)
}

// Domain returns the NVLink domain the GPUs at the PCI addresses share.
// Without one the error says why: NotSupported where there is plainly no
// fabric (no library, no GPU, GPUs outside an NVLink rack), TransportUnavailable
// where there should be one and is not (the fabric manager has not
// registered a GPU, or failed to, or the GPUs are in different domains: a
// process spanning two publishes none rather than one its other GPUs are
// not in).
func Domain(buses []string) (string, error) {
	if len(buses) == 0 {
		return "", errs.New(errs.NotSupported, "nvml", "no GPU")
	}
	l, err := Load()
	if err != nil {
		return "", err
	}
	dom := ""
	for _, b := range buses {
		f, err := l.FabricOf(b)
		if err != nil {
			return "", err
		}
		d, why := f.Domain()
		if d == "" {
			code := errs.TransportUnavailable
			if f.State == StateNotSupported {
				code = errs.NotSupported
			}
			return "", errs.New(code, "nvml", "GPU %s: %s", b, why)
		}
		if dom != "" && d != dom {
			return "", errs.New(errs.TransportUnavailable, "nvml", "the GPUs are in different NVLink domains (%s, %s)", dom, d)
		}
		dom = d
	}
	return dom, nil
}
