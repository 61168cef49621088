/*
 * A fake HIP runtime (libamdhip64) for te's tests on machines without an
 * AMD GPU, the counterpart of cudatest's fake CUDA driver.
 *
 * It exports the runtime entry points te binds, with hip_runtime_api.h's
 * signatures, and behaves strictly where te could go wrong:
 *
 *  - "device memory" is a POSIX shared memory object mapped twice: the
 *    address handed out is mapped PROT_NONE, so any CPU access to it faults
 *    (te must only touch it through the copy calls); copies use a second,
 *    readable mapping;
 *  - the current device is per thread (hipSetDevice), 0 until set, as in
 *    HIP; allocations and streams belong to the device current when made;
 *  - hipMemcpy/hipMemcpyAsync check the direction they are given (host
 *    memory named as device memory fails with hipErrorInvalidValue);
 *  - IPC handles name the exporter's pid and object; a process cannot open
 *    its own handles; two processes share the bytes;
 *  - hsa_amd_portable_export_dmabuf gives a dma-buf fd of an allocation (the
 *    shared memory object) and the pointer's offset in it, which the fake
 *    libibverbs maps for ibv_reg_dmabuf_mr; FAKEHIP_DMABUF=0 makes it fail
 *    (status 0x1001, HSA_STATUS_ERROR), as a ROCm before 5.6 has none.
 *
 * It reports ROCm 6 (hipRuntimeGetVersion 60000000): memory types numbered
 * as CUDA's (host 1, device 2), unknown memory answered with type 0, and
 * hipIpcMemLazyEnablePeerAccess = 1 the only flags hipIpcOpenMemHandle
 * takes. FAKEHIP_ROCM=5 plays ROCm 5 instead (host 0, device 1, unknown
 * memory hipErrorInvalidValue, IPC flags 0).
 *
 * FAKEHIP_COPY_DELAY_US=N makes every copy take N microseconds more.
 *
 * Devices: FAKEHIP_DEVICES sets their number (0: hipGetDeviceCount fails
 * with hipErrorNoDevice). Otherwise, with TE_SYSFS_ROOT naming a recorded
 * sysfs tree, the AMD functions of its bus/pci/devices (vendor 0x1002, a
 * display or processing-accelerator class) are the devices, in bus order,
 * and hipDeviceGetPCIBusId reports their addresses; without a tree there is
 * one device. FAKEHIP_PCI_VENDOR=0x10de takes another vendor's functions
 * instead, so a recorded NVIDIA machine serves as an AMD one of the same
 * shape.
 *
 * It proves te's logic and ABI use, not a real runtime's behaviour or speed.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

typedef int hipError_t;
typedef struct { char reserved[64]; } hipIpcMemHandle_t;
typedef struct { char bytes[16]; } hipUUID;
typedef struct {
  unsigned type; int device; void *devicePointer; void *hostPointer;
  int isManaged; unsigned allocationFlags;
} hipPointerAttribute_t;

enum {
  OK = 0, INVALID_VALUE = 1, OUT_OF_MEMORY = 2, NO_DEVICE = 100,
  INVALID_DEVICE = 101, INVALID_CONTEXT = 201, MAP_FAILED_ = 205,
  INVALID_HANDLE = 400, NOT_SUPPORTED = 801
};

#define MAXA 4096
#define MAXDEV 64
#define MAGIC 0x50494854u /* "THIP" */

struct alloc {
  int used, kind; /* 1 host (pinned), 2 device, 3 device opened from IPC */
  int dev, fd;
  char *addr, *shadow;
  char name[40];
  size_t size;
};
struct handle { uint32_t magic; int32_t pid, dev, pad; uint64_t size; char name[40]; };

static struct alloc tab[MAXA];
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int ndev = -1, rocm = 6;
static __thread int curdev;
static long opened, streams, seq;
static char busids[MAXDEV][16];
static int ntree;

