/* window: requests sent under a window a peer granted (te_submit_windows,
 * ABI 1.4), through te.h alone, over the transport named by argv[1] (tcp, or
 * local: engines of one process).
 *
 * Three engines holding one cluster secret: an owner with a 64 KiB buffer
 * that grants a window over its first 16 KiB to the grantee alone, the
 * grantee, and another engine that learns the key.
 *
 *   1. windows NULL, or all 0, is te_submit: the buffer's own key, the whole
 *      buffer reachable.
 *   2. A WRITE under the window lands, alone and beside a request without a
 *      window in one call; so does one with te_submit_windows_with_notify,
 *      whose notification reaches the owner.
 *   3. A WRITE under the window outside its ranges (past them, or
 *      straddling their end) fails TE_ERR_ACCESS_DENIED and lands nothing.
 *   4. The other engine, with the secret and the key, is refused
 *      (TE_ERR_ACCESS_DENIED) and lands nothing.
 *   5. A key the owner never granted, and the window's once revoked, are
 *      refused and land nothing; the grantee's requests without a window
 *      still go.
 *   6. Bad arguments: NULL requests, n == 0, a NULL notify name. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

#include "testutil.h"

#define SECRET "window.c cluster secret, 32 bytes at least"
#define SIZE (64u << 10)
#define WIN (16u << 10)
#define PIECE 4096u

static const char *transport;

static te_engine_t start(void) {
    te_config_t cfg = TE_CONFIG_INIT;
    cfg.listen_addr = "127.0.0.1:0";
    cfg.hostname = "127.0.0.1";
    cfg.transports = strcmp(transport, "local") == 0 ? "local,tcp" : transport;
    cfg.force_transport = transport;
    cfg.rpc_timeout_ms = 5000;
    cfg.transfer_timeout_ms = 10000;
    cfg.auth_secret = SECRET;
    te_engine_t e = 0;
    if (te_create(&cfg, &e) != 0) {
        fprintf(stderr, "window: create over %s: %s\n", transport, tu_last());
        exit(1);
    }
    return e;
}

static void *map(size_t n) {
    void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        perror("mmap");
        exit(1);
    }
    return p;
}

/* zero reports whether n bytes at p are all 0. */
static int zero(const unsigned char *p, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (p[i]) return 0;
    return 1;
}

/* run submits the n requests with their windows (NULL: none) on a fresh
 * batch of e, waits, and returns te_wait's code; a submit that fails
 * returns its code. Every task that did not complete must carry the batch's
 * code, and the carrying transport must be the one under test. */
static int run(te_engine_t e, const te_request_t *reqs, const uint64_t *windows, size_t n) {
    te_batch_t b = 0;
    CHECK_OK(te_allocate_batch(e, n, &b));
    int rc = te_submit_windows(b, reqs, windows, n);
    if (rc == 0) {
        te_batch_status_t st;
        rc = te_wait(b, 30000, &st);
        CHECK(st.tasks == n);
        CHECK(rc != 0 || (st.state == TE_TASK_COMPLETED && st.completed == n));
        for (size_t i = 0; i < n; i++) {
            te_task_status_t ts;
            CHECK_OK(te_task_status(b, i, &ts));
            if (ts.state == TE_TASK_COMPLETED && strcmp(ts.transport, transport) != 0) {
                fprintf(stderr, "task %zu went over %s, want %s\n", i, ts.transport, transport);
                tu_failures++;
            }
            if (ts.state != TE_TASK_COMPLETED) CHECK(ts.state == TE_TASK_FAILED && ts.error != 0);
        }
    }
    CHECK_OK(te_free_batch(b));
    return rc;
}

