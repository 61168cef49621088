/* A fake libnvidia-ml.so.1 for te's tests: the calls package nvml makes,
 * answering as the management library of an NVLink rack would. A GPU's
 * fabric registration follows the fake CUDA driver's fabric
 * (FAKECUDA_FABRIC_DOMAIN, whose first 16 bytes are the cluster UUID):
 *   FAKECUDA_FABRIC_DOMAIN unset   state NOT_SUPPORTED (no NVLink fabric)
 *   FAKENVML_CLIQUE=N              the clique id (default 1)
 *   FAKENVML_STATE=N               the state reported (default 3, COMPLETED)
 *   FAKENVML_STATUS=N              the registration's status (default 0)
 *   FAKENVML_INIT=N                nvmlInit_v2's result (default 0)
 * Built with -DFAKENVML_V1_ONLY it lacks nvmlDeviceGetGpuFabricInfoV, as
 * drivers before R550 do. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef int nvmlReturn_t;
typedef struct fake_device *nvmlDevice_t;

struct fake_device { char bus[32]; };
static struct fake_device devs[16];
static int inited;

static long env(const char *name, long def) {
  const char *v = getenv(name);
  return v && *v ? strtol(v, NULL, 0) : def;
}

nvmlReturn_t nvmlInit_v2(void) {
  int rc = (int)env("FAKENVML_INIT", 0);
  if (rc == 0) inited = 1;
  return rc;
}

nvmlReturn_t nvmlShutdown(void) { inited = 0; return 0; }

const char *nvmlErrorString(nvmlReturn_t rc) {
  switch (rc) {
  case 0: return "Success";
  case 1: return "Uninitialized";
  case 2: return "Invalid Argument";
  case 3: return "Not Supported";
  case 6: return "Not Found";
  case 12: return "Driver Not Loaded";
  }
  return "Unknown Error";
}

/* Any well-formed address names a GPU (the fake CUDA driver's devices). */
nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *bus, nvmlDevice_t *out) {
  if (!inited) return 1;
  if (!bus || !out || strlen(bus) < 7 || strlen(bus) >= 32) return 2;
  for (int i = 0; i < 16; i++) {
    if (devs[i].bus[0] == 0) strcpy(devs[i].bus, bus);
    if (strcmp(devs[i].bus, bus) == 0) { *out = &devs[i]; return 0; }
  }
  return 6;
}

static int fill(nvmlDevice_t dev, unsigned char *uuid, int *status, unsigned *clique, unsigned char *state) {
  if (!inited) return 1;
  if (!dev) return 2;
  const char *dom = getenv("FAKECUDA_FABRIC_DOMAIN");
  memset(uuid, 0, 16);
  if (!dom || !*dom) { *state = 0; *status = 0; *clique = 0; return 0; }
  strncpy((char *)uuid, dom, 16);
  *status = (int)env("FAKENVML_STATUS", 0);
  *clique = (unsigned)env("FAKENVML_CLIQUE", 1);
  *state = (unsigned char)env("FAKENVML_STATE", 3);
  return 0;
}

typedef struct {
  unsigned char clusterUuid[16]; nvmlReturn_t status; unsigned int cliqueId; unsigned char state;
} nvmlGpuFabricInfo_t;

nvmlReturn_t nvmlDeviceGetGpuFabricInfo(nvmlDevice_t dev, nvmlGpuFabricInfo_t *f) {
  if (!f) return 2;
  return fill(dev, f->clusterUuid, &f->status, &f->cliqueId, &f->state);
}

#ifndef FAKENVML_V1_ONLY
typedef struct {
  unsigned int version; unsigned char clusterUuid[16]; nvmlReturn_t status; unsigned int cliqueId;
  unsigned char state; unsigned int healthMask;
} nvmlGpuFabricInfo_v2_t;

nvmlReturn_t nvmlDeviceGetGpuFabricInfoV(nvmlDevice_t dev, nvmlGpuFabricInfo_v2_t *f) {
  if (!f) return 2;
  /* The real library refuses a version it does not know (NVML_ERROR_ARGUMENT_VERSION_MISMATCH). */
  if (f->version != (sizeof(nvmlGpuFabricInfo_v2_t) | 2u << 24)) return 25;
  f->healthMask = 0;
  return fill(dev, f->clusterUuid, &f->status, &f->cliqueId, &f->state);
}
#endif

long fakenvml_probe(void) { return 1; }