static int readhex(const char *dir, const char *name, const char *file) {
  char p[8400], b[32] = {0};
  snprintf(p, sizeof p, "%s/%s/%s", dir, name, file);
  FILE *f = fopen(p, "re");
  if (!f) return -1;
  if (!fgets(b, sizeof b, f)) b[0] = 0;
  fclose(f);
  return (int)strtol(b, NULL, 16);
}
static int cmpbus(const void *a, const void *b) { return strcmp(a, b); }

/* setup decides the devices and the ROCm version once per process. */
static void setup(void) {
  pthread_mutex_lock(&mu);
  if (ndev < 0) {
    const char *r = getenv("FAKEHIP_ROCM");
    rocm = (r && atoi(r) == 5) ? 5 : 6;
    const char *root = getenv("TE_SYSFS_ROOT");
    if (root && *root) {
      char dir[4096];
      snprintf(dir, sizeof dir, "%s/bus/pci/devices", root);
      const char *v = getenv("FAKEHIP_PCI_VENDOR");
      int vendor = v && *v ? (int)strtol(v, NULL, 16) : 0x1002;
      DIR *d = opendir(dir);
      struct dirent *e;
      while (d && (e = readdir(d)) && ntree < MAXDEV) {
        if (e->d_name[0] == '.' || strlen(e->d_name) >= sizeof busids[0]) continue;
        int cls = readhex(dir, e->d_name, "class") >> 16;
        if (readhex(dir, e->d_name, "vendor") == vendor && (cls == 0x03 || cls == 0x12))
          memcpy(busids[ntree++], e->d_name, strlen(e->d_name) + 1);
      }
      if (d) closedir(d);
      qsort(busids, ntree, sizeof busids[0], cmpbus);
    }
    const char *e = getenv("FAKEHIP_DEVICES");
    int n = e ? atoi(e) : ntree > 0 ? ntree : 1;
    if (n < 0) n = 0;
    if (n > MAXDEV) n = MAXDEV;
    __atomic_store_n(&ndev, n, __ATOMIC_RELEASE);
  }
  pthread_mutex_unlock(&mu);
}
static int devices(void) {
  int n = __atomic_load_n(&ndev, __ATOMIC_ACQUIRE);
  if (n < 0) { setup(); n = __atomic_load_n(&ndev, __ATOMIC_ACQUIRE); }
  return n;
}
#define INIT() do { if (devices() == 0) return NO_DEVICE; } while (0)

hipError_t hipRuntimeGetVersion(int *v) {
  if (!v) return INVALID_VALUE;
  devices();
  *v = rocm == 5 ? 50231000 : 60032000; /* major * 10000000 + ... */
  return OK;
}
hipError_t hipGetDeviceCount(int *n) {
  if (!n) return INVALID_VALUE;
  int d = devices();
  *n = d;
  return d > 0 ? OK : NO_DEVICE;
}
hipError_t hipSetDevice(int d) { INIT(); if (d < 0 || d >= ndev) return INVALID_DEVICE; curdev = d; return OK; }
hipError_t hipGetDevice(int *d) { INIT(); if (!d) return INVALID_VALUE; *d = curdev; return OK; }
hipError_t hipDeviceGetUuid(hipUUID *u, int d) {
  INIT(); if (d < 0 || d >= ndev) return INVALID_DEVICE;
  if (!u) return INVALID_VALUE;
  memset(u, 0, sizeof *u); snprintf(u->bytes, 16, "fakeamd-%04d", d & 1023); return OK;
}
/* hipDeviceGetPCIBusId writes "dddd:bb:dd.f" as the runtime does (lower
 * case hex, unlike CUDA): the tree's address, or a made-up one. */
hipError_t hipDeviceGetPCIBusId(char *out, int len, int d) {
  INIT(); if (d < 0 || d >= ndev) return INVALID_DEVICE;
  if (!out || len <= 0) return INVALID_VALUE;
  if (d < ntree) snprintf(out, (size_t)len, "%s", busids[d]);
  else snprintf(out, (size_t)len, "0000:%02x:00.0", (0x40 + d) & 0xff);
  return OK;
}

