/*
 * A fake CUDA driver for te's tests on machines without a GPU.
 *
 * It exports the driver entry points te binds, with cuda.h's signatures and
 * versioned names, and behaves strictly where te could go wrong:
 *
 *  - "device memory" is a shared memory object mapped twice: the address handed out is
 *    mapped PROT_NONE, so any CPU access to it faults (te must only touch it
 *    through the copy calls); the copies use a second, readable mapping;
 *  - calls that need a context fail with CUDA_ERROR_INVALID_CONTEXT unless
 *    the calling thread has one current (the current context is per thread);
 *  - IPC handles name the exporter's pid and object; a process cannot open its
 *    own handles (as with the real driver); device memory is a POSIX shared
 *    memory object named in the handle, so two processes share the bytes.
 *
 *  - cuMemGetHandleForAddressRange gives a dma-buf fd of an allocation (the
 *    shared memory object, from byte 0 of the allocation), which the fake
 *    libibverbs maps for ibv_reg_dmabuf_mr; FAKECUDA_DMABUF=0 makes it
 *    answer CUDA_ERROR_NOT_SUPPORTED, as drivers before 515 do.
 *
 *  - Fabric handles (multi-node NVLink): cuMemCreate with
 *    CU_MEM_HANDLE_TYPE_FABRIC (0x8) makes an allocation that
 *    cuMemExportToShareableHandle exports as a 64-byte CUmemFabricHandle;
 *    cuMemImportFromShareableHandle opens it in another process, which maps
 *    it with cuMemAddressReserve + cuMemMap + cuMemSetAccess. The fabric is
 *    FAKECUDA_FABRIC_DOMAIN (its first 16 bytes): unset, the device reports no fabric support
 *    (attribute 128 is 0) and fabric exports fail with NOT_SUPPORTED; a
 *    handle made in another domain fails to import with NOT_PERMITTED, as
 *    the real driver refuses a handle from outside its NVLink domain.
 *    Mapped VMM memory refuses copies until cuMemSetAccess granted access.
 *
 *  - FAKECUDA_COPY_DELAY_US=N makes every copy take N microseconds more (a
 *    busy GPU, a loaded machine): tests use it to hold a copy in flight
 *    while something else happens.
 *
 * Devices: FAKECUDA_DEVICES sets their number (0 makes cuInit fail with
 * CUDA_ERROR_NO_DEVICE). Otherwise, with TE_SYSFS_ROOT naming a recorded
 * sysfs tree, the NVIDIA functions of its bus/pci/devices (vendor 0x10de,
 * a display class) are the devices, in bus order, and cuDeviceGetPCIBusId
 * reports their addresses; without a tree there is one device.
 *
 * Besides what te calls, it has what a test program needs to make and check
 * device memory in any language: cuInit, cuDeviceGet,
 * cuDevicePrimaryCtxRetain, cuCtxSetCurrent, cuMemAlloc_v2, cuMemFree_v2,
 * cuMemcpyHtoD_v2, cuMemcpyDtoH_v2. `make fakes` builds it as
 * build/fake/libcuda.so.1.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/mman.h>
#include <unistd.h>

typedef unsigned int CUresult;
typedef unsigned long long CUdeviceptr;
typedef int CUdevice;
typedef void *CUcontext;
typedef void *CUstream;
typedef void *CUevent;
typedef struct { char reserved[64]; } CUipcMemHandle;
typedef struct { char bytes[16]; } CUuuid;

enum {
  OK = 0, INVALID_VALUE = 1, OUT_OF_MEMORY = 2, NOT_INITIALIZED = 3,
  NO_DEVICE = 100, INVALID_DEVICE = 101, INVALID_CONTEXT = 201,
  MAP_FAILED_ = 205, INVALID_HANDLE = 400, NOT_FOUND = 500, NOT_SUPPORTED = 801
};

#define MAXA 4096
#define MAGIC 0x4b465445u /* "ETFK" */

struct alloc {
  int used, kind; /* kind 1 host (pinned), 2 device, 3 device opened from IPC, 4 VMM mapping */
  int gh, access;  /* kind 4: generic handle index, cuMemSetAccess done */
  int dev, fd;
  char *addr, *shadow;
  char name[40];
  size_t size;
};

static struct alloc tab[MAXA];

/* Generic allocation handles of cuMemCreate and fabric imports (see the
 * virtual memory management calls below). */
