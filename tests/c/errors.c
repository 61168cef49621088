/* errors walks every error path of te.h in one process: bad and wrong-kind
 * handles, NULL pointers, zero lengths, overlaps, unregistered addresses,
 * unknown segments, busy and double frees, truncated output, and the
 * per-thread last error. It also does one local transfer so the valid paths
 * next to each error are exercised too. */
#include <poll.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>

#include "testutil.h"

static te_config_t local_config(void) {
    te_config_t cfg = TE_CONFIG_INIT;
    cfg.listen_addr = "127.0.0.1:0";
    cfg.rpc_timeout_ms = 2000;
    return cfg;
}

static void test_library(void) {
    char buf[8];
    CHECK(te_abi_version() == TE_ABI_VERSION);
    CHECK(te_last_error(NULL, 10) == TE_ERR_INVALID_ARGUMENT);
    CHECK(te_last_error(buf, 0) == TE_ERR_INVALID_ARGUMENT);
    /* Provoke a long message, then read it into a small buffer. */
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_destroy(0));
    memset(buf, 'x', sizeof buf);
    CHECK(te_last_error(buf, sizeof buf) == TE_ERR_BUFFER_TOO_SMALL);
    CHECK(buf[sizeof buf - 1] == 0 && strlen(buf) == sizeof buf - 1);
    /* Reading it does not clear it, and a success does not either. */
    CHECK(tu_last()[0] != 0);
}

static void test_create(void) {
    te_engine_t e = 99;
    te_config_t cfg = local_config();
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_create(&cfg, NULL));
    cfg.size = 0;
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_create(&cfg, &e));
    CHECK(e == 0); /* cleared on failure */
    cfg = local_config();
    cfg.params = "no-equals-sign";
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_create(&cfg, &e));
    cfg = local_config();
    cfg.transports = "no-such-transport";
    CHECK_RC(TE_ERR_TRANSPORT_UNAVAILABLE, te_create(&cfg, &e));
    cfg = local_config();
    cfg.log_level = 42;
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_create(&cfg, &e));
    cfg = local_config();
    cfg.listen_addr = "not an address";
    CHECK(te_create(&cfg, &e) < 0);
    /* NULL: every default (listens on 0.0.0.0, a free port). */
    CHECK_OK(te_create(NULL, &e));
    CHECK(e != 0);
    CHECK_OK(te_destroy(e));
    /* An older caller's shorter struct: only size and log_level. */
    cfg = local_config();
    cfg.size = 8;
    cfg.listen_addr = "this is past size and must be ignored";
    CHECK_OK(te_create(&cfg, &e));
    CHECK_OK(te_destroy(e));
    /* A newer caller's longer struct: accepted while the fields this library
     * does not know are zero, refused once one is set. */
    struct {
        te_config_t c;
        uint64_t future;
    } big;
    memset(&big, 0, sizeof big);
    big.c = local_config();
    big.c.size = sizeof big;
    CHECK_OK(te_create(&big.c, &e));
    CHECK_OK(te_destroy(e));
    big.future = 1;
    CHECK_RC(TE_ERR_NOT_SUPPORTED, te_create(&big.c, &e));
    big.c.size = 1 << 20;
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_create(&big.c, &e));
    /* ABI 1.2 fields: set, they are taken; an ABI 1.1 caller's struct ends
     * before them, so whatever lies there is not read. */
    cfg = local_config();
    cfg.auth_secret = "c-test-cluster-secret-0123";
    cfg.unregister_grace_ms = 500;
    cfg.max_conns = 64;
    cfg.max_conns_per_host = 8;
    cfg.idle_timeout_ms = 60000;
    cfg.progress_timeout_ms = 5000;
    cfg.notify_bytes = 1 << 20;
    cfg.notify_bytes_per_sender = 1 << 18;
    CHECK_OK(te_create(&cfg, &e));
    CHECK_OK(te_destroy(e));
    cfg.idle_timeout_ms = -1;
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_create(&cfg, &e));
    cfg.idle_timeout_ms = 0;
    cfg.auth_secret = "too-short"; /* under 16 bytes: refused, never ignored */
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_create(&cfg, &e));
    cfg = local_config();
    cfg.max_conns = -5;
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_create(&cfg, &e));
    cfg.size = (uint32_t)offsetof(te_config_t, auth_secret);
    CHECK_OK(te_create(&cfg, &e));
    CHECK_OK(te_destroy(e));
}