static struct alloc *find(uintptr_t p) {
  for (int i = 0; i < MAXA; i++)
    if (tab[i].used && p >= (uintptr_t)tab[i].addr && p < (uintptr_t)tab[i].addr + tab[i].size) return &tab[i];
  return NULL;
}
static struct alloc *slot(void) {
  for (int i = 0; i < MAXA; i++) if (!tab[i].used) { memset(&tab[i], 0, sizeof tab[i]); tab[i].used = 1; return &tab[i]; }
  return NULL;
}

hipError_t hipPointerGetAttributes(hipPointerAttribute_t *attr, const void *ptr) {
  INIT();
  if (!attr) return INVALID_VALUE;
  pthread_mutex_lock(&mu);
  struct alloc *a = find((uintptr_t)ptr);
  memset(attr, 0, sizeof *attr);
  hipError_t r = OK;
  if (!a) {
    if (rocm == 5) r = INVALID_VALUE; /* ROCm 5 fails; ROCm 6 says type 0 */
    attr->device = -1;
  } else {
    int host = a->kind == 1;
    attr->type = rocm == 5 ? (host ? 0 : 1) : (host ? 1 : 2);
    attr->device = a->dev;
    attr->devicePointer = (void *)ptr;
    attr->hostPointer = host ? (void *)ptr : NULL;
  }
  pthread_mutex_unlock(&mu);
  return r;
}
hipError_t hipMemGetAddressRange(void **base, size_t *size, void *ptr) {
  INIT();
  pthread_mutex_lock(&mu);
  struct alloc *a = find((uintptr_t)ptr);
  int ok = a && a->kind != 1;
  if (ok) { if (base) *base = a->addr; if (size) *size = a->size; }
  pthread_mutex_unlock(&mu);
  return ok ? OK : INVALID_VALUE;
}

static hipError_t map_dev(struct alloc *a, int fd, size_t n) {
  a->addr = mmap(NULL, n, PROT_NONE, MAP_SHARED, fd, 0);
  if (a->addr == MAP_FAILED) return OUT_OF_MEMORY;
  a->shadow = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (a->shadow == MAP_FAILED) { munmap(a->addr, n); return OUT_OF_MEMORY; }
  a->size = n;
  return OK;
}

hipError_t hipMalloc(void **p, size_t n) {
  INIT();
  if (!p || n == 0) return INVALID_VALUE;
  char name[40];
  int fd = -1;
  /* Names a killed process left behind are skipped (bounded). */
  for (int tries = 0; fd < 0 && tries < 4096; tries++) {
    snprintf(name, sizeof name, "/fakehip-%d-%ld", (int)getpid(), __sync_add_and_fetch(&seq, 1));
    fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0 && errno != EEXIST) break;
  }
  if (fd < 0) return OUT_OF_MEMORY;
  if (ftruncate(fd, n) != 0) { close(fd); shm_unlink(name); return OUT_OF_MEMORY; }
  pthread_mutex_lock(&mu);
  struct alloc *a = slot();
  hipError_t r = a ? map_dev(a, fd, n) : OUT_OF_MEMORY;
  if (r == OK) { a->kind = 2; a->dev = curdev; a->fd = fd; memcpy(a->name, name, sizeof name); *p = a->addr; }
  else { if (a) a->used = 0; close(fd); shm_unlink(name); }
  pthread_mutex_unlock(&mu);
  return r;
}
hipError_t hipFree(void *p) {
  INIT();
  if (!p) return OK;
  pthread_mutex_lock(&mu);
  struct alloc *a = find((uintptr_t)p);
  if (!a || a->kind != 2 || a->addr != p) { pthread_mutex_unlock(&mu); return INVALID_VALUE; }
  munmap(a->addr, a->size); munmap(a->shadow, a->size); close(a->fd); shm_unlink(a->name); a->used = 0;
  pthread_mutex_unlock(&mu);
  return OK;
}
hipError_t hipHostMalloc(void **pp, size_t n, unsigned flags) {
  INIT();
  if (!pp || n == 0 || (flags & ~0xfu)) return INVALID_VALUE;
  void *m = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return OUT_OF_MEMORY;
  pthread_mutex_lock(&mu);
  struct alloc *a = slot();
  if (!a) { pthread_mutex_unlock(&mu); munmap(m, n); return OUT_OF_MEMORY; }
  a->kind = 1; a->dev = curdev; a->addr = a->shadow = m; a->size = n; a->fd = -1;
  pthread_mutex_unlock(&mu);
  *pp = m;
  return OK;
}
hipError_t hipHostFree(void *p) {
  INIT();
  pthread_mutex_lock(&mu);
  struct alloc *a = find((uintptr_t)p);
  if (!a || a->kind != 1 || a->addr != p) { pthread_mutex_unlock(&mu); return INVALID_VALUE; }
  munmap(a->addr, a->size); a->used = 0;
  pthread_mutex_unlock(&mu);
  return OK;
}