#define MAXGH 1024
#define FMAGIC 0x4246544bu /* "KTFB" */
struct gh { int used, imported, dev, refs; unsigned htypes; int fd; size_t size; char name[32]; };
static struct gh ghs[MAXGH];
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int ndev = -1, inited;
static __thread uintptr_t cur; /* current context: 0x1000 + device */
static long opened, streams, events;

struct handle { uint32_t magic; int32_t pid, fd, dev; uint64_t size; char name[40]; };
static long seq;

static CUresult need_ctx(void) { return cur ? OK : INVALID_CONTEXT; }

/* PCI addresses of the devices: the sysfs tree's NVIDIA functions. */
#define MAXDEV 64
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
static void scan_tree(void) {
  const char *root = getenv("TE_SYSFS_ROOT");
  if (!root || !*root) return;
  char dir[4096];
  snprintf(dir, sizeof dir, "%s/bus/pci/devices", root);
  DIR *d = opendir(dir);
  struct dirent *e;
  while (d && (e = readdir(d)) && ntree < MAXDEV) {
    if (e->d_name[0] == '.' || strlen(e->d_name) >= sizeof busids[0]) continue;
    int cls = readhex(dir, e->d_name, "class");
    if (readhex(dir, e->d_name, "vendor") == 0x10de && (cls >> 16) == 0x03)
      memcpy(busids[ntree++], e->d_name, strlen(e->d_name) + 1);
  }
  if (d) closedir(d);
  qsort(busids, ntree, sizeof busids[0], cmpbus);
}

/* cuInit's outcome is decided once per process, as with the real driver. */
CUresult cuInit(unsigned int flags) {
  if (flags != 0) return INVALID_VALUE;
  pthread_mutex_lock(&mu);
  if (ndev < 0) {
    const char *e = getenv("FAKECUDA_DEVICES");
    scan_tree();
    ndev = e ? atoi(e) : ntree > 0 ? ntree : 1;
    if (ndev < 0) ndev = 0;
    if (ndev > MAXDEV) ndev = MAXDEV;
    /* Release: a thread that sees inited (INIT, without mu) sees ndev
     * and the device tree too, on arm64 as on x86. */
    __atomic_store_n(&inited, ndev > 0, __ATOMIC_RELEASE);
  }
  pthread_mutex_unlock(&mu);
  return __atomic_load_n(&inited, __ATOMIC_ACQUIRE) ? OK : NO_DEVICE;
}
#define INIT() do { if (!__atomic_load_n(&inited, __ATOMIC_ACQUIRE)) return NOT_INITIALIZED; } while (0)

CUresult cuDriverGetVersion(int *v) { if (!v) return INVALID_VALUE; *v = 12040; return OK; }
CUresult cuDeviceGetCount(int *n) { INIT(); *n = ndev; return OK; }
CUresult cuDeviceGet(CUdevice *d, int ord) {
  INIT(); if (ord < 0 || ord >= ndev) return INVALID_DEVICE; *d = ord; return OK;
}
CUresult cuDeviceGetUuid_v2(CUuuid *u, CUdevice d) {
  INIT(); if (d < 0 || d >= ndev) return INVALID_DEVICE;
  memset(u, 0, sizeof *u); snprintf(u->bytes, 16, "fakegpu-%04d", d & 1023); return OK;
}
/* cuDeviceGetPCIBusId writes "dddd:bb:dd.f" in upper case, as the driver
 * does: the tree's address of the device, or a made-up one without a tree. */
CUresult cuDeviceGetPCIBusId(char *out, int len, CUdevice d) {
  INIT(); if (d < 0 || d >= ndev) return INVALID_DEVICE;
  if (!out || len <= 0) return INVALID_VALUE;
  char b[16];
  if (d < ntree) {
    snprintf(b, sizeof b, "%s", busids[d]);
    for (char *p = b; *p; p++) if (*p >= 'a' && *p <= 'f') *p -= 'a' - 'A';
  } else {
    snprintf(b, sizeof b, "0000:%02X:00.0", (0x10 + d) & 0xff);
  }
  snprintf(out, (size_t)len, "%s", b);
  return OK;
}
CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d) {
  INIT(); if (d < 0 || d >= ndev) return INVALID_DEVICE; *c = (CUcontext)(uintptr_t)(0x1000 + d); return OK;
}
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) { INIT(); return (d < 0 || d >= ndev) ? INVALID_DEVICE : OK; }
CUresult cuCtxGetCurrent(CUcontext *c) { INIT(); *c = (CUcontext)cur; return OK; }
CUresult cuCtxSetCurrent(CUcontext c) {
  INIT(); uintptr_t v = (uintptr_t)c;
  if (v != 0 && (v < 0x1000 || v >= 0x1000 + (uintptr_t)ndev)) return INVALID_CONTEXT;
  cur = v; return OK;
}

