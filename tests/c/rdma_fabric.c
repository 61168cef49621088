/* rdma_fabric: GPU memory over rdma between two processes through te.h, on
 * the fake fabric (no GPU, no NIC): the fake libibverbs (TE_IBV_LIBRARY),
 * the fake CUDA driver (TE_CUDA_LIBRARY) and the recorded 8-GPU/8-NIC node
 * (the manifest in argv[1], built here and named by TE_SYSFS_ROOT). The
 * program makes a fabric directory (FAKEVERBS_FABRIC), runs itself again
 * with that environment as the initiator (libte reads its environment when
 * it loads), which starts another copy as the target and talks to it over
 * pipes:
 *
 *   target -> initiator  "READY <segment> <addr> <len>"  (GPU 5 memory)
 *   initiator -> target  "CHECK"  target copies its GPU memory to the host,
 *                                 checks the written half, answers OK / BAD
 *   initiator -> target  "EXIT"
 *
 * The initiator holds GPU 3 memory (allocated with the fake driver, as an
 * application would with cuMemAlloc), READs the target's first half into it
 * and WRITEs its own pattern into the second half, over rdma, then checks
 * that te's stats name the NICs behind GPU 3's and GPU 5's PCIe switches
 * (mlx5_2 and mlx5_4 on that node), and that a request under a window
 * (te_submit_windows) is refused with TE_ERR_NOT_SUPPORTED: rdma cannot
 * enforce windows. Without the fakes it exits 77 (skip).
 *
 * "rdma_fabric --real TRANSPORT" runs the same on a GPU machine with the
 * real driver (TE_CUDA_LIBRARY or libcuda.so.1), both processes on device
 * 0, every request forced over TRANSPORT (cudaipc, tcp or rdma): the te.h
 * step of bench/gpu/check.sh. */
#include <dlfcn.h>
#include <errno.h>
#include <signal.h>
#include <spawn.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testutil.h"

extern char **environ;

#define HALF (2u << 20)
#define CHUNK 300007u
#define SEED_T 5u
#define SEED_I 3u

/* ---- the fake driver, as an application calls it ---- */
static struct {
    int (*init)(unsigned);
    int (*device_get)(int *, int);
    int (*retain)(void **, int);
    int (*set_current)(void *);
    int (*alloc)(unsigned long long *, size_t);
    int (*free_)(unsigned long long);
    int (*htod)(unsigned long long, const void *, size_t);
    int (*dtoh)(void *, unsigned long long, size_t);
} cu;

/* Real mode (bench/gpu/check.sh): the real driver, device 0 on both sides. */
static int real_mode(void) { return getenv("TE_TEST_REAL_TRANSPORT") != NULL; }
static int dev_target(void) { return real_mode() ? 0 : 5; }
static int dev_initiator(void) { return real_mode() ? 0 : 3; }

static int load_cuda(void) {
    const char *p = getenv("TE_CUDA_LIBRARY");
    if (!p || !*p) p = "libcuda.so.1";
    void *h = dlopen(p, RTLD_NOW | RTLD_GLOBAL);
    if (!h) return -1;
    *(void **)&cu.init = dlsym(h, "cuInit");
    *(void **)&cu.device_get = dlsym(h, "cuDeviceGet");
    *(void **)&cu.retain = dlsym(h, "cuDevicePrimaryCtxRetain");
    *(void **)&cu.set_current = dlsym(h, "cuCtxSetCurrent");
    *(void **)&cu.alloc = dlsym(h, "cuMemAlloc_v2");
    *(void **)&cu.free_ = dlsym(h, "cuMemFree_v2");
    *(void **)&cu.htod = dlsym(h, "cuMemcpyHtoD_v2");
    *(void **)&cu.dtoh = dlsym(h, "cuMemcpyDtoH_v2");
    if (!cu.init || !cu.device_get || !cu.retain || !cu.set_current || !cu.alloc || !cu.free_ || !cu.htod || !cu.dtoh)
        return -1;
    return cu.init(0);
}