/* xlat turns p into an address the CPU may touch; want: 0 any, 1 host
 * (pinned or unknown), 2 device. */
static hipError_t xlat(uintptr_t p, size_t n, int want, char **out) {
  struct alloc *a = find(p);
  if (!a) {
    if (want == 2) return INVALID_VALUE;
    *out = (char *)p; return OK;
  }
  if (p + n > (uintptr_t)a->addr + a->size || p + n < p) return INVALID_VALUE;
  if (want == 2 && a->kind == 1) return INVALID_VALUE;
  if (want == 1 && a->kind != 1) return INVALID_VALUE;
  *out = a->shadow + (p - (uintptr_t)a->addr);
  return OK;
}
static long copy_delay_us = -1;
/* hipMemcpyKind: 0 HtoH, 1 HtoD, 2 DtoH, 3 DtoD, 4 Default. */
static hipError_t copy(uintptr_t dst, uintptr_t src, size_t n, int kind) {
  INIT();
  static const int wd[] = {1, 2, 1, 2, 0}, ws[] = {1, 1, 2, 2, 0};
  if (kind < 0 || kind > 4) return INVALID_VALUE;
  if (n == 0) return OK;
  char *d, *s;
  pthread_mutex_lock(&mu);
  if (copy_delay_us < 0) {
    const char *e = getenv("FAKEHIP_COPY_DELAY_US");
    copy_delay_us = e ? atol(e) : 0;
    if (copy_delay_us < 0) copy_delay_us = 0;
  }
  long delay = copy_delay_us;
  hipError_t r = xlat(dst, n, wd[kind], &d);
  if (r == OK) r = xlat(src, n, ws[kind], &s);
  pthread_mutex_unlock(&mu);
  if (r == OK && delay > 0) usleep((useconds_t)delay);
  if (r == OK) memmove(d, s, n);
  return r;
}
hipError_t hipMemcpy(void *d, const void *s, size_t n, int kind) { return copy((uintptr_t)d, (uintptr_t)s, n, kind); }
/* Streams are synchronous here: a copy is done when the call returns. */
static hipError_t stream_ok(void *s) { return (s == NULL || (uintptr_t)s >= 0x10000) ? OK : INVALID_HANDLE; }
hipError_t hipMemcpyAsync(void *d, const void *s, size_t n, int kind, void *st) {
  return stream_ok(st) ?: copy((uintptr_t)d, (uintptr_t)s, n, kind);
}
hipError_t hipStreamCreateWithFlags(void **s, unsigned flags) {
  INIT();
  if (!s || flags > 1) return INVALID_VALUE;
  *s = malloc(16); __sync_fetch_and_add(&streams, 1); return OK;
}
hipError_t hipStreamSynchronize(void *s) { INIT(); return stream_ok(s); }
hipError_t hipStreamDestroy(void *s) { INIT(); if (!s) return INVALID_HANDLE; free(s); __sync_fetch_and_sub(&streams, 1); return OK; }

