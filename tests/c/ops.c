/* ops: te_version and te_metrics (ABI 1.3). te_version must say the version
 * the build stamped (argv[1], when given: the Makefile's TE_VERSION) and
 * start with te.h's ABI version; te_metrics must size, fill and cut the
 * caller's buffer as te.h says, and hold an exposition with HELP and TYPE
 * lines that counts a transfer; te_create must read the environment as it
 * is when called. */
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>

#include "testutil.h"

static void test_version(const char *want) {
    char v[64], small[4], prefix[32];
    CHECK_OK(te_version(v, sizeof v));
    snprintf(prefix, sizeof prefix, "%d.%d.0", TE_ABI_VERSION_MAJOR, TE_ABI_VERSION_MINOR);
    CHECK(strncmp(v, prefix, strlen(prefix)) == 0);
    if (want != NULL && want[0] != 0 && strcmp(v, want) != 0) {
        fprintf(stderr, "te_version says %s, the build stamped %s\n", v, want);
        tu_failures++;
    }
    CHECK_RC(TE_ERR_BUFFER_TOO_SMALL, te_version(small, sizeof small));
    CHECK(small[3] == 0 && strncmp(small, v, 3) == 0);
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_version(NULL, 8));
    printf("te_version: %s\n", v);
}

static void test_metrics(void) {
    te_config_t cfg = TE_CONFIG_INIT;
    cfg.listen_addr = "127.0.0.1:0";
    te_engine_t e = 0;
    CHECK_OK(te_create(&cfg, &e));
    if (e == 0) return;

    /* One local transfer, so the counters have something to say. */
    const uint64_t N = 1 << 16;
    unsigned char *a = mmap(NULL, 2 * N, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(a != MAP_FAILED);
    char name[256];
    te_segment_t seg = 0;
    te_batch_t b = 0;
    CHECK_OK(te_register(e, a, 2 * N, "cpu", 1));
    CHECK_OK(te_segment_name(e, name, sizeof name));
    CHECK_OK(te_open_segment(e, name, &seg));
    CHECK_OK(te_allocate_batch(e, 1, &b));
    te_request_t r = {TE_WRITE, 0, a, seg, (uint64_t)(uintptr_t)(a + N), N};
    CHECK_OK(te_submit(b, &r, 1));
    CHECK_OK(te_wait(b, 30000, NULL));

    /* Ask the size, then fill a buffer of that size. */
    size_t need = 0;
    CHECK_RC(TE_ERR_BUFFER_TOO_SMALL, te_metrics(e, NULL, 0, &need));
    CHECK(need > 100);
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_metrics(e, NULL, 0, NULL));
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_metrics(e, NULL, 10, &need));
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_metrics(0, NULL, 0, &need));
    size_t cap = need + 4096; /* the text may grow between the calls */
    char *text = malloc(cap);
    size_t got = 0;
    CHECK_OK(te_metrics(e, text, cap, &got));
    CHECK(got == strlen(text) + 1);
    CHECK(strstr(text, "# HELP te_tasks_total ") != NULL);
    CHECK(strstr(text, "# TYPE te_tasks_total counter") != NULL);
    CHECK(strstr(text, "te_tasks_total{state=\"completed\"} 1\n") != NULL);
    CHECK(strstr(text, "# TYPE te_task_duration_seconds histogram") != NULL);
    CHECK(strstr(text, "te_task_duration_seconds_count{transport=\"local\",peer=\"same_process\"} 1\n") != NULL);

    /* Cut short: the truncated text, NUL-terminated, and the size needed. */
    char small[64];
    size_t need2 = 0;
    CHECK_RC(TE_ERR_BUFFER_TOO_SMALL, te_metrics(e, small, sizeof small, &need2));
    CHECK(small[sizeof small - 1] == 0 && strlen(small) == sizeof small - 1 && need2 > sizeof small);
    CHECK(strncmp(small, text, sizeof small - 1) == 0);

    free(text);
    CHECK_OK(te_free_batch(b));
    CHECK_OK(te_close_segment(seg));
    CHECK_OK(te_destroy(e));
    munmap(a, 2 * N);
}

/* te_create reads te's variables as the process has them then, not as they
 * were when the library loaded (Go keeps its own copy of the environment). */
static void test_env(void) {
    te_config_t cfg = TE_CONFIG_INIT;
    cfg.listen_addr = "127.0.0.1:0";
    te_engine_t e = 0;
    setenv("TE_MAX_CONNS", "lots", 1);
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_create(&cfg, &e));
    CHECK(strstr(tu_last(), "TE_MAX_CONNS=\"lots\"") != NULL);
    unsetenv("TE_MAX_CONNS");
    CHECK_OK(te_create(&cfg, &e));
    if (e != 0) CHECK_OK(te_destroy(e));
}

int main(int argc, char **argv) {
    test_version(argc > 1 ? argv[1] : NULL);
    test_env();
    test_metrics();
    return tu_done("ops");
}