/* gpu_alloc allocates n bytes on device dev and makes its context current. */
static unsigned long long gpu_alloc(int dev, size_t n) {
    int d;
    void *ctx;
    unsigned long long p = 0;
    if (cu.device_get(&d, dev) || cu.retain(&ctx, d) || cu.set_current(ctx) || cu.alloc(&p, n)) return 0;
    return p;
}

/* ---- the recorded sysfs tree ---- */
static int mkdirs(char *path) {
    for (char *s = path + 1; *s; s++)
        if (*s == '/') {
            *s = 0;
            if (mkdir(path, 0755) && errno != EEXIST) return -1;
            *s = '/';
        }
    return mkdir(path, 0755) && errno != EEXIST ? -1 : 0;
}

/* materialize builds the manifest's tree ("d PATH", "f PATH VALUE",
 * "l PATH TARGET") under root. */
static int materialize(const char *manifest, const char *root) {
    FILE *f = fopen(manifest, "r");
    if (!f) return -1;
    char line[4096];
    int rc = 0;
    while (rc == 0 && fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        char kind = line[0], *path = line + 2, *arg = NULL;
        if ((kind != 'd' && kind != 'f' && kind != 'l') || line[1] != ' ') continue;
        if (kind != 'd') {
            arg = strchr(path, ' ');
            if (!arg) continue;
            *arg++ = 0;
        }
        char full[8192];
        snprintf(full, sizeof full, "%s/%s", root, path);
        if (kind == 'd') {
            rc = mkdirs(full);
            continue;
        }
        char *slash = strrchr(full, '/');
        *slash = 0;
        rc = mkdirs(full);
        *slash = '/';
        if (rc) break;
        if (kind == 'l') {
            rc = symlink(arg, full);
        } else {
            FILE *w = fopen(full, "w");
            rc = !w || fprintf(w, "%s\n", arg) < 0;
            if (w) fclose(w);
        }
    }
    fclose(f);
    return rc;
}

static te_config_t config(const char *force) {
    te_config_t cfg = TE_CONFIG_INIT;
    cfg.listen_addr = "127.0.0.1:0";
    cfg.transports = real_mode() ? NULL : "rdma,tcp";
    cfg.force_transport = force;
    cfg.rpc_timeout_ms = 5000;
    cfg.transfer_timeout_ms = 20000;
    return cfg;
}

static int target(void) {
    te_config_t cfg = config(NULL);
    te_engine_t e;
    if (te_create(&cfg, &e) != 0) {
        fprintf(stderr, "target: create: %s\n", tu_last());
        return 1;
    }
    unsigned long long g = gpu_alloc(dev_target(), 2 * HALF);
    unsigned char *host = malloc(2 * HALF);
    if (!g || !host) return 1;
    tu_fill(host, HALF, SEED_T);
    memset(host + HALF, 0xEE, HALF);
    char name[256], loc[16];
    snprintf(loc, sizeof loc, "cuda:%d", dev_target());
    if (cu.htod(g, host, 2 * HALF) || te_register(e, (void *)(uintptr_t)g, 2 * HALF, loc, 1) != 0 ||
        te_segment_name(e, name, sizeof name) != 0) {
        fprintf(stderr, "target: %s\n", tu_last());
        return 1;
    }
    printf("READY %s %llu %llu\n", name, g, (unsigned long long)(2 * HALF));
    fflush(stdout);
    char line[128];
    while (fgets(line, sizeof line, stdin)) {
        if (strncmp(line, "CHECK", 5) == 0) {
            long long bad = -2;
            if (cu.dtoh(host, g, 2 * HALF) == 0) bad = tu_verify(host + HALF, HALF, SEED_I);
            if (bad != -1)
                printf("BAD written half differs at %lld\n", bad);
            else
                printf("OK\n");
            fflush(stdout);
        } else if (strncmp(line, "EXIT", 4) == 0) {
            break;
        }
    }
    int rc = te_unregister(e, (void *)(uintptr_t)g) != 0 || te_destroy(e) != 0;
    cu.free_(g);
    free(host);
    return rc;
}