struct thread_arg {
    te_engine_t e;
    int id;
    int bad;
};

/* Each thread makes calls that fail with its own message and checks that
 * te_last_error returns that message, not another thread's. */
static void *error_thread(void *p) {
    struct thread_arg *a = p;
    char name[64], buf[512];
    snprintf(name, sizeof name, "thread-%d-has-no-port", a->id);
    for (int i = 0; i < 200; i++) {
        te_segment_t s;
        if (te_open_segment(a->e, name, &s) != TE_ERR_INVALID_ARGUMENT) a->bad++;
        if (te_last_error(buf, sizeof buf) != 0 || strstr(buf, name) == NULL) a->bad++;
    }
    return NULL;
}

static void test_threads(te_engine_t e) {
    enum { N = 8 };
    pthread_t th[N];
    struct thread_arg args[N];
    for (int i = 0; i < N; i++) {
        args[i] = (struct thread_arg){e, i, 0};
        CHECK(pthread_create(&th[i], NULL, error_thread, &args[i]) == 0);
    }
    for (int i = 0; i < N; i++) {
        pthread_join(th[i], NULL);
        if (args[i].bad) fprintf(stderr, "thread %d saw %d wrong results\n", i, args[i].bad);
        CHECK(args[i].bad == 0);
    }
}

