/* transfer.c: te's C ABI in one program. Two engines (a prefill and a decode,
 * as two processes would have) register memory; prefill opens decode's
 * segment and WRITEs four 64 KiB "KV blocks" into it over tcp with one
 * batch, with a notification that decode receives once the bytes are there.
 * Then it prints the version, the counters and a few metric lines.
 *
 * Every te function returns 0 or a negative TE_ERR_* code; te_last_error
 * says why. Build: examples/c/CMakeLists.txt (find_package(te)), or
 *   cc transfer.c $(pkg-config --cflags --libs te) -Wl,-rpath,$(pkg-config --variable=libdir te)
 */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS under -std=c11 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include <te.h>

#define CHECK(call)                                                            \
    do {                                                                       \
        int rc_ = (call);                                                      \
        if (rc_ != 0) {                                                        \
            char msg_[512];                                                    \
            te_last_error(msg_, sizeof msg_);                                  \
            fprintf(stderr, "%s failed: %d: %s\n", #call, rc_, msg_);          \
            exit(1);                                                           \
        }                                                                      \
    } while (0)

enum { BLOCK = 64 << 10, BLOCKS = 8 };

static te_engine_t start_engine(void) {
    te_config_t cfg = TE_CONFIG_INIT;
    cfg.listen_addr = "127.0.0.1:0"; /* loopback, a free port */
    cfg.force_transport = "tcp";     /* the network path, even within one process */
    te_engine_t e;
    CHECK(te_create(&cfg, &e));
    return e;
}

int main(void) {
    char version[64];
    CHECK(te_version(version, sizeof version));
    printf("te %s (ABI %d.%d)\n", version, te_abi_version() >> 16, te_abi_version() & 0xffff);

    te_engine_t prefill = start_engine(), decode = start_engine();
    size_t n = (size_t)BLOCK * BLOCKS;
    unsigned char *src = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    unsigned char *dst = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (src == MAP_FAILED || dst == MAP_FAILED) return 1;
    for (size_t i = 0; i < n; i++) src[i] = (unsigned char)(i / BLOCK + 1);
    CHECK(te_register(prefill, src, n, "cpu", 1));
    CHECK(te_register(decode, dst, n, "cpu", 1));

    char decode_name[256];
    te_segment_t seg;
    CHECK(te_segment_name(decode, decode_name, sizeof decode_name));
    CHECK(te_open_segment(prefill, decode_name, &seg));

    /* Prefill's blocks 0..3 go to decode's blocks 4..7. */
    te_request_t reqs[4];
    for (int i = 0; i < 4; i++) {
        te_request_t r = {TE_WRITE, 0, src + (size_t)i * BLOCK, seg, (uint64_t)(uintptr_t)(dst + (size_t)(4 + i) * BLOCK),
                          BLOCK};
        reqs[i] = r;
    }
    te_batch_t b;
    te_batch_status_t st;
    CHECK(te_allocate_batch(prefill, 4, &b));
    CHECK(te_submit_with_notify(b, reqs, 4, decode_name, "kv-ready", "req-1", 5));
    CHECK(te_wait(b, 30000, &st));
    printf("prefill: %llu bytes in %llu tasks\n", (unsigned long long)st.transferred, (unsigned long long)st.completed);
    CHECK(te_free_batch(b));

    /* The notification was delivered before te_wait returned. */
    te_notify_t *notes;
    size_t count;
    CHECK(te_notify_drain(decode, &notes, &count));
    int ok = count == 1 && strcmp(notes[0].name, "kv-ready") == 0;
    te_notify_free(notes);
    for (int i = 0; i < 4; i++) ok = ok && memcmp(dst + (size_t)(4 + i) * BLOCK, src + (size_t)i * BLOCK, BLOCK) == 0;
    printf("decode: notified and every byte correct: %s\n", ok ? "yes" : "NO");

    /* Metrics in Prometheus's text format: ask the size, then fill. */
    size_t need = 0;
    te_metrics(prefill, NULL, 0, &need);
    char *text = malloc(need + 4096);
    CHECK(te_metrics(prefill, text, need + 4096, NULL));
    char *line = strstr(text, "te_tasks_total{state=\"completed\"}");
    if (line) printf("prefill metrics: %.*s\n", (int)strcspn(line, "\n"), line);
    free(text);

    CHECK(te_close_segment(seg));
    CHECK(te_destroy(prefill));
    CHECK(te_destroy(decode));
    munmap(src, n);
    munmap(dst, n);
    puts(ok ? "transfer_c: ok" : "transfer_c: FAILED");
    return ok ? 0 : 1;
}