/* transfer moves len bytes in CHUNK-sized requests of one batch, each of
 * which must complete over rdma. */
static void transfer(te_engine_t e, te_segment_t seg, int op, unsigned long long local, uint64_t remote, uint64_t len,
                     const char *want) {
    size_t n = (len + CHUNK - 1) / CHUNK;
    te_request_t *reqs = calloc(n, sizeof *reqs);
    for (size_t i = 0; i < n; i++) {
        uint64_t off = (uint64_t)i * CHUNK;
        uint64_t l = len - off < CHUNK ? len - off : CHUNK;
        reqs[i] = (te_request_t){op, 0, (void *)(uintptr_t)(local + off), seg, remote + off, l};
    }
    te_batch_t b;
    CHECK_OK(te_allocate_batch(e, n, &b));
    CHECK_OK(te_submit(b, reqs, n));
    te_batch_status_t st;
    CHECK_OK(te_wait(b, 30000, &st));
    CHECK(st.state == TE_TASK_COMPLETED && st.completed == n && st.transferred == len);
    for (size_t i = 0; i < n; i++) {
        te_task_status_t ts;
        CHECK_OK(te_task_status(b, i, &ts));
        if (ts.state != TE_TASK_COMPLETED || strcmp(ts.transport, want) != 0) {
            fprintf(stderr, "task %zu: state %d over %s, want COMPLETED over %s\n", i, ts.state, ts.transport, want);
            tu_failures++;
            break;
        }
    }
    CHECK_OK(te_free_batch(b));
    free(reqs);
}