int main(void) {
    test_library();
    test_create();

    te_config_t cfg = local_config();
    te_engine_t e = 0;
    CHECK_OK(te_create(&cfg, &e));
    if (e == 0) return tu_done("errors");
    test_threads(e);

    const uint64_t N = 1 << 20;
    unsigned char *a = mmap(NULL, 2 * N, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    unsigned char *b = mmap(NULL, N, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(a != MAP_FAILED && b != MAP_FAILED);

    /* Bad handles: zero, made up, wrong kind. */
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_register(0, a, N, "cpu", 1));
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_register(12345, a, N, "cpu", 1));
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_destroy(e + 1));
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_free_batch(e)); /* an engine handle is not a batch */
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_close_segment(e));

    /* Registration. */
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_register(e, NULL, N, "cpu", 1));
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_register(e, a, 0, "cpu", 1));
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_register(e, a, N, "no-such-location", 1));
    CHECK_OK(te_register(e, a, N, "cpu", 1));
    CHECK_OK(te_register(e, a, N, "cpu", 1)); /* identical: idempotent */
    CHECK_RC(TE_ERR_ADDRESS_OVERLAPPED, te_register(e, a + 4096, N, "cpu", 1));
    CHECK_RC(TE_ERR_ADDRESS_OVERLAPPED, te_register(e, a, N / 2, "cpu", 1));
    CHECK_RC(TE_ERR_ADDRESS_NOT_REGISTERED, te_unregister(e, b));
    CHECK_RC(TE_ERR_ADDRESS_NOT_REGISTERED, te_unregister(e, a + 1));
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_unregister(e, NULL));
    te_region_t regs[2] = {{b, N / 2, "cpu", 1, 0}, {b + N / 4, N / 2, "cpu", 1, 0}};
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_register_batch(e, NULL, 1));
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_register_batch(e, regs, 0));
    CHECK_RC(TE_ERR_ADDRESS_OVERLAPPED, te_register_batch(e, regs, 2)); /* all or none */
    regs[1].addr = b + N / 2;
    CHECK_OK(te_register_batch(e, regs, 2));
    void *both[2] = {b, b + N / 2};
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_unregister_batch(e, NULL, 2));
    CHECK_OK(te_unregister_batch(e, both, 2));
    CHECK_RC(TE_ERR_ADDRESS_NOT_REGISTERED, te_unregister_batch(e, both, 2));
    CHECK_OK(te_register(e, b, N, NULL, 0)); /* local only */

    /* Windows (ABI 1.4): a to a peer, a bearer one, and the refusals. */
    te_range_t wr[2] = {{(uint64_t)(uintptr_t)a, 4096}, {(uint64_t)(uintptr_t)a + 8192, 4096}};
    uint64_t wkey = 7, bkey = 0;
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_grant_window_to(e, "peer", NULL, 1, &wkey));
    CHECK(wkey == 0); /* cleared on failure */
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_grant_window_to(e, "peer", wr, 0, &wkey));
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_grant_window_to(e, "peer", wr, 2, NULL));
    te_range_t unreg = {(uint64_t)(uintptr_t)b - 4096, 4096};
    CHECK_RC(TE_ERR_ADDRESS_NOT_REGISTERED, te_grant_window_to(e, "peer", &unreg, 1, &wkey));
    te_range_t priv = {(uint64_t)(uintptr_t)b, 4096};
    CHECK_RC(TE_ERR_ACCESS_DENIED, te_grant_window_to(e, "peer", &priv, 1, &wkey));
    CHECK_OK(te_grant_window_to(e, "peer", wr, 2, &wkey));
    CHECK_OK(te_grant_window_to(e, NULL, wr, 1, &bkey));
    CHECK(wkey != 0 && bkey != 0 && wkey != bkey);
    /* A window for its first user: bound by te_bind_window, then no other. */
    uint64_t fkey = 1;
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_grant_window_to_first(e, NULL, 1, &fkey));
    CHECK(fkey == 0);
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_grant_window_to_first(e, wr, 1, NULL));
    CHECK_OK(te_grant_window_to_first(e, wr, 1, &fkey));
    CHECK(fkey != 0);
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_bind_window(e, fkey, NULL));
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_bind_window(e, fkey, ""));
    CHECK_OK(te_bind_window(e, fkey, "peer"));
    CHECK_OK(te_bind_window(e, fkey, "peer"));
    CHECK_RC(TE_ERR_ACCESS_DENIED, te_bind_window(e, fkey, "other"));
    CHECK_OK(te_bind_window(e, wkey, "peer"));
    CHECK_RC(TE_ERR_ACCESS_DENIED, te_bind_window(e, wkey, "other"));
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_bind_window(e, bkey, "peer"));
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_bind_window(0, fkey, "peer"));
    CHECK_OK(te_revoke_window(e, fkey));
    CHECK_RC(TE_ERR_NOT_FOUND, te_bind_window(e, fkey, "peer"));
    CHECK_OK(te_revoke_window(e, wkey));
    CHECK_RC(TE_ERR_NOT_FOUND, te_revoke_window(e, wkey));
    CHECK_OK(te_revoke_window(e, bkey));
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_revoke_window(0, bkey));

    /* Names and counters. */
    char name[256], tiny[4];
    int32_t port = 0;
    CHECK_OK(te_segment_name(e, name, sizeof name));
    CHECK_RC(TE_ERR_BUFFER_TOO_SMALL, te_segment_name(e, tiny, sizeof tiny));
    CHECK(strlen(tiny) == 3 && strncmp(tiny, name, 3) == 0);
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_segment_name(e, NULL, 10));
    CHECK_OK(te_rpc_port(e, &port));
    CHECK(port > 0);
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_rpc_port(e, NULL));
    uint64_t cxl_addr = 0, cxl_size = 0;
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_cxl_memory(e, NULL, &cxl_size));
    if (!getenv("TE_CXL_DEVICE") && !getenv("MC_CXL_DEV_PATH"))
        CHECK_RC(TE_ERR_NOT_SUPPORTED, te_cxl_memory(e, &cxl_addr, &cxl_size));
    te_stats_t st = {0};
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_stats(e, &st)); /* size not set */
    st.size = sizeof st;
    CHECK_OK(te_stats(e, &st));
    CHECK(st.buffers == 2);
    char json[16384]; /* the stats grow with every transport installed */
    CHECK_OK(te_stats_json(e, json, sizeof json));
    CHECK(strstr(json, "\"segment\"") != NULL);

    /* Segments. */
    te_segment_t seg = 0, tmp = 7;
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_open_segment(e, NULL, &seg));
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_open_segment(e, name, NULL));
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_open_segment(e, "", &tmp));
    CHECK(tmp == 0);
    CHECK_RC(TE_ERR_SEGMENT_NOT_FOUND, te_open_segment(e, "127.0.0.1:1", &tmp)); /* nobody listens */
    CHECK_OK(te_open_segment(e, name, &seg));
    size_t count = 0;
    te_buffer_desc_t bufs[4];
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_segment_buffers(seg, NULL, 1, &count));
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_segment_buffers(seg, bufs, 4, NULL));
    CHECK_OK(te_segment_buffers(seg, NULL, 0, &count));
    CHECK(count == 1); /* b is not remote-accessible */
    CHECK_OK(te_segment_buffers(seg, bufs, 4, &count));
    CHECK(bufs[0].addr == (uint64_t)(uintptr_t)a && bufs[0].length == N && strncmp(bufs[0].location, "cpu", 3) == 0);

    /* Batches. */
    te_batch_t bt = 0;
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_allocate_batch(e, 0, &bt));
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_allocate_batch(e, 4, NULL));
    CHECK_OK(te_allocate_batch(e, 4, &bt));
    te_request_t good = {TE_WRITE, 0, b, seg, (uint64_t)(uintptr_t)a, 4096};
    te_request_t r;
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_submit(bt, NULL, 1));
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_submit(bt, &good, 0));
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_submit(seg, &good, 1)); /* segment handle as batch */
    r = good, r.length = 0;
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_submit(bt, &r, 1));
    r = good, r.opcode = 7;
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_submit(bt, &r, 1));
    r = good, r.segment = 0;
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_submit(bt, &r, 1));
    r = good, r.segment = bt;
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_submit(bt, &r, 1));
    r = good, r.local = a + 2 * N - 4096; /* mapped but not registered */
    CHECK_RC(TE_ERR_ADDRESS_NOT_REGISTERED, te_submit(bt, &r, 1));
    r = good, r.remote = (uint64_t)(uintptr_t)b; /* not in the segment's descriptor */
    CHECK(te_submit(bt, &r, 1) < 0);
    r = good, r.remote = (uint64_t)(uintptr_t)a + N - 100; /* runs past the buffer */
    CHECK(te_submit(bt, &r, 1) < 0);
    te_request_t five[5] = {good, good, good, good, good};
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_submit(bt, five, 5)); /* over capacity */
    /* A wild pointer is an error, not a crash. */
    CHECK_RC(TE_ERR_INTERNAL, te_submit(bt, (const te_request_t *)(uintptr_t)0xdead0000, 1));
    CHECK_RC(TE_ERR_INTERNAL, te_rpc_port(e, (int32_t *)(uintptr_t)0x10));
    te_task_status_t ts;
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_task_status(bt, 0, &ts)); /* nothing submitted yet */
    CHECK(ts.state == TE_TASK_INVALID);
    te_batch_status_t bs;
    CHECK_OK(te_wait(bt, 0, &bs)); /* empty batch: nothing to wait for */
    CHECK(bs.state == TE_TASK_WAITING && bs.tasks == 0);

    /* A valid local WRITE, then READ back, every byte checked. The first
     * completion is awaited through the batch's eventfd. */
    int32_t fd = -1, fd2 = -1;
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_batch_fd(bt, NULL));
    CHECK_OK(te_batch_fd(bt, &fd));
    CHECK_OK(te_batch_fd(bt, &fd2));
    CHECK(fd >= 0 && fd == fd2);
    tu_fill(b, 4096, 1);
    CHECK_OK(te_submit(bt, &good, 1));
    struct pollfd pfd = {fd, POLLIN, 0};
    CHECK(poll(&pfd, 1, 5000) == 1 && (pfd.revents & POLLIN));
    uint64_t ticks = 0;
    CHECK(read(fd, &ticks, sizeof ticks) == sizeof ticks && ticks >= 1);
    CHECK_OK(te_wait(bt, 5000, &bs));
    CHECK(bs.state == TE_TASK_COMPLETED && bs.completed == 1 && bs.transferred == 4096);
    CHECK(tu_verify(a, 4096, 1) == -1);
    r = good, r.opcode = TE_READ, r.local = b + 8192;
    CHECK_OK(te_submit(bt, &r, 1));
    CHECK_OK(te_wait(bt, -1, NULL));
    CHECK(tu_verify(b + 8192, 4096, 1) == -1);
    CHECK_OK(te_task_status(bt, 1, &ts));
    CHECK(ts.state == TE_TASK_COMPLETED && ts.transferred == 4096 && ts.error == 0 && ts.transport[0] != 0);
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_task_status(bt, 2, &ts));
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_task_status(bt, 0, NULL));
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_batch_status(bt, NULL));
    CHECK_OK(te_batch_status(bt, &bs));
    CHECK(bs.tasks == 2 && bs.completed == 2);
    CHECK_OK(te_free_batch(bt));
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_free_batch(bt));
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_submit(bt, &good, 1));
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_wait(bt, 0, NULL));

    /* Notifications and probes. */
    te_notify_t *list = NULL;
    size_t n = 99;
    CHECK_OK(te_notify_drain(e, &list, &n));
    CHECK(n == 0 && list == NULL);
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_notify_drain(e, NULL, &n));
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_notify_send(e, name, NULL, "m", 1));
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_notify_send(e, NULL, "n", "m", 1));
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_notify_send(e, name, "n", NULL, 1));
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_notify_send(e, "no-port", "n", "m", 1));
    CHECK_OK(te_notify_send(e, name, "first", "a\0b", 3)); /* binary message */
    CHECK_OK(te_notify_send(e, name, "second", NULL, 0));
    CHECK_OK(te_notify_drain(e, &list, &n));
    CHECK(n == 2);
    if (n == 2) {
        CHECK(strcmp(list[0].name, "first") == 0 && list[0].msg_len == 3 && memcmp(list[0].msg, "a\0b", 3) == 0);
        CHECK(strcmp(list[1].name, "second") == 0 && list[1].msg_len == 0 && list[1].msg[0] == 0);
    }
    CHECK_OK(te_notify_free(list));
    CHECK_OK(te_notify_free(NULL));
    /* With senders: nothing is proven without a secret. */
    te_notify_from_t *from = NULL;
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_notify_drain_from(e, NULL, &n));
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_notify_drain_from(e, &from, NULL));
    CHECK_OK(te_notify_send(e, name, "third", "c", 1));
    CHECK_OK(te_notify_drain_from(e, &from, &n));
    CHECK(n == 1);
    if (n == 1)
        CHECK(strcmp(from[0].name, "third") == 0 && from[0].msg_len == 1 && from[0].sender[0] == 0 &&
              from[0].sender_instance[0] == 0);
    CHECK_OK(te_notify_free((te_notify_t *)from));
    {
        /* With a secret the session proves who sent it. */
        te_config_t sc = local_config();
        sc.auth_secret = "errors.c cluster secret, 32 bytes...";
        te_engine_t se = 0;
        char sname[256];
        te_probe_t sp;
        CHECK_OK(te_create(&sc, &se));
        CHECK_OK(te_segment_name(se, sname, sizeof sname));
        CHECK_OK(te_probe(se, sname, &sp));
        CHECK_OK(te_notify_send(se, sname, "signed", "d", 1));
        from = NULL;
        CHECK_OK(te_notify_drain_from(se, &from, &n));
        CHECK(n == 1);
        if (n == 1)
            CHECK(strcmp(from[0].sender, sname) == 0 && strcmp(from[0].sender_instance, sp.instance) == 0);
        CHECK_OK(te_notify_free((te_notify_t *)from));
        CHECK_OK(te_destroy(se));
    }
    te_probe_t pr;
    CHECK_OK(te_probe(e, name, &pr));
    CHECK(strlen(pr.instance) == 32 && pr.version > 0);
    CHECK_OK(te_probe(e, name, NULL));
    CHECK(te_probe(e, "127.0.0.1:1", &pr) < 0);
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_probe(e, NULL, &pr));

    /* Closing and destroying invalidates handles. */
    CHECK_OK(te_close_segment(seg));
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_close_segment(seg));
    CHECK_OK(te_open_segment(e, name, &seg));
    CHECK_OK(te_allocate_batch(e, 1, &bt));
    CHECK_OK(te_unregister(e, a));
    CHECK_OK(te_destroy(e));
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_destroy(e));
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_register(e, a, N, "cpu", 1));
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_close_segment(seg));
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_free_batch(bt));

    /* Metadata stores: mem:// holds keys in this process, so the calls'
     * contract is checked without a server (etcd: python/tests). */
    te_store_t sto = 5;
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_store_open("P2PHANDSHAKE", &sto));
    CHECK(sto == 0);
    CHECK_RC(TE_ERR_NOT_SUPPORTED, te_store_open("nosuch://x", &sto));
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_store_open("mem://errors", NULL));
    CHECK_OK(te_store_open("mem://errors", &sto));
    CHECK(sto != 0);
    char val[8];
    size_t vlen = 99;
    CHECK_RC(TE_ERR_NOT_FOUND, te_store_get(sto, "/k", val, sizeof val, &vlen));
    CHECK(vlen == 0);
    CHECK_OK(te_store_put(sto, "/k", "0123456789", 10));
    CHECK_RC(TE_ERR_BUFFER_TOO_SMALL, te_store_get(sto, "/k", val, sizeof val, &vlen));
    CHECK(vlen == 10);
    CHECK_RC(TE_ERR_BUFFER_TOO_SMALL, te_store_get(sto, "/k", NULL, 0, &vlen));
    CHECK(vlen == 10);
    char big[16];
    CHECK_OK(te_store_get(sto, "/k", big, sizeof big, &vlen));
    CHECK(vlen == 10 && memcmp(big, "0123456789", 10) == 0);
    CHECK_OK(te_store_put(sto, "/empty", NULL, 0));
    CHECK_OK(te_store_get(sto, "/empty", NULL, 0, &vlen));
    CHECK(vlen == 0);
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_store_put(sto, "", "v", 1));
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_store_put(sto, NULL, "v", 1));
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_store_put(sto, "/k", NULL, 1));
    CHECK_RC(TE_ERR_TOO_LARGE, te_store_put(sto, "/k", val, (size_t)65 << 20));
    char longkey[5000];
    memset(longkey, 'k', sizeof longkey - 1);
    longkey[sizeof longkey - 1] = 0;
    CHECK_RC(TE_ERR_TOO_LARGE, te_store_get(sto, longkey, val, sizeof val, &vlen));
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_store_get(sto, "/k", NULL, 4, &vlen));
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_store_get(sto, "/k", val, sizeof val, NULL));
    CHECK_OK(te_store_delete(sto, "/k"));
    CHECK_OK(te_store_delete(sto, "/k")); /* gone already: no error */
    CHECK_RC(TE_ERR_NOT_FOUND, te_store_get(sto, "/k", val, sizeof val, &vlen));
    CHECK_RC(TE_ERR_NOT_SUPPORTED, te_store_watch(sto, "/")); /* only etcd pushes changes */
    CHECK_OK(te_store_unwatch(sto, "/"));
    vlen = 99;
    CHECK_OK(te_store_changes(sto, NULL, 0, &vlen));
    CHECK(vlen == 0);
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_store_changes(sto, val, sizeof val, NULL));
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_store_put(bt, "/k", "v", 1)); /* a batch handle */
    CHECK_OK(te_store_close(sto));
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_store_close(sto));
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_store_put(sto, "/k", "v", 1));

    munmap(a, 2 * N);
    munmap(b, N);
    return tu_done("errors");
}
