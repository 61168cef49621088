/* handoff: a real prefill-to-decode KV handoff through te-sidecar, in two
 * processes, using nothing but te.h.
 *
 *   handoff <te-sidecar binary> [transport]
 *
 * starts te-sidecar on a free loopback port (it reads the address from the
 * sidecar's "serving" log line), re-executes itself as the prefill process
 * (argv[1] == "prefill") and plays decode itself:
 *
 *   decode   expects "push-<pid>" (push mode) into blocks PUSH_DST, "pull-<pid>"
 *            (pull mode) into PULL_DST, and expects then aborts "abort-<pid>";
 *            then tells prefill "GO <sidecar> <suffix>" on its stdin and waits for
 *            the transfers (pull: decode reads, in its wait)
 *   prefill  fills every layer with a known pattern, declares its blocks ready,
 *            sends the push transfer layer by layer, waits for the pull one,
 *            and finds the aborted one refused with TE_ERR_CANCELED
 *
 * Decode checks every byte of its cache: each destination block holds the
 * source block's bytes of every layer and K/V, every other block is
 * untouched. The caches differ in block count (12 vs 16) and the block ids
 * are not contiguous, so a wrong offset shows. With a transport ("tcp"),
 * both engines are forced to it; by default they pick (shm on one host). */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "testutil.h"

extern char **environ;

#define LAYERS 4
#define NBLK 5
#define SRC_BLOCKS 12
#define DST_BLOCKS 16
#define SENTINEL 0xEE
#define WAIT_MS 90000

static const int32_t SRC_PUSH[NBLK] = {3, 4, 5, 0, 11};
static const int32_t PUSH_DST[NBLK] = {9, 10, 11, 2, 6};
static const int32_t SRC_PULL[NBLK] = {7, 1, 2, 8, 9};
static const int32_t PULL_DST[NBLK] = {0, 13, 14, 4, 15};

/* The shape both sides share: vLLM NHD, bf16, 16-token blocks, 2 KV heads of
 * 64. Only num_blocks and the addresses differ. */
static void layout_json(char *buf, size_t n, int blocks, const unsigned char *base, uint64_t layer_bytes) {
    int k = snprintf(buf, n,
                     "{\"format\":\"vllm\",\"order\":\"NHD\",\"dtype\":\"bf16\",\"num_blocks\":%d,"
                     "\"block_size\":16,\"num_heads\":2,\"head_dim\":64",
                     blocks);
    if (base != NULL) {
        k += snprintf(buf + k, n - k, ",\"bases\":[");
        for (int l = 0; l < LAYERS; l++)
            k += snprintf(buf + k, n - k, "%s%" PRIu64, l ? "," : "", (uint64_t)(uintptr_t)base + l * layer_bytes);
        k += snprintf(buf + k, n - k, "]");
    }
    snprintf(buf + k, n - k, "}");
}

/* cache allocates and registers a cache of `blocks` blocks; *layout gets its
 * handle, *layer_bytes and *block_bytes its sizes. */
