/* torture: te.h's batch calls are thread-safe, against each other and
 * against te_destroy, through the C ABI alone.
 *
 * One engine moves bytes within its own segment (the local transport).
 * Submitter threads allocate batches, submit, cancel, wait, reset and free
 * them as fast as they can; poller threads call te_task_status and
 * te_batch_status on those handles (live ones, and ones just reset or freed,
 * whose slots already serve another batch) at random; at the end te_destroy
 * runs while all of it is still going. Every call must return 0 or a
 * documented error, never TE_ERR_INTERNAL (a recovered panic) nor a task of
 * another batch: submitter k's task i is always 4096*k + 64*(i+1) bytes
 * long, so a completed task of another batch shows in its length.
 *
 *   TE_TORTURE_TIME   how long before te_destroy (a Go duration: 500ms, 2s,
 *                     1m; default 2s)
 *   TE_TORTURE_SEED   seed of the threads' choices (default: the clock);
 *                     printed */
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "testutil.h"

#define SUBMITTERS 3
#define POLLERS 3
#define SLOTS 8 /* handles remembered per submitter */
#define CAP 8
#define BUF (1u << 20)

static te_engine_t engine;
static te_segment_t seg;
static unsigned char *buf;
static _Atomic uint64_t handles[SUBMITTERS][SLOTS];
static atomic_int stop;
static atomic_long ops, bad, internal, completed_seen, invalid_seen;
static pthread_mutex_t report_mu = PTHREAD_MUTEX_INITIALIZER;

static void report(const char *msg) {
    pthread_mutex_lock(&report_mu);
    if (atomic_fetch_add(&bad, 1) < 10) fprintf(stderr, "torture: %s\n", msg);
    pthread_mutex_unlock(&report_mu);
}

#define REPORT(...)                                  \
    do {                                             \
        char m_[2048];                               \
        snprintf(m_, sizeof m_, __VA_ARGS__);        \
        report(m_);                                  \
    } while (0)

/* rc must be 0 or one of the errors a call racing reset, free or destroy
 * may give. */
static int ok_rc(int rc) {
    if (rc == TE_ERR_INTERNAL) atomic_fetch_add(&internal, 1);
    return rc == 0 || rc == TE_ERR_INVALID_ARGUMENT || rc == TE_ERR_BATCH_BUSY || rc == TE_ERR_CLOSED ||
           rc == TE_ERR_TIMEOUT || rc == TE_ERR_CANCELED;
}

static uint64_t task_len(int k, size_t i) { return 4096u * (uint64_t)k + 64u * (uint64_t)(i + 1); }

struct sub {
    int k;
    unsigned seed;
};

static void *submitter(void *p) {
    struct sub *s = p;
    unsigned r = s->seed;
    int slot = 0;
    unsigned char *local = buf + (size_t)s->k * (BUF / 4); /* its own quarter */
    while (!atomic_load(&stop)) {
        te_batch_t b;
        size_t cap = 1 + rand_r(&r) % CAP;
        int rc = te_allocate_batch(engine, cap, &b);
        if (rc != 0) {
            if (!ok_rc(rc)) REPORT("allocate batch: rc %d: %s", rc, tu_last());
            break; /* te_destroy ran */
        }
        atomic_store(&handles[s->k][slot], b);
        slot = (slot + 1) % SLOTS;
        for (int round = 0; round < 3 && !atomic_load(&stop); round++) {
            te_request_t reqs[CAP];
            size_t n = 1 + rand_r(&r) % cap;
            for (size_t i = 0; i < n; i++) {
                uint64_t len = task_len(s->k, i);
                te_request_t q = {rand_r(&r) % 2 ? TE_READ : TE_WRITE, 0, local + i * 8192, seg,
                                  (uint64_t)(uintptr_t)(buf + 3 * (BUF / 4) + i * 8192), len};
                reqs[i] = q;
            }
            rc = te_submit(b, reqs, n);
            atomic_fetch_add(&ops, 1);
            if (rc != 0) {
                if (!ok_rc(rc)) REPORT("submit: rc %d: %s", rc, tu_last());
                break;
            }
            if (rand_r(&r) % 4 == 0) {
                rc = te_batch_cancel(b);
                if (!ok_rc(rc)) REPORT("cancel: rc %d: %s", rc, tu_last());
            }
            te_batch_status_t st;
            rc = te_wait(b, 10000, &st);
            if (rc != 0 && !ok_rc(rc)) REPORT("wait: rc %d: %s", rc, tu_last());
            rc = te_batch_reset(b);
            atomic_fetch_add(&ops, 2);
            if (rc != 0) {
                if (!ok_rc(rc)) REPORT("reset: rc %d: %s", rc, tu_last());
                break;
            }
        }
        rc = te_free_batch(b);
        atomic_fetch_add(&ops, 1);
        if (!ok_rc(rc)) REPORT("free: rc %d: %s", rc, tu_last());
    }
    return NULL;
}