/* find returns the allocation holding p (lock held). */
static struct alloc *find(uintptr_t p) {
  for (int i = 0; i < MAXA; i++)
    if (tab[i].used && p >= (uintptr_t)tab[i].addr && p < (uintptr_t)tab[i].addr + tab[i].size) return &tab[i];
  return NULL;
}
static struct alloc *slot(void) {
  for (int i = 0; i < MAXA; i++) if (!tab[i].used) { memset(&tab[i], 0, sizeof tab[i]); tab[i].used = 1; return &tab[i]; }
  return NULL;
}

CUresult cuPointerGetAttributes(unsigned int n, unsigned int *attrs, void **data, CUdeviceptr ptr) {
  INIT();
  /* FAKECUDA_POINTER_NEEDS_CTX=1 plays a driver that wants a context here. */
  if (!cur && getenv("FAKECUDA_POINTER_NEEDS_CTX")) return INVALID_CONTEXT;
  pthread_mutex_lock(&mu);
  struct alloc *a = find((uintptr_t)ptr);
  for (unsigned i = 0; i < n; i++) {
    switch (attrs[i]) {
    case 1: *(uintptr_t *)data[i] = a ? 0x1000 + a->dev : 0; break;           /* CONTEXT */
    case 2: *(unsigned *)data[i] = a ? (a->kind == 1 ? 1 : 2) : 0; break;      /* MEMORY_TYPE */
    case 9: *(int *)data[i] = a ? a->dev : -2; break;                          /* DEVICE_ORDINAL */
    default: pthread_mutex_unlock(&mu); return INVALID_VALUE;
    }
  }
  pthread_mutex_unlock(&mu);
  return OK;
}
CUresult cuPointerGetAttribute(void *data, unsigned int attr, CUdeviceptr ptr) {
  INIT();
  pthread_mutex_lock(&mu);
  struct alloc *a = find((uintptr_t)ptr);
  CUresult r = OK;
  if (!a) r = INVALID_VALUE;
  else if (attr == 1) *(uintptr_t *)data = 0x1000 + a->dev;
  else if (attr == 2) *(unsigned *)data = a->kind == 1 ? 1 : 2;
  else if (attr == 9) *(int *)data = a->dev;
  else r = INVALID_VALUE;
  pthread_mutex_unlock(&mu);
  return r;
}
CUresult cuMemGetAddressRange_v2(CUdeviceptr *base, size_t *size, CUdeviceptr ptr) {
  INIT(); if (need_ctx()) return INVALID_CONTEXT;
  pthread_mutex_lock(&mu);
  struct alloc *a = find((uintptr_t)ptr);
  if (a && a->kind != 1) { if (base) *base = (uintptr_t)a->addr; if (size) *size = a->size; }
  pthread_mutex_unlock(&mu);
  return a && a->kind != 1 ? OK : NOT_FOUND;
}

/* map_dev maps fd twice: PROT_NONE for the handed-out address, RW shadow. */
static CUresult map_dev(struct alloc *a, int fd, size_t n) {
  a->addr = mmap(NULL, n, PROT_NONE, MAP_SHARED, fd, 0);
  if (a->addr == MAP_FAILED) return OUT_OF_MEMORY;
  a->shadow = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (a->shadow == MAP_FAILED) { munmap(a->addr, n); return OUT_OF_MEMORY; }
  a->size = n;
  return OK;
}

CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) {
  INIT(); if (need_ctx()) return INVALID_CONTEXT;
  if (!p || n == 0) return INVALID_VALUE;
  char name[40];
  /* A process killed before cuMemFree leaves its names behind; a later
   * process with the same pid skips them (bounded). */
  int fd = -1;
  for (int tries = 0; fd < 0 && tries < 4096; tries++) {
    snprintf(name, sizeof name, "/fakecuda-%d-%ld", (int)getpid(), __sync_add_and_fetch(&seq, 1));
    fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0 && errno != EEXIST) break;
  }
  if (fd < 0) return OUT_OF_MEMORY;
  if (ftruncate(fd, n) != 0) { close(fd); shm_unlink(name); return OUT_OF_MEMORY; }
  pthread_mutex_lock(&mu);
  struct alloc *a = slot();
  CUresult r = a ? map_dev(a, fd, n) : OUT_OF_MEMORY;
  if (r == OK) { a->kind = 2; a->dev = (int)(cur - 0x1000); a->fd = fd; memcpy(a->name, name, sizeof name); *p = (uintptr_t)a->addr; }
  else { if (a) a->used = 0; close(fd); shm_unlink(name); }
  pthread_mutex_unlock(&mu);
  return r;
}
CUresult cuMemFree_v2(CUdeviceptr p) {
  INIT();
  pthread_mutex_lock(&mu);
  struct alloc *a = find((uintptr_t)p);
  if (!a || a->kind != 2 || (uintptr_t)a->addr != p) { pthread_mutex_unlock(&mu); return INVALID_VALUE; }
  munmap(a->addr, a->size); munmap(a->shadow, a->size); close(a->fd); shm_unlink(a->name); a->used = 0;
  pthread_mutex_unlock(&mu);
  return OK;
}
CUresult cuMemHostAlloc(void **pp, size_t n, unsigned int flags) {
  INIT(); if (need_ctx()) return INVALID_CONTEXT;
  if (!pp || n == 0 || (flags & ~7u)) return INVALID_VALUE;
  void *m = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return OUT_OF_MEMORY;
  pthread_mutex_lock(&mu);
  struct alloc *a = slot();
  if (!a) { pthread_mutex_unlock(&mu); munmap(m, n); return OUT_OF_MEMORY; }
  a->kind = 1; a->dev = (int)(cur - 0x1000); a->addr = a->shadow = m; a->size = n; a->fd = -1;
  pthread_mutex_unlock(&mu);
  *pp = m;
  return OK;
}
CUresult cuMemFreeHost(void *p) {
  INIT();
  pthread_mutex_lock(&mu);
  struct alloc *a = find((uintptr_t)p);
  if (!a || a->kind != 1 || a->addr != p) { pthread_mutex_unlock(&mu); return INVALID_VALUE; }
  munmap(a->addr, a->size); a->used = 0;
  pthread_mutex_unlock(&mu);
  return OK;
}

/* xlat turns p into an address the CPU may touch; want: 0 any, 1 host, 2 device. */
static CUresult xlat(uintptr_t p, size_t n, int want, char **out) {
  struct alloc *a = find(p);
  if (!a) {
    if (want == 2) return INVALID_VALUE;
    *out = (char *)p; return OK;
  }
  if (p + n > (uintptr_t)a->addr + a->size || p + n < p) return INVALID_VALUE;
  if (want == 2 && a->kind == 1) return INVALID_VALUE;
  if (a->kind == 4 && !a->access) return INVALID_VALUE; /* no cuMemSetAccess: the GPU would fault */
  if (want == 1 && a->kind != 1) return INVALID_VALUE;
  *out = a->shadow + (p - (uintptr_t)a->addr);
  return OK;
}
static long copy_delay_us = -1;
static CUresult copy(uintptr_t dst, int wd, uintptr_t src, int ws, size_t n) {
  INIT(); if (need_ctx()) return INVALID_CONTEXT;
  if (n == 0) return OK;
  char *d, *s;
  pthread_mutex_lock(&mu);
  if (copy_delay_us < 0) {
    const char *e = getenv("FAKECUDA_COPY_DELAY_US");
    copy_delay_us = e ? atol(e) : 0;
    if (copy_delay_us < 0) copy_delay_us = 0;
  }
  long delay = copy_delay_us;
  CUresult r = xlat(dst, n, wd, &d);
  if (r == OK) r = xlat(src, n, ws, &s);
  pthread_mutex_unlock(&mu);
  /* The copy is in flight from here: its memory must stay mapped. */
  if (r == OK && delay > 0) usleep((useconds_t)delay);
  if (r == OK) memmove(d, s, n);
  return r;
}
CUresult cuMemcpy(CUdeviceptr d, CUdeviceptr s, size_t n) { return copy(d, 0, s, 0, n); }
CUresult cuMemcpyHtoD_v2(CUdeviceptr d, const void *s, size_t n) { return copy(d, 2, (uintptr_t)s, 1, n); }
CUresult cuMemcpyDtoH_v2(void *d, CUdeviceptr s, size_t n) { return copy((uintptr_t)d, 1, s, 2, n); }
CUresult cuMemcpyDtoD_v2(CUdeviceptr d, CUdeviceptr s, size_t n) { return copy(d, 2, s, 2, n); }
/* Streams are synchronous here: a copy is done when the call returns. */
static CUresult stream_ok(CUstream s) { return (s == NULL || (uintptr_t)s >= 0x10000) ? OK : INVALID_HANDLE; }
CUresult cuMemcpyAsync(CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st) { return stream_ok(st) ?: copy(d, 0, s, 0, n); }
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void *s, size_t n, CUstream st) { return stream_ok(st) ?: copy(d, 2, (uintptr_t)s, 1, n); }
CUresult cuMemcpyDtoHAsync_v2(void *d, CUdeviceptr s, size_t n, CUstream st) { return stream_ok(st) ?: copy((uintptr_t)d, 1, s, 2, n); }
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st) { return stream_ok(st) ?: copy(d, 2, s, 2, n); }