static unsigned char *cache(te_engine_t e, int blocks, te_layout_t *layout, uint64_t *layer_bytes,
                            uint64_t *block_bytes) {
    char json[1024];
    layout_json(json, sizeof json, blocks, NULL, 0);
    if (te_layout_bytes(json, block_bytes, layer_bytes) != 0) {
        fprintf(stderr, "layout bytes: %s\n", tu_last());
        return NULL;
    }
    unsigned char *p = mmap(NULL, LAYERS * *layer_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
    layout_json(json, sizeof json, blocks, p, *layer_bytes);
    if (te_layout_create(json, layout) != 0) {
        fprintf(stderr, "layout create: %s\n", tu_last());
        return NULL;
    }
    te_span_t spans[LAYERS * 2];
    size_t count = 0;
    CHECK_OK(te_layout_regions(*layout, spans, LAYERS * 2, &count));
    CHECK(count == LAYERS);
    te_region_t regs[LAYERS * 2];
    for (size_t i = 0; i < count && i < LAYERS * 2; i++)
        regs[i] = (te_region_t){(void *)(uintptr_t)spans[i].addr, spans[i].length, "cpu", 1, 0};
    if (te_register_batch(e, regs, count) != 0) {
        fprintf(stderr, "register: %s\n", tu_last());
        return NULL;
    }
    return p;
}

static const char *force; /* argv[2]: the transport both engines must use */

static te_engine_t engine(void) {
    te_config_t cfg = TE_CONFIG_INIT;
    cfg.force_transport = force;
    cfg.listen_addr = "127.0.0.1:0";
    cfg.hostname = "127.0.0.1";
    cfg.rpc_timeout_ms = 10000;
    cfg.transfer_timeout_ms = 60000;
    te_engine_t e = 0;
    if (te_create(&cfg, &e) != 0) fprintf(stderr, "create: %s\n", tu_last());
    return e;
}

/* ---- prefill ------------------------------------------------------------ */

static int prefill(void) {
    te_engine_t e = engine();
    if (!e) return 1;
    te_layout_t layout;
    uint64_t lb, bb;
    unsigned char *c = cache(e, SRC_BLOCKS, &layout, &lb, &bb);
    if (!c) return 1;
    /* Layer l holds stream l of the pattern, K and V and every block. */
    for (int l = 0; l < LAYERS; l++) tu_fill(c + l * lb, lb, 100 + l);

    char line[1024], sidecar[256], suffix[64], peer[256];
    if (!fgets(line, sizeof line, stdin) || sscanf(line, "GO %255s %63s %255s", sidecar, suffix, peer) != 3) {
        fprintf(stderr, "prefill: no GO from decode\n");
        return 1;
    }
    te_handoff_t client;
    CHECK_OK(te_handoff_create(e, sidecar, &client));
    char id[128];
    /* An application notification to decode, queued there before any
     * handoff completion: decode's handoff client reads it along with them
     * and must hand it to te_notify_drain. */
    CHECK_OK(te_notify_send(e, peer, "app", "from prefill", 12));

    /* Push: send the first layers one by one, as a model computes them,
     * then the rest and wait. */
    te_xfer_t x = 0;
    snprintf(id, sizeof id, "push-%s", suffix);
    CHECK_OK(te_handoff_ready(client, id, layout, SRC_PUSH, NBLK, TE_HANDOFF_MODE_DEFAULT, 60000, &x));
    for (int l = 0; l < LAYERS - 1; l++) CHECK_OK(te_handoff_send_layer(x, l, WAIT_MS));
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_handoff_send_layer(x, 0, WAIT_MS)); /* sent before */
    te_handoff_result_t r = {.size = sizeof r};
    CHECK_OK(te_handoff_send(x, WAIT_MS, &r));
    CHECK(r.mover == 1 && r.mode == TE_HANDOFF_MODE_PUSH && r.recorded == 1);
    CHECK(r.bytes == (uint64_t)LAYERS * 2 * NBLK * bb);
    CHECK(r.requests > 0 && r.requests <= r.block_requests && r.transport[0] != 0);
    CHECK(force == NULL || strcmp(r.transport, force) == 0);
    printf("prefill push: %" PRIu64 " bytes over %s, %" PRIu64 " requests (%" PRIu64 " before coalescing)\n", r.bytes,
           r.transport, r.requests, r.block_requests);
    te_handoff_status_t st = {.size = sizeof st};
    CHECK_OK(te_handoff_status(x, &st));
    CHECK(st.state == TE_HANDOFF_DONE && st.settled == 1 && st.error == 0);
    CHECK_OK(te_handoff_free(x));

    /* Pull: decode reads; prefill's send waits for decode's completion. */
    snprintf(id, sizeof id, "pull-%s", suffix);
    x = 0;
    CHECK_OK(te_handoff_ready(client, id, layout, SRC_PULL, NBLK, TE_HANDOFF_MODE_PULL, 60000, &x));
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_handoff_send_layer(x, 0, WAIT_MS)); /* pull: prefill sends nothing */
    r = (te_handoff_result_t){.size = sizeof r};
    CHECK_OK(te_handoff_send(x, WAIT_MS, &r));
    CHECK(r.mover == 0 && r.mode == TE_HANDOFF_MODE_PULL);
    CHECK(r.bytes == (uint64_t)LAYERS * 2 * NBLK * bb);
    CHECK_OK(te_handoff_free(x));

    /* Decode aborted this one before prefill declared. */
    snprintf(id, sizeof id, "abort-%s", suffix);
    x = 1;
    CHECK_RC(TE_ERR_CANCELED, te_handoff_ready(client, id, layout, SRC_PUSH, NBLK, TE_HANDOFF_MODE_DEFAULT, 60000, &x));
    CHECK(x == 0);

    /* The source blocks were read, never written. */
    for (int l = 0; l < LAYERS; l++) {
        long long bad = tu_verify(c + l * lb, lb, 100 + l);
        if (bad >= 0) {
            fprintf(stderr, "prefill: layer %d changed at byte %lld\n", l, bad);
            tu_failures++;
        }
    }
    CHECK_OK(te_handoff_destroy(client));
    CHECK_OK(te_layout_free(layout));
    CHECK_OK(te_destroy(e));
    return tu_done("handoff prefill");
}