static te_request_t wr(unsigned char *src, te_segment_t seg, unsigned char *dst, uint64_t off, uint64_t len) {
    return (te_request_t){TE_WRITE, 0, src + off, seg, (uint64_t)(uintptr_t)dst + off, len};
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: window TRANSPORT (tcp or local)\n");
        return 2;
    }
    transport = argv[1];
    te_engine_t owner = start(), grantee = start(), other = start();
    char oname[256], gname[256];
    CHECK_OK(te_segment_name(owner, oname, sizeof oname));
    CHECK_OK(te_segment_name(grantee, gname, sizeof gname));

    unsigned char *dst = map(SIZE), *src = map(SIZE), *osrc = map(SIZE);
    tu_fill(src, SIZE, 7);
    tu_fill(osrc, SIZE, 9);
    CHECK_OK(te_register(owner, dst, SIZE, "cpu", 1));
    CHECK_OK(te_register(grantee, src, SIZE, "cpu", 0));
    CHECK_OK(te_register(other, osrc, SIZE, "cpu", 0));
    te_range_t wr0 = {(uint64_t)(uintptr_t)dst, WIN};
    uint64_t key = 0;
    CHECK_OK(te_grant_window_to(owner, gname, &wr0, 1, &key));
    CHECK(key != 0);
    te_segment_t gseg = 0, oseg = 0;
    CHECK_OK(te_open_segment(grantee, oname, &gseg));
    CHECK_OK(te_open_segment(other, oname, &oseg));

    /* 1. No windows: te_submit, the whole buffer (past the window too). */
    te_request_t r = wr(src, gseg, dst, WIN, PIECE);
    CHECK_OK(run(grantee, &r, NULL, 1));
    CHECK(memcmp(dst + WIN, src + WIN, PIECE) == 0);
    uint64_t none[2] = {0, 0};
    r = wr(src, gseg, dst, WIN + PIECE, PIECE);
    CHECK_OK(run(grantee, &r, none, 1));
    CHECK(memcmp(dst + WIN + PIECE, src + WIN + PIECE, PIECE) == 0);
    memset(dst, 0, SIZE);

    /* 2. Under the window: it lands; beside a request without one too. */
    r = wr(src, gseg, dst, 0, PIECE);
    CHECK_OK(run(grantee, &r, &key, 1));
    CHECK(memcmp(dst, src, PIECE) == 0);
    te_request_t two[2] = {wr(src, gseg, dst, PIECE, PIECE), wr(src, gseg, dst, 2 * WIN, PIECE)};
    uint64_t mixed[2] = {key, 0};
    CHECK_OK(run(grantee, two, mixed, 2));
    CHECK(memcmp(dst + PIECE, src + PIECE, PIECE) == 0);
    CHECK(memcmp(dst + 2 * WIN, src + 2 * WIN, PIECE) == 0);
    {
        te_batch_t b = 0;
        te_batch_status_t st;
        r = wr(src, gseg, dst, 2 * PIECE, PIECE);
        CHECK_OK(te_allocate_batch(grantee, 1, &b));
        CHECK_OK(te_submit_windows_with_notify(b, &r, &key, 1, oname, "window", "landed", 6));
        CHECK_OK(te_wait(b, 30000, &st));
        CHECK_OK(te_free_batch(b));
        CHECK(memcmp(dst + 2 * PIECE, src + 2 * PIECE, PIECE) == 0);
        te_notify_from_t *from = NULL;
        size_t n = 0;
        CHECK_OK(te_notify_drain_from(owner, &from, &n)); /* the notify was delivered before te_wait returned */
        CHECK(n == 1);
        if (n == 1)
            CHECK(strcmp(from[0].name, "window") == 0 && from[0].msg_len == 6 && memcmp(from[0].msg, "landed", 6) == 0 &&
                  strcmp(from[0].sender, gname) == 0);
        CHECK_OK(te_notify_free((te_notify_t *)from));
    }
    memset(dst, 0, SIZE);

    /* 3. Outside the window's range, under its key: refused, nothing lands. */
    r = wr(src, gseg, dst, WIN, PIECE);
    CHECK_RC(TE_ERR_ACCESS_DENIED, run(grantee, &r, &key, 1));
    r = wr(src, gseg, dst, WIN - PIECE / 2, PIECE);
    CHECK_RC(TE_ERR_ACCESS_DENIED, run(grantee, &r, &key, 1));
    CHECK(zero(dst, SIZE));

    /* 4. Another engine, with the secret and the key: refused. */
    r = wr(osrc, oseg, dst, 0, PIECE);
    CHECK_RC(TE_ERR_ACCESS_DENIED, run(other, &r, &key, 1));
    CHECK(zero(dst, SIZE));

    /* 5. A key never granted, then the window revoked: refused. */
    uint64_t bogus = key ^ 0x5a5a5a5a00000000ull;
    r = wr(src, gseg, dst, 0, PIECE);
    int rc = run(grantee, &r, &bogus, 1);
    CHECK_RC(TE_ERR_ACCESS_DENIED, rc);
    CHECK(zero(dst, SIZE));
    CHECK_OK(te_revoke_window(owner, key));
    rc = run(grantee, &r, &key, 1);
    CHECK_RC(TE_ERR_ACCESS_DENIED, rc);
    CHECK(zero(dst, SIZE));
    CHECK_OK(run(grantee, &r, NULL, 1)); /* the buffer's own key still goes */
    CHECK(memcmp(dst, src, PIECE) == 0);

    /* 6. Bad arguments. */
    {
        te_batch_t b = 0;
        CHECK_OK(te_allocate_batch(grantee, 1, &b));
        CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_submit_windows(b, NULL, &key, 1));
        CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_submit_windows(b, &r, &key, 0));
        CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_submit_windows(0, &r, &key, 1));
        CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_submit_windows_with_notify(b, &r, &key, 1, oname, NULL, NULL, 0));
        CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_submit_windows_with_notify(b, &r, &key, 1, NULL, "n", NULL, 0));
        CHECK_OK(te_free_batch(b));
    }

    CHECK_OK(te_close_segment(gseg));
    CHECK_OK(te_close_segment(oseg));
    CHECK_OK(te_destroy(other));
    CHECK_OK(te_destroy(grantee));
    CHECK_OK(te_destroy(owner));
    return tu_done("window");
}
