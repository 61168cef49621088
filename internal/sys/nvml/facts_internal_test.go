package nvml

import (
	"bufio"
	"os"
	"strconv"
	"strings"
	"testing"
)

// TestFacts checks every mirrored constant and offset against the facts
// printed from nvml.h (testdata/nvml_h_facts.txt).
func TestFacts(t *testing.T) {
	f, err := os.Open("testdata/nvml_h_facts.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	mine := map[string]uint64{
		"NVML_SUCCESS": success, "NVML_ERROR_NOT_SUPPORTED": errNotSupport,
		"NVML_GPU_FABRIC_UUID_LEN": uuidLen, "NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE": busIDLen,
		"NVML_GPU_FABRIC_STATE_NOT_SUPPORTED": StateNotSupported, "NVML_GPU_FABRIC_STATE_NOT_STARTED": StateNotStarted,
		"NVML_GPU_FABRIC_STATE_IN_PROGRESS": StateInProgress, "NVML_GPU_FABRIC_STATE_COMPLETED": StateCompleted,
		"sizeof(nvmlGpuFabricState_t)": 1,
		"sizeof(nvmlGpuFabricInfo_t)":  v1Size, "offsetof(nvmlGpuFabricInfo_t,clusterUuid)": v1UUID,
		"offsetof(nvmlGpuFabricInfo_t,status)": v1Status, "offsetof(nvmlGpuFabricInfo_t,cliqueId)": v1Clique,
		"offsetof(nvmlGpuFabricInfo_t,state)": v1State,
		"sizeof(nvmlGpuFabricInfo_v2_t)":      v2Size, "nvmlGpuFabricInfo_v2": v2Version,
		"offsetof(nvmlGpuFabricInfo_v2_t,version)": 0, "offsetof(nvmlGpuFabricInfo_v2_t,clusterUuid)": v2UUID,
		"offsetof(nvmlGpuFabricInfo_v2_t,status)": v2Status, "offsetof(nvmlGpuFabricInfo_v2_t,cliqueId)": v2Clique,
		"offsetof(nvmlGpuFabricInfo_v2_t,state)": v2State, "offsetof(nvmlGpuFabricInfo_v2_t,healthMask)": 32,
	}
	seen := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, _ := strings.Cut(line, " ")
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("facts line %q", line)
		}
		m, ok := mine[k]
		if !ok {
			t.Errorf("fact %s is not mirrored", k)
			continue
		}
		seen++
		if m != n {
			t.Errorf("%s: package nvml has %d, nvml.h %d", k, m, n)
		}
	}
	if seen != len(mine) {
		t.Errorf("%d of %d mirrored constants have a fact", seen, len(mine))
	}
	// The version-2 structure fits the scratch slot it is read into.
	if v2Size > 128 || v1Size > 128 {
		t.Error("fabric structures larger than their scratch slot")
	}
}