CUresult cuStreamCreate(CUstream *s, unsigned int flags) {
  INIT(); if (need_ctx()) return INVALID_CONTEXT;
  if (flags > 1) return INVALID_VALUE;
  *s = malloc(16); __sync_fetch_and_add(&streams, 1); return OK;
}
CUresult cuStreamSynchronize(CUstream s) { INIT(); return stream_ok(s); }
CUresult cuStreamDestroy_v2(CUstream s) { INIT(); if (!s) return INVALID_HANDLE; free(s); __sync_fetch_and_sub(&streams, 1); return OK; }
CUresult cuEventCreate(CUevent *e, unsigned int flags) {
  (void)flags; INIT(); if (need_ctx()) return INVALID_CONTEXT;
  *e = malloc(16); __sync_fetch_and_add(&events, 1); return OK;
}
CUresult cuEventRecord(CUevent e, CUstream s) { INIT(); return e ? stream_ok(s) : INVALID_HANDLE; }
CUresult cuEventSynchronize(CUevent e) { INIT(); return e ? OK : INVALID_HANDLE; }
CUresult cuEventDestroy_v2(CUevent e) { INIT(); if (!e) return INVALID_HANDLE; free(e); __sync_fetch_and_sub(&events, 1); return OK; }

CUresult cuIpcGetMemHandle(CUipcMemHandle *h, CUdeviceptr p) {
  INIT(); if (need_ctx()) return INVALID_CONTEXT;
  pthread_mutex_lock(&mu);
  struct alloc *a = find((uintptr_t)p);
  if (!a || a->kind != 2) { pthread_mutex_unlock(&mu); return INVALID_VALUE; }
  struct handle x = { MAGIC, getpid(), a->fd, a->dev, a->size, {0} };
  memcpy(x.name, a->name, sizeof x.name);
  pthread_mutex_unlock(&mu);
  memset(h, 0, sizeof *h); memcpy(h, &x, sizeof x);
  return OK;
}
CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *p, CUipcMemHandle h, unsigned int flags) {
  INIT(); if (need_ctx()) return INVALID_CONTEXT;
  struct handle x; memcpy(&x, &h, sizeof x);
  if (x.magic != MAGIC || flags > 1 || x.size == 0) return INVALID_VALUE;
  if (x.pid == getpid()) return INVALID_CONTEXT; /* the real driver refuses too */
  x.name[sizeof x.name - 1] = 0;
  int fd = shm_open(x.name, O_RDWR | O_CLOEXEC, 0);
  if (fd < 0) return MAP_FAILED_;
  pthread_mutex_lock(&mu);
  struct alloc *a = slot();
  CUresult r = a ? map_dev(a, fd, x.size) : OUT_OF_MEMORY;
  if (r == OK) { a->kind = 3; a->dev = (int)(cur - 0x1000); a->fd = fd; *p = (uintptr_t)a->addr; opened++; }
  else { if (a) a->used = 0; close(fd); }
  pthread_mutex_unlock(&mu);
  return r;
}
CUresult cuIpcCloseMemHandle(CUdeviceptr p) {
  INIT();
  pthread_mutex_lock(&mu);
  struct alloc *a = find((uintptr_t)p);
  if (!a || a->kind != 3 || (uintptr_t)a->addr != p) { pthread_mutex_unlock(&mu); return INVALID_VALUE; }
  munmap(a->addr, a->size); munmap(a->shadow, a->size); close(a->fd); a->used = 0; opened--;
  pthread_mutex_unlock(&mu);
  return OK;
}
/* cuMemGetHandleForAddressRange exports an allocation as a dma-buf fd:
 * here the shared memory object itself, from the allocation's first byte,
 * so [dptr, dptr+size) must start at an allocation and be page aligned, as
 * the driver requires. Type 1 is CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD. */
