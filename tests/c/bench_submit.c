/* bench_submit: cost of allocate + submit + wait + free of a batch of 128
 * local 4 KiB WRITEs through te.h, per request. The Go benchmark
 * BenchmarkSubmitWait128 (capi/bench_test.go) runs this program and the same
 * loop through the Go API in one run and reports both.
 * Usage: bench_submit [iterations]   prints "ns_per_request <x>". */
#include <stdint.h>
#include <sys/mman.h>
#include <time.h>

#include "testutil.h"

#define REQS 128
#define SIZE 4096

static double now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static int round_trip(te_engine_t e, const te_request_t *reqs) {
    te_batch_t b;
    int rc = te_allocate_batch(e, REQS, &b);
    if (rc == 0) rc = te_submit(b, reqs, REQS);
    if (rc == 0) rc = te_wait(b, -1, NULL);
    int frc = te_free_batch(b);
    return rc ? rc : frc;
}

int main(int argc, char **argv) {
    long iters = argc > 1 ? atol(argv[1]) : 2000;
    if (iters <= 0) iters = 1;
    te_config_t cfg = TE_CONFIG_INIT;
    cfg.listen_addr = "127.0.0.1:0";
    te_engine_t e;
    CHECK_OK(te_create(&cfg, &e));
    unsigned char *mem = mmap(NULL, 2 * REQS * SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(mem != MAP_FAILED);
    char name[256];
    te_segment_t seg = 0;
    CHECK_OK(te_register(e, mem, 2 * REQS * SIZE, "cpu", 1));
    CHECK_OK(te_segment_name(e, name, sizeof name));
    CHECK_OK(te_open_segment(e, name, &seg));
    if (tu_failures) return tu_done("bench_submit");
    te_request_t reqs[REQS];
    for (int i = 0; i < REQS; i++)
        reqs[i] = (te_request_t){TE_WRITE, 0, mem + (size_t)i * SIZE, seg,
                                 (uint64_t)(uintptr_t)(mem + (size_t)(REQS + i) * SIZE), SIZE};
    for (int i = 0; i < 50 && tu_failures == 0; i++) CHECK_OK(round_trip(e, reqs)); /* warm up */
    double t0 = now_ns();
    for (long i = 0; i < iters && tu_failures == 0; i++) CHECK_OK(round_trip(e, reqs));
    double dt = now_ns() - t0;
    /* The fixed cost of one call across the C ABI (cgo transition, panic
     * guard, handle lookup): te_rpc_port, which does nothing else. */
    long calls = iters * 64;
    int32_t port;
    double t1 = now_ns();
    for (long i = 0; i < calls; i++) te_rpc_port(e, &port);
    double dc = now_ns() - t1;
    if (tu_failures == 0)
        printf("ns_per_request %.1f\nns_per_batch %.1f\nns_per_call %.1f\niterations %ld\n", dt / ((double)iters * REQS),
               dt / (double)iters, dc / (double)calls, iters);
    te_close_segment(seg);
    te_unregister(e, mem);
    te_destroy(e);
    munmap(mem, 2 * REQS * SIZE);
    return tu_failures ? tu_done("bench_submit") : 0;
}