/* ---- te-sidecar ---------------------------------------------------------- */

struct sidecar {
    pid_t pid;
    FILE *log;
    pthread_t drain;
    char addr[128];
};

/* drain copies the sidecar's log past the "serving" line to stderr, minus
 * info lines, so that the pipe never fills and warnings still show. */
static void *drain(void *arg) {
    struct sidecar *s = arg;
    char line[4096];
    while (fgets(line, sizeof line, s->log))
        if (!strstr(line, "level=INFO") && !strstr(line, "level=DEBUG")) fprintf(stderr, "te-sidecar: %s", line);
    return NULL;
}

static int start_sidecar(const char *bin, struct sidecar *s) {
    int fds[2];
    if (pipe(fds) != 0) return -1;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fds[1], 2);
    posix_spawn_file_actions_addclose(&fa, fds[0]);
    char *argv[] = {(char *)bin, "-addr", "127.0.0.1:0", "-log-level", "info", "-log-format", "text", NULL};
    int err = posix_spawn(&s->pid, bin, &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    close(fds[1]);
    if (err != 0) {
        fprintf(stderr, "spawning %s: %s\n", bin, strerror(err));
        close(fds[0]);
        return -1;
    }
    s->log = fdopen(fds[0], "r");
    char line[4096];
    /* The sidecar logs "msg=serving ... addr=127.0.0.1:PORT" once it
     * listens; EOF means it exited. */
    while (fgets(line, sizeof line, s->log)) {
        char *a = strstr(line, " addr=");
        if (strstr(line, "msg=serving") && a && sscanf(a, " addr=%127s", s->addr) == 1) {
            pthread_create(&s->drain, NULL, drain, s);
            return 0;
        }
        if (!strstr(line, "level=INFO")) fprintf(stderr, "te-sidecar: %s", line);
    }
    fprintf(stderr, "te-sidecar exited before serving\n");
    return -1;
}