hipError_t hipIpcGetMemHandle(hipIpcMemHandle_t *h, void *p) {
  INIT();
  if (!h) return INVALID_VALUE;
  pthread_mutex_lock(&mu);
  struct alloc *a = find((uintptr_t)p);
  if (!a || a->kind != 2 || a->addr != p) { pthread_mutex_unlock(&mu); return INVALID_VALUE; }
  struct handle x = { MAGIC, getpid(), a->dev, 0, a->size, {0} };
  memcpy(x.name, a->name, sizeof x.name);
  pthread_mutex_unlock(&mu);
  memset(h, 0, sizeof *h); memcpy(h, &x, sizeof x);
  return OK;
}
hipError_t hipIpcOpenMemHandle(void **p, hipIpcMemHandle_t h, unsigned flags) {
  INIT();
  struct handle x; memcpy(&x, &h, sizeof x);
  unsigned want = rocm == 5 ? 0 : 1; /* hipIpcMemLazyEnablePeerAccess */
  if (!p || x.magic != MAGIC || flags != want || x.size == 0) return INVALID_VALUE;
  if (x.pid == getpid()) return INVALID_CONTEXT; /* a process cannot open its own */
  x.name[sizeof x.name - 1] = 0;
  int fd = shm_open(x.name, O_RDWR | O_CLOEXEC, 0);
  if (fd < 0) return MAP_FAILED_;
  pthread_mutex_lock(&mu);
  struct alloc *a = slot();
  hipError_t r = a ? map_dev(a, fd, x.size) : OUT_OF_MEMORY;
  if (r == OK) { a->kind = 3; a->dev = curdev; a->fd = fd; *p = a->addr; opened++; }
  else { if (a) a->used = 0; close(fd); }
  pthread_mutex_unlock(&mu);
  return r;
}
hipError_t hipIpcCloseMemHandle(void *p) {
  INIT();
  pthread_mutex_lock(&mu);
  struct alloc *a = find((uintptr_t)p);
  if (!a || a->kind != 3 || a->addr != p) { pthread_mutex_unlock(&mu); return INVALID_VALUE; }
  munmap(a->addr, a->size); munmap(a->shadow, a->size); close(a->fd); a->used = 0; opened--;
  pthread_mutex_unlock(&mu);
  return OK;
}

/* hsa_amd_portable_export_dmabuf(ptr, size, &fd, &offset): the allocation's
 * shared memory object as the dma-buf, and ptr's offset in it. */
int hsa_amd_portable_export_dmabuf(const void *ptr, size_t size, int *fd, uint64_t *off) {
  const char *e = getenv("FAKEHIP_DMABUF");
  if (e && strcmp(e, "0") == 0) return 0x1001;
  if (devices() == 0 || !fd || !off || size == 0) return 0x1001;
  pthread_mutex_lock(&mu);
  struct alloc *a = find((uintptr_t)ptr);
  int st = 0;
  if (!a || a->kind == 1 || (uintptr_t)ptr + size > (uintptr_t)a->addr + a->size) st = 0x1001;
  else {
    int f = fcntl(a->fd, F_DUPFD_CLOEXEC, 0);
    if (f < 0) st = 0x1001;
    else { *fd = f; *off = (uintptr_t)ptr - (uintptr_t)a->addr; }
  }
  pthread_mutex_unlock(&mu);
  return st;
}

const char *hipGetErrorName(hipError_t r) {
  switch (r) {
  case OK: return "hipSuccess";
  case INVALID_VALUE: return "hipErrorInvalidValue";
  case OUT_OF_MEMORY: return "hipErrorOutOfMemory";
  case NO_DEVICE: return "hipErrorNoDevice";
  case INVALID_DEVICE: return "hipErrorInvalidDevice";
  case INVALID_CONTEXT: return "hipErrorInvalidContext";
  case INVALID_HANDLE: return "hipErrorInvalidHandle";
  case NOT_SUPPORTED: return "hipErrorNotSupported";
  }
  return "hipErrorUnknown";
}

__attribute__((destructor)) static void cleanup(void) {
  for (int i = 0; i < MAXA; i++)
    if (tab[i].used && tab[i].kind == 2) shm_unlink(tab[i].name);
}

/* Test probes: what is still open. */
long fakehip_open_handles(void) { return __atomic_load_n(&opened, __ATOMIC_RELAXED); }
long fakehip_streams(void) { return __atomic_load_n(&streams, __ATOMIC_RELAXED); }
/* The runtime's events are not used by te: none are ever open. */
long fakehip_events(void) { return 0; }