CUresult cuMemGetHandleForAddressRange(void *handle, CUdeviceptr dptr, size_t size, int type, unsigned long long flags) {
  INIT();
  const char *e = getenv("FAKECUDA_DMABUF");
  if (e && strcmp(e, "0") == 0) return NOT_SUPPORTED;
  long pg = sysconf(_SC_PAGESIZE);
  if (!handle || type != 1 || flags != 0 || size == 0 || (dptr % pg) || (size % pg)) return INVALID_VALUE;
  pthread_mutex_lock(&mu);
  struct alloc *a = find((uintptr_t)dptr);
  CUresult r = OK;
  if (!a || a->kind == 1 || (uintptr_t)a->addr != dptr || size > ((a->size + pg - 1) / pg) * pg) r = INVALID_VALUE;
  else {
    int fd = fcntl(a->kind == 4 ? ghs[a->gh].fd : a->fd, F_DUPFD_CLOEXEC, 0);
    if (fd < 0) r = OUT_OF_MEMORY;
    else *(int *)handle = fd;
  }
  pthread_mutex_unlock(&mu);
  return r;
}
/* Virtual memory management (cuMemCreate and friends) with fabric handles.
 * A generic allocation handle is 0x2000 + an index in ghs. */
static long fabric_imports; /* imported handles not yet released */
typedef struct { int type, id; } CUmemLocation;
typedef struct {
  int type; unsigned requestedHandleTypes; CUmemLocation location;
  void *win32HandleMetaData;
  struct { unsigned char compressionType, gpuDirectRDMACapable; unsigned short usage; unsigned char reserved[4]; } allocFlags;
} CUmemAllocationProp;
typedef struct { CUmemLocation location; int flags; } CUmemAccessDesc;
struct fabric { uint32_t magic; int32_t pid; uint64_t size; char name[32]; char domain[16]; };
typedef unsigned long long CUmemGenericAllocationHandle;

static const char *fabric_domain(void) {
  const char *d = getenv("FAKECUDA_FABRIC_DOMAIN");
  return d && *d ? d : NULL;
}
static struct gh *ghget(CUmemGenericAllocationHandle h) {
  if (h < 0x2000 || h >= 0x2000 + MAXGH || !ghs[h - 0x2000].used) return NULL;
  return &ghs[h - 0x2000];
}
static CUmemGenericAllocationHandle ghnew(void) {
  for (int i = 0; i < MAXGH; i++)
    if (!ghs[i].used) { memset(&ghs[i], 0, sizeof ghs[i]); ghs[i].used = 1; ghs[i].refs = 1; return 0x2000 + i; }
  return 0;
}
static void ghput(struct gh *g) {
  if (--g->refs > 0) return;
  close(g->fd);
  if (!g->imported) shm_unlink(g->name);
  else fabric_imports--;
  g->used = 0;
}