static void *poller(void *p) {
    unsigned r = *(unsigned *)p;
    while (!atomic_load(&stop)) {
        int k = rand_r(&r) % SUBMITTERS;
        te_batch_t b = atomic_load(&handles[k][rand_r(&r) % SLOTS]);
        if (b == 0) continue;
        size_t i = rand_r(&r) % (CAP + 1);
        te_task_status_t ts;
        memset(&ts, 0x5A, sizeof ts);
        int rc = te_task_status(b, i, &ts);
        atomic_fetch_add(&ops, 1);
        if (rc == TE_ERR_INVALID_ARGUMENT) {
            atomic_fetch_add(&invalid_seen, 1);
            if (ts.state != TE_TASK_INVALID) REPORT("task status refused with state %d: %s", (int)ts.state, tu_last());
        } else if (rc != 0) {
            REPORT("task status of index %zu: rc %d: %s", i, rc, tu_last());
        } else if (ts.state == TE_TASK_COMPLETED) {
            atomic_fetch_add(&completed_seen, 1);
            if (ts.transferred != task_len(k, i) || strcmp(ts.transport, "local") != 0)
                REPORT("a task read through a batch handle is another batch's: %" PRIu64 " bytes over %.16s, want %" PRIu64
                       " over local",
                       (uint64_t)ts.transferred, ts.transport, task_len(k, i));
        } else if (ts.state != TE_TASK_PENDING && ts.state != TE_TASK_CANCELED && ts.state != TE_TASK_FAILED &&
                   ts.state != TE_TASK_TIMEOUT) {
            REPORT("task status: state %d at index %zu", (int)ts.state, i);
        }
        te_batch_status_t st;
        rc = te_batch_status(b, &st);
        if (!ok_rc(rc)) REPORT("batch status: rc %d: %s", rc, tu_last());
        if (rc == 0 && st.completed + st.failed > st.tasks)
            REPORT("batch status: %" PRIu64 " tasks ended of %" PRIu64, (uint64_t)(st.completed + st.failed),
                   (uint64_t)st.tasks);
    }
    return NULL;
}

/* duration parses a Go-style duration ("500ms", "2s", "1m") in ms. */
static long duration_ms(const char *s, long def) {
    if (!s || !*s) return def;
    char *end;
    double v = strtod(s, &end);
    if (end == s || v <= 0) return def;
    if (strcmp(end, "ms") == 0) return (long)v;
    if (strcmp(end, "s") == 0 || *end == 0) return (long)(v * 1000);
    if (strcmp(end, "m") == 0) return (long)(v * 60000);
    return def;
}

int main(void) {
    long ms = duration_ms(getenv("TE_TORTURE_TIME"), 2000);
    const char *seedv = getenv("TE_TORTURE_SEED");
    unsigned seed = seedv && *seedv ? (unsigned)strtoul(seedv, NULL, 10) : (unsigned)time(NULL) ^ (unsigned)getpid();
    printf("torture: seed %u, %ld ms (TE_TORTURE_SEED=%u replays the choices)\n", seed, ms, seed);
    te_config_t cfg = TE_CONFIG_INIT;
    cfg.listen_addr = "127.0.0.1:0";
    cfg.transports = "local";
    char name[256];
    buf = mmap(NULL, BUF, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (buf == MAP_FAILED) return 1;
    CHECK_OK(te_create(&cfg, &engine));
    CHECK_OK(te_segment_name(engine, name, sizeof name));
    CHECK_OK(te_register(engine, buf, BUF, "cpu", 1));
    CHECK_OK(te_open_segment(engine, name, &seg));
    if (tu_failures) return tu_done("torture");

    pthread_t subs[SUBMITTERS], polls[POLLERS];
    struct sub sargs[SUBMITTERS];
    unsigned pseeds[POLLERS];
    for (int k = 0; k < SUBMITTERS; k++) {
        sargs[k].k = k;
        sargs[k].seed = seed + 7919u * (unsigned)(k + 1);
        CHECK(pthread_create(&subs[k], NULL, submitter, &sargs[k]) == 0);
    }
    for (int k = 0; k < POLLERS; k++) {
        pseeds[k] = seed + 104729u * (unsigned)(k + 1);
        CHECK(pthread_create(&polls[k], NULL, poller, &pseeds[k]) == 0);
    }
    struct timespec d = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&d, NULL);
    /* Destroy the engine under everyone's feet. */
    int rc = te_destroy(engine);
    if (rc != 0) {
        fprintf(stderr, "te_destroy with batch calls racing it: rc %d: %s\n", rc, tu_last());
        tu_failures++;
    }
    struct timespec after = {0, 200 * 1000000L};
    nanosleep(&after, NULL); /* the threads' calls now meet invalid handles */
    atomic_store(&stop, 1);
    for (int k = 0; k < SUBMITTERS; k++) pthread_join(subs[k], NULL);
    for (int k = 0; k < POLLERS; k++) pthread_join(polls[k], NULL);
    printf("torture: %ld calls; %ld completed tasks read back, %ld refused statuses (reset, freed or destroyed)\n",
           atomic_load(&ops), atomic_load(&completed_seen), atomic_load(&invalid_seen));
    if (atomic_load(&internal) > 0) {
        fprintf(stderr, "torture: %ld calls failed with TE_ERR_INTERNAL (a recovered panic)\n", atomic_load(&internal));
    }
    tu_failures += (int)atomic_load(&bad);
    CHECK(atomic_load(&completed_seen) > 0);
    munmap(buf, BUF);
    return tu_done("torture");
}