static int reap(pid_t pid, int seconds) {
    int status = 0;
    for (int i = 0; i < seconds * 20; i++) {
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        if (r < 0 && errno != EINTR) return -1;
        struct timespec ts = {0, 50 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    return -2;
}

/* ---- decode -------------------------------------------------------------- */

static void expect_block(const unsigned char *dst, const unsigned char *want, uint64_t n, const char *what, int l,
                         int c, int b) {
    for (uint64_t i = 0; i < n; i++) {
        if (dst[i] != want[i]) {
            fprintf(stderr, "decode: %s: layer %d %s block %d differs at byte %" PRIu64 "\n", what, l, c ? "V" : "K", b,
                    i);
            tu_failures++;
            return;
        }
    }
}

int main(int argc, char **argv) {
    signal(SIGPIPE, SIG_IGN);
    if (argc >= 3) force = argv[2];
    if (argc >= 2 && strcmp(argv[1], "prefill") == 0) return prefill();
    if (argc < 2) {
        fprintf(stderr, "usage: %s <te-sidecar binary>\n", argv[0]);
        return 2;
    }
    struct sidecar sc = {0};
    if (start_sidecar(argv[1], &sc) != 0) return 1;

    /* Prefill starts before this process creates its engine (no fork after
     * a Go runtime exists); it waits for GO on its stdin. */
    int in[2];
    if (pipe(in) != 0) return 1;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, in[0], 0);
    posix_spawn_file_actions_addclose(&fa, in[1]);
    char *pargv[] = {argv[0], "prefill", (char *)force, NULL};
    pid_t child;
    int err = posix_spawn(&child, argv[0], &fa, NULL, pargv, environ);
    posix_spawn_file_actions_destroy(&fa);
    close(in[0]);
    if (err != 0) {
        fprintf(stderr, "spawning prefill: %s\n", strerror(err));
        return 1;
    }
    FILE *to = fdopen(in[1], "w");

    te_engine_t e = engine();
    if (!e) return 1;
    te_layout_t layout;
    uint64_t lb, bb;
    unsigned char *c = cache(e, DST_BLOCKS, &layout, &lb, &bb);
    if (!c) return 1;
    memset(c, SENTINEL, LAYERS * lb);

    te_handoff_t client;
    CHECK_OK(te_handoff_create(e, sc.addr, &client));
    char suffix[32], id[128];
    snprintf(suffix, sizeof suffix, "%d", (int)getpid());

    te_xfer_t push = 0, pull = 0, ab = 0;
    snprintf(id, sizeof id, "push-%s", suffix);
    CHECK_OK(te_handoff_expect(client, id, layout, PUSH_DST, NBLK, TE_HANDOFF_MODE_PUSH, 60000, &push));
    snprintf(id, sizeof id, "pull-%s", suffix);
    CHECK_OK(te_handoff_expect(client, id, layout, PULL_DST, NBLK, TE_HANDOFF_MODE_PULL, 60000, &pull));
    /* The same id twice is refused. */
    te_xfer_t dup = 1;
    CHECK(te_handoff_expect(client, id, layout, PULL_DST, NBLK, TE_HANDOFF_MODE_PULL, 60000, &dup) < 0 && dup == 0);

    /* Expected, then given up before prefill declares: settled at once. */
    snprintf(id, sizeof id, "abort-%s", suffix);
    CHECK_OK(te_handoff_expect(client, id, layout, PUSH_DST, NBLK, TE_HANDOFF_MODE_DEFAULT, 60000, &ab));
    te_handoff_status_t st = {.size = sizeof st};
    CHECK_OK(te_handoff_status(ab, &st));
    CHECK(st.state == TE_HANDOFF_WAITING && st.settled == 0);
    CHECK_OK(te_handoff_abort(ab, "decode gave up"));
    st = (te_handoff_status_t){.size = sizeof st};
    CHECK_OK(te_handoff_status(ab, &st));
    CHECK(st.state == TE_HANDOFF_ABORTED && st.error == TE_ERR_CANCELED && st.settled == 1);
    CHECK(strstr(st.reason, "decode gave up") != NULL);
    te_handoff_result_t r = {0};
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_handoff_wait(ab, 1000, &r)); /* size not set */
    st = (te_handoff_status_t){0};
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_handoff_status(ab, &st));
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_handoff_status(ab, NULL));
    r.size = sizeof r;
    CHECK_RC(TE_ERR_CANCELED, te_handoff_wait(ab, 1000, &r));
    CHECK_OK(te_handoff_free(ab));
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_handoff_free(ab));

    /* Nothing paired yet: a short wait times out and the transfer goes on. */
    CHECK_RC(TE_ERR_TIMEOUT, te_handoff_wait(push, 50, NULL));

    char self[256];
    CHECK_OK(te_segment_name(e, self, sizeof self));
    fprintf(to, "GO %s %s %s\n", sc.addr, suffix, self);
    fflush(to);

    r = (te_handoff_result_t){.size = sizeof r};
    CHECK_OK(te_handoff_wait(push, WAIT_MS, &r));
    CHECK(r.mover == 0 && r.mode == TE_HANDOFF_MODE_PUSH && r.bytes == (uint64_t)LAYERS * 2 * NBLK * bb);
    r = (te_handoff_result_t){.size = sizeof r};
    CHECK_OK(te_handoff_wait(pull, WAIT_MS, &r));
    CHECK(r.mover == 1 && r.mode == TE_HANDOFF_MODE_PULL && r.bytes == (uint64_t)LAYERS * 2 * NBLK * bb);
    CHECK(r.requests > 0 && r.requests <= r.block_requests && r.transport[0] != 0);
    CHECK(force == NULL || strcmp(r.transport, force) == 0);
    printf("decode pull: %" PRIu64 " bytes over %s, %" PRIu64 " requests (%" PRIu64 " before coalescing)\n", r.bytes,
           r.transport, r.requests, r.block_requests);
    /* The waits read the engine's notifications; the application's one is
     * still there for te_notify_drain. */
    te_notify_t *list = NULL;
    size_t nn = 0;
    CHECK_OK(te_notify_drain(e, &list, &nn));
    int app = 0;
    for (size_t i = 0; i < nn; i++)
        if (strcmp(list[i].name, "app") == 0 && list[i].msg_len == 12 && memcmp(list[i].msg, "from prefill", 12) == 0)
            app++;
        else
            fprintf(stderr, "decode: unexpected notification %s\n", list[i].name);
    CHECK(app == 1 && nn == 1);
    CHECK_OK(te_notify_free(list));
    /* A finished transfer cannot be aborted. */
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_handoff_abort(pull, "too late"));
    CHECK_OK(te_handoff_free(push));
    CHECK_OK(te_handoff_free(pull));

    int prc = reap(child, 120);
    fclose(to);
    if (prc != 0) {
        fprintf(stderr, "prefill exited with %d\n", prc);
        tu_failures++;
    }

    /* Every byte: destination blocks hold the source blocks of the same
     * layer and component, the others still hold the sentinel. */
    unsigned char *sent = malloc(bb);
    memset(sent, SENTINEL, bb);
    const uint64_t src_comp = (uint64_t)SRC_BLOCKS * bb, dst_comp = (uint64_t)DST_BLOCKS * bb;
    for (int l = 0; l < LAYERS; l++) {
        /* The prefill cache's layer l, rebuilt here. */
        unsigned char *src = malloc(2 * src_comp);
        tu_fill(src, 2 * src_comp, 100 + l);
        for (int comp = 0; comp < 2; comp++) {
            for (int b = 0; b < DST_BLOCKS; b++) {
                const unsigned char *dst = c + l * lb + comp * dst_comp + b * bb;
                const unsigned char *exp = sent;
                const char *what = "untouched";
                for (int i = 0; i < NBLK; i++) {
                    if (PUSH_DST[i] == b) exp = src + comp * src_comp + SRC_PUSH[i] * bb, what = "push";
                    if (PULL_DST[i] == b) exp = src + comp * src_comp + SRC_PULL[i] * bb, what = "pull";
                }
                expect_block(dst, exp, bb, what, l, comp, b);
            }
        }
        free(src);
    }
    free(sent);

    CHECK_OK(te_handoff_destroy(client));
    CHECK_OK(te_layout_free(layout));
    CHECK_OK(te_destroy(e));
    kill(sc.pid, SIGTERM);
    if (reap(sc.pid, 30) != 0) {
        fprintf(stderr, "te-sidecar did not exit cleanly\n");
        tu_failures++;
    }
    pthread_join(sc.drain, NULL);
    return tu_done("handoff decode");
}
