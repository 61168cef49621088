/* lifecycle checks two promises of te.h:
 *
 *  - te_last_error is per thread: 10,000 threads (run in bounded waves),
 *    each failing with its own message while the others of its wave fail
 *    too, each read back their own message;
 *  - te_destroy frees the engine's batches: their eventfds (te_batch_fd),
 *    like every other descriptor of the engine, are closed, so the process
 *    has the same open descriptors before and after (counted in
 *    /proc/self/fd), and the batch handles are invalid afterwards. */
#include <dirent.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>

#include "testutil.h"

#define THREADS 10000
#define WAVE 100 /* threads alive at once */

static pthread_barrier_t wave_barrier;

struct arg {
    int index;
    int ok;
};

/* A made-up engine handle per thread: te_destroy refuses it and the message
 * names it, so each thread knows the message it must read back. */
static te_engine_t handle_of(int i) { return (te_engine_t)1 << 56 | (te_engine_t)(0x7000000 + i); }

static void *fail_and_read(void *p) {
    struct arg *a = p;
    char want[64], got[512];
    snprintf(want, sizeof want, "%#" PRIx64, (uint64_t)handle_of(a->index));
    int rc = te_destroy(handle_of(a->index));
    /* Every thread of the wave has failed before any reads back. */
    pthread_barrier_wait(&wave_barrier);
    int lrc = te_last_error(got, sizeof got);
    a->ok = rc == TE_ERR_INVALID_ARGUMENT && lrc == 0 && strstr(got, want) != NULL;
    if (!a->ok) fprintf(stderr, "thread %d: rc %d, te_last_error %d: %s (want %s)\n", a->index, rc, lrc, got, want);
    return NULL;
}

static void test_last_error_per_thread(void) {
    static struct arg args[THREADS];
    pthread_t th[WAVE];
    int bad = 0;
    for (int base = 0; base < THREADS; base += WAVE) {
        CHECK(pthread_barrier_init(&wave_barrier, NULL, WAVE) == 0);
        for (int i = 0; i < WAVE; i++) {
            args[base + i].index = base + i;
            if (pthread_create(&th[i], NULL, fail_and_read, &args[base + i]) != 0) {
                fprintf(stderr, "pthread_create failed at thread %d\n", base + i);
                exit(1); /* the barrier would wait forever */
            }
        }
        for (int i = 0; i < WAVE; i++) {
            pthread_join(th[i], NULL);
            bad += !args[base + i].ok;
        }
        pthread_barrier_destroy(&wave_barrier);
    }
    CHECK(bad == 0);
    printf("last error: %d threads, %d saw another's message or none\n", THREADS, bad);
}

static int open_fds(void) {
    DIR *d = opendir("/proc/self/fd");
    int n = 0;
    if (d == NULL) return -1;
    while (readdir(d) != NULL) n++;
    closedir(d);
    return n - 3; /* ".", ".." and the directory's own descriptor */
}

/* engine_with_batches creates an engine with batches that hold eventfds,
 * one of them after a transfer, and returns it without freeing them. */
static te_engine_t engine_with_batches(te_batch_t *bs, int n, unsigned char *buf) {
    te_config_t cfg = TE_CONFIG_INIT;
    cfg.listen_addr = "127.0.0.1:0";
    te_engine_t e = 0;
    te_segment_t s = 0;
    char name[256];
    CHECK_OK(te_create(&cfg, &e));
    CHECK_OK(te_segment_name(e, name, sizeof name));
    CHECK_OK(te_register(e, buf, 8192, "cpu", 1));
    CHECK_OK(te_open_segment(e, name, &s));
    for (int i = 0; i < n; i++) {
        int32_t fd = -1;
        CHECK_OK(te_allocate_batch(e, 1, &bs[i]));
        CHECK_OK(te_batch_fd(bs[i], &fd));
        CHECK(fd >= 0);
    }
    te_request_t r = {TE_WRITE, 0, buf, s, (uint64_t)(uintptr_t)(buf + 4096), 4096};
    CHECK_OK(te_submit(bs[0], &r, 1));
    CHECK_OK(te_wait(bs[0], 10000, NULL));
    return e;
}

static void test_destroy_frees_batches(void) {
    enum { N = 16 };
    te_batch_t bs[N];
    unsigned char *buf = mmap(NULL, 8192, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(buf != MAP_FAILED);
    /* A first engine opens what the runtime keeps for the process (its
     * poller); only then is the count the baseline. */
    CHECK_OK(te_destroy(engine_with_batches(bs, N, buf)));
    int before = open_fds();
    for (int round = 0; round < 3; round++) {
        te_engine_t e = engine_with_batches(bs, N, buf);
        CHECK(open_fds() >= before + N); /* the eventfds are there */
        CHECK_OK(te_destroy(e));
        for (int i = 0; i < N; i++) CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_free_batch(bs[i]));
    }
    int after = open_fds();
    if (after != before) fprintf(stderr, "open descriptors: %d before, %d after\n", before, after);
    CHECK(after == before);
    printf("destroy: %d descriptors before and %d after 3 engines with %d batches each\n", before, after, N);
    munmap(buf, 8192);
}

int main(void) {
    test_last_error_per_thread();
    test_destroy_frees_batches();
    return tu_done("lifecycle");
}