static int initiator(const char *self) {
    char *argv[] = {(char *)self, "target", NULL};
    int to_child[2] = {-1, -1}, from_child[2] = {-1, -1};
    pid_t pid;
    if (tu_spawn(self, argv, environ, &pid, &to_child[1], &from_child[0]) != 0) {
        perror("spawn");
        return 1;
    }
    FILE *in = fdopen(from_child[0], "r"), *out = fdopen(to_child[1], "w");
    char line[512], name[256];
    unsigned long long raddr = 0, rlen = 0;
    if (!fgets(line, sizeof line, in) || sscanf(line, "READY %255s %llu %llu", name, &raddr, &rlen) != 3) {
        fprintf(stderr, "target did not start\n");
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        return 1;
    }
    const char *want = real_mode() ? getenv("TE_TEST_REAL_TRANSPORT") : "rdma";
    te_config_t cfg = config(want);
    te_engine_t e = 0;
    CHECK_OK(te_create(&cfg, &e));
    unsigned long long g = gpu_alloc(dev_initiator(), 2 * HALF);
    unsigned char *host = malloc(2 * HALF);
    CHECK(g != 0 && host != NULL);
    tu_fill(host + HALF, HALF, SEED_I);
    memset(host, 0, HALF);
    CHECK(cu.htod(g, host, 2 * HALF) == 0);
    char loc[16];
    snprintf(loc, sizeof loc, "cuda:%d", dev_initiator());
    CHECK_OK(te_register(e, (void *)(uintptr_t)g, 2 * HALF, loc, 1));
    te_segment_t seg = 0;
    CHECK_OK(te_open_segment(e, name, &seg));
    if (tu_failures == 0) {
        transfer(e, seg, TE_READ, g, raddr, HALF, want);
        CHECK(cu.dtoh(host, g, HALF) == 0 && tu_verify(host, HALF, SEED_T) == -1);
        transfer(e, seg, TE_WRITE, g + HALF, raddr + HALF, HALF, want);
        fprintf(out, "CHECK\n");
        fflush(out);
        if (!fgets(line, sizeof line, in) || strncmp(line, "OK", 2) != 0) {
            fprintf(stderr, "target: %s", line);
            tu_failures++;
        }
    }
    if (tu_failures == 0 && !real_mode()) {
        /* Every byte went through the NICs behind the two GPUs' switches. */
        char *js = malloc(1 << 20);
        CHECK_OK(te_stats_json(e, js, 1 << 20));
        if (!strstr(js, "\"rail.mlx5_2:mlx5_4.bytes\":4194304")) {
            fprintf(stderr, "stats do not show 4 MiB on mlx5_2:mlx5_4: %.2000s\n", js);
            tu_failures++;
        }
        CHECK(strstr(js, "\"gpu_dmabuf\":1") != NULL);
        CHECK(strstr(js, "\"cuda:3\":[[\"mlx5_2\"]") != NULL);
        free(js);
        /* Under a window (te_submit_windows): rdma, forced, cannot enforce
         * one, so the request is refused here before the target sees it
         * (any key will do), never sent under the buffer's own key. */
        te_request_t r = {TE_WRITE, 0, (void *)(uintptr_t)(g + HALF), seg, raddr + HALF, 4096};
        uint64_t key = 0x1234567890abcdefull;
        te_batch_t b = 0;
        te_batch_status_t st;
        CHECK_OK(te_allocate_batch(e, 1, &b));
        CHECK_RC(TE_ERR_NOT_SUPPORTED, te_submit_windows(b, &r, &key, 1));
        CHECK(strstr(tu_last(), "window") != NULL);
        CHECK_OK(te_batch_status(b, &st));
        CHECK(st.tasks == 0);
        te_wait(b, 30000, NULL); /* had it gone, free only once it ended */
        CHECK_OK(te_free_batch(b));
    }
    fprintf(out, "EXIT\n");
    fflush(out);
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    if (seg) CHECK_OK(te_close_segment(seg));
    CHECK_OK(te_unregister(e, (void *)(uintptr_t)g));
    CHECK_OK(te_destroy(e));
    cu.free_(g);
    free(host);
    return tu_done("rdma_fabric");
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "target") == 0) return load_cuda() ? 1 : target();
    if (argc > 1 && strcmp(argv[1], "initiator") == 0) {
        if (load_cuda() != 0) {
            fprintf(stderr, "the CUDA driver (%s) does not load\n", getenv("TE_CUDA_LIBRARY"));
            return 1;
        }
        int rc = initiator(argv[0]);
        if (getenv("TE_TEST_FABRIC_DIR")) {
            char cmd[128];
            snprintf(cmd, sizeof cmd, "rm -rf %s", getenv("TE_TEST_FABRIC_DIR"));
            if (system(cmd) != 0) fprintf(stderr, "could not remove the fabric directory\n");
        }
        return rc;
    }
    if (argc > 2 && strcmp(argv[1], "--real") == 0) {
        setenv("TE_TEST_REAL_TRANSPORT", argv[2], 1);
        char *args[] = {argv[0], "initiator", NULL};
        execv(argv[0], args);
        perror("execv");
        return 1;
    }
    if (argc < 2 || !getenv("TE_IBV_LIBRARY") || !getenv("TE_CUDA_LIBRARY")) {
        printf("rdma_fabric: skipped (usage: TE_IBV_LIBRARY=... TE_CUDA_LIBRARY=... rdma_fabric hgx8.tree)\n");
        return 77;
    }
    /* A fabric and a sysfs tree of our own, before anything loads. */
    char dir[] = "/tmp/te-rdma-fabric-XXXXXX";
    if (!mkdtemp(dir)) return 1;
    char fabric[64], root[64];
    snprintf(fabric, sizeof fabric, "%s/fabric", dir);
    snprintf(root, sizeof root, "%s/sysfs", dir);
    if (materialize(argv[1], root) != 0) {
        fprintf(stderr, "cannot build the tree of %s under %s\n", argv[1], root);
        return 1;
    }
    setenv("FAKEVERBS_FABRIC", fabric, 1);
    setenv("TE_SYSFS_ROOT", root, 1);
    setenv("TE_TEST_FABRIC_DIR", dir, 1);
    /* libte took its environment when it loaded: start again with this one. */
    char *args[] = {argv[0], "initiator", NULL};
    execv(argv[0], args);
    perror("execv");
    return 1;
}
