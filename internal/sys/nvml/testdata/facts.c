/* Prints the nvml.h facts package nvml mirrors, one "name value" line
 * each (testdata/nvml_h_facts.txt): cc -I<dir of nvml.h> facts.c */
#include <stddef.h>
#include <stdio.h>
#include "nvml.h"

#define V(x) printf("%s %lu\n", #x, (unsigned long)(x))
#define O(t, f) printf("offsetof(%s,%s) %lu\n", #t, #f, (unsigned long)offsetof(t, f))

int main(void) {
	V(NVML_SUCCESS);
	V(NVML_ERROR_NOT_SUPPORTED);
	V(NVML_GPU_FABRIC_UUID_LEN);
	V(NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE);
	V(NVML_GPU_FABRIC_STATE_NOT_SUPPORTED);
	V(NVML_GPU_FABRIC_STATE_NOT_STARTED);
	V(NVML_GPU_FABRIC_STATE_IN_PROGRESS);
	V(NVML_GPU_FABRIC_STATE_COMPLETED);
	V(sizeof(nvmlGpuFabricState_t));
	V(sizeof(nvmlGpuFabricInfo_t));
	O(nvmlGpuFabricInfo_t, clusterUuid);
	O(nvmlGpuFabricInfo_t, status);
	O(nvmlGpuFabricInfo_t, cliqueId);
	O(nvmlGpuFabricInfo_t, state);
	V(sizeof(nvmlGpuFabricInfo_v2_t));
	V(nvmlGpuFabricInfo_v2);
	O(nvmlGpuFabricInfo_v2_t, version);
	O(nvmlGpuFabricInfo_v2_t, clusterUuid);
	O(nvmlGpuFabricInfo_v2_t, status);
	O(nvmlGpuFabricInfo_v2_t, cliqueId);
	O(nvmlGpuFabricInfo_v2_t, state);
	O(nvmlGpuFabricInfo_v2_t, healthMask);
	return 0;
}