CUresult cuDeviceGetAttribute(int *v, int attr, CUdevice d) {
  INIT(); if (d < 0 || d >= ndev) return INVALID_DEVICE;
  if (!v) return INVALID_VALUE;
  if (attr == 128) { *v = fabric_domain() != NULL; return OK; } /* HANDLE_TYPE_FABRIC_SUPPORTED */
  return INVALID_VALUE;
}
CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t n, const CUmemAllocationProp *p, unsigned long long flags) {
  INIT(); if (need_ctx()) return INVALID_CONTEXT;
  if (!h || !p || n == 0 || flags || p->type != 1 || p->location.type != 1) return INVALID_VALUE;
  if (p->location.id < 0 || p->location.id >= ndev) return INVALID_DEVICE;
  if ((p->requestedHandleTypes & 8) && !fabric_domain()) return NOT_SUPPORTED;
  char name[32];
  int fd = -1;
  for (int tries = 0; fd < 0 && tries < 4096; tries++) {
    snprintf(name, sizeof name, "/fakecudavm-%d-%ld", (int)getpid(), __sync_add_and_fetch(&seq, 1));
    fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0 && errno != EEXIST) break;
  }
  if (fd < 0) return OUT_OF_MEMORY;
  if (ftruncate(fd, n) != 0) { close(fd); shm_unlink(name); return OUT_OF_MEMORY; }
  pthread_mutex_lock(&mu);
  CUmemGenericAllocationHandle x = ghnew();
  if (!x) { pthread_mutex_unlock(&mu); close(fd); shm_unlink(name); return OUT_OF_MEMORY; }
  struct gh *g = ghget(x);
  g->fd = fd; g->size = n; g->dev = p->location.id; g->htypes = p->requestedHandleTypes; memcpy(g->name, name, sizeof name);
  pthread_mutex_unlock(&mu);
  *h = x;
  return OK;
}
CUresult cuMemRelease(CUmemGenericAllocationHandle h) {
  INIT();
  pthread_mutex_lock(&mu);
  struct gh *g = ghget(h);
  if (g) ghput(g);
  pthread_mutex_unlock(&mu);
  return g ? OK : INVALID_VALUE;
}
CUresult cuMemAddressReserve(CUdeviceptr *p, size_t n, size_t align, CUdeviceptr addr, unsigned long long flags) {
  INIT();
  (void)align; (void)addr;
  if (!p || n == 0 || flags) return INVALID_VALUE;
  void *m = mmap(NULL, n, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) return OUT_OF_MEMORY;
  *p = (uintptr_t)m;
  return OK;
}
CUresult cuMemAddressFree(CUdeviceptr p, size_t n) {
  INIT();
  pthread_mutex_lock(&mu);
  struct alloc *a = find((uintptr_t)p);
  pthread_mutex_unlock(&mu);
  if (a || !p || n == 0) return INVALID_VALUE; /* still mapped */
  munmap((void *)(uintptr_t)p, n);
  return OK;
}
CUresult cuMemMap(CUdeviceptr p, size_t n, size_t off, CUmemGenericAllocationHandle h, unsigned long long flags) {
  INIT();
  if (off || flags || n == 0) return INVALID_VALUE;
  pthread_mutex_lock(&mu);
  struct gh *g = ghget(h);
  CUresult r = OK;
  struct alloc *a = NULL;
  if (!g || n > g->size || find((uintptr_t)p)) r = INVALID_VALUE;
  else if (!(a = slot())) r = OUT_OF_MEMORY;
  else {
    a->addr = mmap((void *)(uintptr_t)p, n, PROT_NONE, MAP_SHARED | MAP_FIXED, g->fd, 0);
    a->shadow = a->addr == MAP_FAILED ? MAP_FAILED : mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED, g->fd, 0);
    if (a->addr == MAP_FAILED || a->shadow == MAP_FAILED) { a->used = 0; r = OUT_OF_MEMORY; }
    else { a->kind = 4; a->gh = (int)(h - 0x2000); a->dev = g->dev; a->fd = -1; a->size = n; g->refs++; }
  }
  pthread_mutex_unlock(&mu);
  return r;
}
CUresult cuMemSetAccess(CUdeviceptr p, size_t n, const CUmemAccessDesc *d, size_t count) {
  INIT();
  if (!d || count == 0) return INVALID_VALUE;
  for (size_t i = 0; i < count; i++)
    if (d[i].location.type != 1 || d[i].location.id < 0 || d[i].location.id >= ndev || d[i].flags > 3) return INVALID_VALUE;
  pthread_mutex_lock(&mu);
  struct alloc *a = find((uintptr_t)p);
  CUresult r = (a && a->kind == 4 && (uintptr_t)a->addr == p && n <= a->size) ? OK : INVALID_VALUE;
  if (r == OK) a->access = d[0].flags == 3;
  pthread_mutex_unlock(&mu);
  return r;
}
CUresult cuMemUnmap(CUdeviceptr p, size_t n) {
  INIT();
  pthread_mutex_lock(&mu);
  struct alloc *a = find((uintptr_t)p);
  if (!a || a->kind != 4 || (uintptr_t)a->addr != p || n != a->size) { pthread_mutex_unlock(&mu); return INVALID_VALUE; }
  munmap(a->shadow, a->size);
  /* The range stays reserved until cuMemAddressFree. */
  mmap(a->addr, a->size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
  ghput(&ghs[a->gh]);
  a->used = 0;
  pthread_mutex_unlock(&mu);
  return OK;
}
CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *h, void *addr) {
  INIT();
  pthread_mutex_lock(&mu);
  struct alloc *a = find((uintptr_t)addr);
  CUresult r = (a && a->kind == 4) ? OK : INVALID_VALUE; /* cuMemAlloc memory has none */
  if (r == OK) { ghs[a->gh].refs++; *h = 0x2000 + a->gh; }
  pthread_mutex_unlock(&mu);
  return r;
}
CUresult cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp *p, CUmemGenericAllocationHandle h) {
  INIT();
  pthread_mutex_lock(&mu);
  struct gh *g = ghget(h);
  if (g && p) { memset(p, 0, sizeof *p); p->type = 1; p->requestedHandleTypes = g->htypes; p->location.type = 1; p->location.id = g->dev; }
  pthread_mutex_unlock(&mu);
  return g && p ? OK : INVALID_VALUE;
}
CUresult cuMemExportToShareableHandle(void *out, CUmemGenericAllocationHandle h, int type, unsigned long long flags) {
  INIT();
  if (!out || flags || type != 8) return INVALID_VALUE;
  const char *dom = fabric_domain();
  if (!dom) return NOT_SUPPORTED;
  pthread_mutex_lock(&mu);
  struct gh *g = ghget(h);
  CUresult r = !g ? INVALID_VALUE : (g->imported || !(g->htypes & 8)) ? INVALID_VALUE : OK;
  if (r == OK) {
    struct fabric f = { FMAGIC, getpid(), g->size, {0}, {0} };
    memcpy(f.name, g->name, sizeof f.name);
    size_t dl = strlen(dom); /* the first 16 bytes name the domain */
    memcpy(f.domain, dom, dl < sizeof f.domain ? dl : sizeof f.domain);
    memset(out, 0, 64); memcpy(out, &f, sizeof f);
  }
  pthread_mutex_unlock(&mu);
  return r;
}
CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *h, void *in, int type) {
  INIT();
  if (!h || !in || type != 8) return INVALID_VALUE;
  const char *dom = fabric_domain();
  if (!dom) return NOT_SUPPORTED;
  struct fabric f; memcpy(&f, in, sizeof f);
  if (f.magic != FMAGIC || f.size == 0) return INVALID_VALUE;
  char mine[16] = {0};
  size_t dl = strlen(dom);
  memcpy(mine, dom, dl < sizeof mine ? dl : sizeof mine);
  if (memcmp(f.domain, mine, sizeof mine) != 0) return 800; /* NOT_PERMITTED: another NVLink domain */
  f.name[sizeof f.name - 1] = 0;
  int fd = shm_open(f.name, O_RDWR | O_CLOEXEC, 0);
  if (fd < 0) return INVALID_VALUE; /* the allocation is gone */
  pthread_mutex_lock(&mu);
  CUmemGenericAllocationHandle x = ghnew();
  if (x) {
    struct gh *g = ghget(x);
    g->fd = fd; g->size = f.size; g->imported = 1; g->htypes = 8; g->dev = cur ? (int)(cur - 0x1000) : 0;
    fabric_imports++;
  }
  pthread_mutex_unlock(&mu);
  if (!x) { close(fd); return OUT_OF_MEMORY; }
  *h = x;
  return OK;
}
long fakecuda_fabric_imports(void) { pthread_mutex_lock(&mu); long n = fabric_imports; pthread_mutex_unlock(&mu); return n; }
CUresult cuGetErrorName(CUresult r, const char **s) {
  switch (r) {
  case OK: *s = "CUDA_SUCCESS"; return OK;
  case INVALID_VALUE: *s = "CUDA_ERROR_INVALID_VALUE"; return OK;
  case INVALID_CONTEXT: *s = "CUDA_ERROR_INVALID_CONTEXT"; return OK;
  case NOT_SUPPORTED: *s = "CUDA_ERROR_NOT_SUPPORTED"; return OK;
  case 800: *s = "CUDA_ERROR_NOT_PERMITTED"; return OK;
  }
  *s = NULL; return INVALID_VALUE;
}

/* Objects of a process that exits without freeing are unlinked at exit. */
__attribute__((destructor)) static void cleanup(void) {
  for (int i = 0; i < MAXA; i++)
    if (tab[i].used && tab[i].kind == 2) shm_unlink(tab[i].name);
  for (int i = 0; i < MAXGH; i++)
    if (ghs[i].used && !ghs[i].imported) shm_unlink(ghs[i].name);
}

/* Test probes: what is still open. */
long fakecuda_open_handles(void) { return __atomic_load_n(&opened, __ATOMIC_RELAXED); }
long fakecuda_streams(void) { return __atomic_load_n(&streams, __ATOMIC_RELAXED); }
long fakecuda_events(void) { return __atomic_load_n(&events, __ATOMIC_RELAXED); }
/* fakecuda_ipc_arg echoes the handle's bytes: a check that purego passes the
 * 64-byte struct by value the way the C ABI does. */
CUresult fakecuda_ipc_arg(unsigned char *out, CUipcMemHandle h, unsigned int flags) {
  memcpy(out, &h, 64); out[64] = (unsigned char)flags; return OK;
}
