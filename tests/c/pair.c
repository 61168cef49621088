/* pair: two engines of one process move bytes over one forced transport
 * ("local": the registry check and a memcpy; "tcp": loopback sockets) and
 * check every byte, and the library's version and ABI are the ones this
 * program was built for. make test-arm64 builds it with the cross compiler
 * against build/arm64/libte.so and runs it under qemu-user (tests/c/
 * two_process.c is the two-process counterpart).
 *
 * Usage: pair TRANSPORT [VERSION]   VERSION: what te_version must say */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdint.h>
#include <sys/mman.h>

#include "testutil.h"

#define HALF (3u << 20) /* 3 MiB */
#define CHUNK 100003u   /* a prime: no request lands on a power of two */

static te_engine_t start(const char *transport) {
    te_config_t cfg = TE_CONFIG_INIT;
    cfg.listen_addr = "127.0.0.1:0";
    cfg.force_transport = transport;
    cfg.rpc_timeout_ms = 5000;
    cfg.transfer_timeout_ms = 60000; /* qemu-user is several times slower */
    te_engine_t e = 0;
    CHECK_OK(te_create(&cfg, &e));
    return e;
}

/* move runs one batch of op over [0, HALF) in CHUNK pieces: local at l,
 * remote at r. */
static void move(te_engine_t e, te_segment_t seg, int op, unsigned char *l, uint64_t r, const char *notify_to) {
    enum { MAX = HALF / CHUNK + 1 };
    te_request_t reqs[MAX];
    size_t n = 0;
    for (uint64_t off = 0; off < HALF; off += CHUNK) {
        uint64_t len = HALF - off < CHUNK ? HALF - off : CHUNK;
        te_request_t q = {op, 0, l + off, seg, r + off, len};
        reqs[n++] = q;
    }
    te_batch_t b;
    te_batch_status_t st;
    CHECK_OK(te_allocate_batch(e, n, &b));
    if (notify_to)
        CHECK_OK(te_submit_with_notify(b, reqs, n, notify_to, "pair", "done", 4));
    else
        CHECK_OK(te_submit(b, reqs, n));
    CHECK_OK(te_wait(b, 60000, &st));
    CHECK(st.completed == n);
    CHECK(st.transferred == HALF);
    CHECK_OK(te_free_batch(b));
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: pair TRANSPORT [VERSION]\n");
        return 2;
    }
    const char *transport = argv[1];
    char version[128];
    CHECK_OK(te_version(version, sizeof version));
    CHECK(te_abi_version() == TE_ABI_VERSION);
    if (argc > 2 && strcmp(version, argv[2]) != 0) {
        fprintf(stderr, "pair: te_version says %s, want %s\n", version, argv[2]);
        tu_failures++;
    }
    printf("pair: te %s ABI %d.%d over %s\n", version, te_abi_version() >> 16, te_abi_version() & 0xffff, transport);

    te_engine_t init = start(transport), targ = start(transport);
    /* target: [pattern 11 | room for the initiator's]; initiator: [pattern
     * 22 | room for what it reads]. */
    unsigned char *tb = mmap(NULL, 2 * HALF, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    unsigned char *ib = mmap(NULL, 2 * HALF, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (tb == MAP_FAILED || ib == MAP_FAILED) return 1;
    tu_fill(tb, HALF, 11);
    tu_fill(ib, HALF, 22);
    CHECK_OK(te_register(targ, tb, 2 * HALF, "cpu", 1));
    CHECK_OK(te_register(init, ib, 2 * HALF, "cpu", 1));

    char name[256];
    te_segment_t seg = 0;
    CHECK_OK(te_segment_name(targ, name, sizeof name));
    CHECK_OK(te_open_segment(init, name, &seg));
    uint64_t remote = (uint64_t)(uintptr_t)tb;

    move(init, seg, TE_WRITE, ib, remote + HALF, name);  /* initiator's pattern into the target's second half */
    move(init, seg, TE_READ, ib + HALF, remote, NULL); /* the target's pattern into the initiator's second half */
    long long bad = tu_verify(tb + HALF, HALF, 22);
    if (bad >= 0) fprintf(stderr, "pair: written byte %lld wrong\n", bad);
    CHECK(bad < 0);
    bad = tu_verify(ib + HALF, HALF, 11);
    if (bad >= 0) fprintf(stderr, "pair: read byte %lld wrong\n", bad);
    CHECK(bad < 0);

    /* The batch's notification arrived before te_wait returned. */
    te_notify_t *notes = NULL;
    size_t count = 0;
    CHECK_OK(te_notify_drain(targ, &notes, &count));
    CHECK(count == 1 && notes && strcmp(notes[0].name, "pair") == 0);
    te_notify_free(notes);

    CHECK_OK(te_close_segment(seg));
    CHECK_OK(te_unregister(init, ib));
    CHECK_OK(te_unregister(targ, tb));
    CHECK_OK(te_destroy(init));
    CHECK_OK(te_destroy(targ));
    return tu_done("pair");
}
