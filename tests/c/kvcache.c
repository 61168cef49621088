/* kvcache: layouts and plans through te.h. Every error path of the layout,
 * plan and handoff calls (bad JSON, mismatched layouts, block ids out of
 * range, duplicate destinations, wrong and stale handles, NULL pointers,
 * short structs), then a plan submitted layer by layer between two caches of
 * one engine with every byte checked. No te-sidecar is needed: the handoff
 * calls here fail before or at the network. */
#include <inttypes.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/mman.h>

#include "testutil.h"

#define LAYERS 3
#define HEADS 4
#define HEAD_DIM 32
#define BLOCK 16
#define BB ((uint64_t)BLOCK * HEADS * HEAD_DIM * 2) /* one bf16 block of K or V */

static void json_of(char *buf, size_t n, const char *format, const char *order, const char *dtype, int blocks,
                     const unsigned char *base, uint64_t layer_bytes) {
    int k = snprintf(buf, n,
                     "{\"format\":\"%s\",\"order\":\"%s\",\"dtype\":\"%s\",\"num_blocks\":%d,\"block_size\":%d,"
                     "\"num_heads\":%d,\"head_dim\":%d,\"bases\":[",
                     format, order, dtype, blocks, BLOCK, HEADS, HEAD_DIM);
    for (int l = 0; l < LAYERS; l++)
        k += snprintf(buf + k, n - k, "%s%" PRIu64, l ? "," : "", (uint64_t)(uintptr_t)base + l * layer_bytes);
    snprintf(buf + k, n - k, "]}");
}

static void layouts(void) {
    te_layout_t l = 1;
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_layout_create(NULL, &l));
    CHECK(l == 0);
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_layout_create("{}", NULL));
    const char *bad[] = {
        "",
        "{",
        "[1,2]",
        "{\"format\":\"vllm\"} trailing",
        /* misspelt field */
        "{\"format\":\"vllm\",\"dtype\":\"bf16\",\"numblocks\":4,\"block_size\":16,\"num_heads\":1,\"head_dim\":8,"
        "\"bases\":[4096]}",
        /* unknown dtype, format, order */
        "{\"format\":\"vllm\",\"dtype\":\"int4\",\"num_blocks\":4,\"block_size\":16,\"num_heads\":1,\"head_dim\":8,"
        "\"bases\":[4096]}",
        "{\"format\":\"paged\",\"dtype\":\"bf16\",\"num_blocks\":4,\"block_size\":16,\"num_heads\":1,\"head_dim\":8,"
        "\"bases\":[4096]}",
        "{\"format\":\"mla\",\"order\":\"HND\",\"dtype\":\"bf16\",\"num_blocks\":4,\"block_size\":16,\"head_dim\":8,"
        "\"bases\":[4096]}",
        /* no bases; zero base; overlapping layers; negative dimension */
        "{\"format\":\"vllm\",\"dtype\":\"bf16\",\"num_blocks\":4,\"block_size\":16,\"num_heads\":1,\"head_dim\":8}",
        "{\"format\":\"vllm\",\"dtype\":\"bf16\",\"num_blocks\":4,\"block_size\":16,\"num_heads\":1,\"head_dim\":8,"
        "\"bases\":[0]}",
        "{\"format\":\"vllm\",\"dtype\":\"bf16\",\"num_blocks\":4,\"block_size\":16,\"num_heads\":1,\"head_dim\":8,"
        "\"bases\":[4096,4100]}",
        "{\"format\":\"vllm\",\"dtype\":\"bf16\",\"num_blocks\":-4,\"block_size\":16,\"num_heads\":1,\"head_dim\":8,"
        "\"bases\":[4096]}",
        /* sglang needs k_bases and v_bases */
        "{\"format\":\"sglang\",\"dtype\":\"bf16\",\"num_blocks\":4,\"block_size\":16,\"num_heads\":1,\"head_dim\":8,"
        "\"bases\":[4096]}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        l = 1;
        int rc = te_layout_create(bad[i], &l);
        if (rc != TE_ERR_INVALID_ARGUMENT || l != 0) {
            fprintf(stderr, "te_layout_create(%s) = %d (handle %" PRIu64 "), want TE_ERR_INVALID_ARGUMENT: %s\n",
                    bad[i], rc, l, tu_last());
            tu_failures++;
        }
    }

    /* Shape only: no bases needed. */
    uint64_t bb = 0, lb = 0;
    CHECK_OK(te_layout_bytes("{\"format\":\"flashinfer\",\"dtype\":\"fp8_e4m3\",\"num_blocks\":10,\"block_size\":16,"
                             "\"num_heads\":2,\"head_dim\":64}",
                             &bb, &lb));
    CHECK(bb == 16 * 2 * 64 && lb == 2 * 10 * bb);
    CHECK_OK(te_layout_bytes(
        "{\"format\":\"mla\",\"dtype\":\"bf16\",\"num_blocks\":10,\"block_size\":16,\"head_dim\":576}", NULL, &lb));
    CHECK(lb == 10 * 16 * 576 * 2);
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_layout_bytes(NULL, &bb, &lb));
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_layout_bytes("{\"format\":\"vllm\"}", &bb, &lb));

    /* Info and regions of a valid layout (addresses need not be mapped for
     * a layout; only registration and transfers touch memory). */
    char json[512];
    json_of(json, sizeof json, "vllm", "HND", "bf16", 8, (const unsigned char *)(uintptr_t)0x10000000, 2 * 8 * BB);
    CHECK_OK(te_layout_create(json, &l));
    te_layout_info_t in = {0};
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_layout_info(l, &in)); /* size not set */
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_layout_info(l, NULL));
    in.size = sizeof in;
    CHECK_OK(te_layout_info(l, &in));
    CHECK(in.num_layers == LAYERS && in.first_layer == 0 && in.num_blocks == 8 && in.components == 2);
    CHECK(in.regions == LAYERS && in.block_bytes == BB && in.layer_bytes == 2 * 8 * BB);
    /* An older, shorter struct: nothing past its size is written. */
    te_layout_info_t old;
    memset(&old, 0x5A, sizeof old);
    old.size = offsetof(te_layout_info_t, block_bytes);
    CHECK_OK(te_layout_info(l, &old));
    CHECK(old.num_layers == LAYERS && old.block_bytes == 0x5A5A5A5A5A5A5A5Aull);
    size_t count = 99;
    CHECK_OK(te_layout_regions(l, NULL, 0, &count));
    CHECK(count == LAYERS);
    te_span_t spans[2];
    CHECK_OK(te_layout_regions(l, spans, 2, &count)); /* cut to fit, count says all */
    CHECK(count == LAYERS && spans[0].addr == 0x10000000 && spans[1].addr == 0x10000000 + 2 * 8 * BB);
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_layout_regions(l, NULL, 2, &count));
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_layout_regions(l, spans, 2, NULL));

    /* Handles: 0, wrong kind, freed. */
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_layout_info(0, &in));
    CHECK_OK(te_layout_free(l));
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_layout_info(l, &in));
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_layout_free(l));
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_plan_free(l));
}

static te_engine_t engine(void) {
    te_config_t cfg = TE_CONFIG_INIT;
    cfg.listen_addr = "127.0.0.1:0";
    cfg.hostname = "127.0.0.1";
    cfg.rpc_timeout_ms = 10000;
    te_engine_t e = 0;
    if (te_create(&cfg, &e) != 0) fprintf(stderr, "create: %s\n", tu_last());
    return e;
}

static void plans(void) {
    const uint64_t slb = 2 * 6 * BB, dlb = 2 * 10 * BB; /* 6 source, 10 destination blocks */
    unsigned char *src = mmap(NULL, LAYERS * slb, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    unsigned char *dst = mmap(NULL, LAYERS * dlb, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (src == MAP_FAILED || dst == MAP_FAILED) {
        tu_failures++;
        return;
    }
    char js[512], jd[512], jf[512];
    json_of(js, sizeof js, "vllm", "NHD", "bf16", 6, src, slb);
    json_of(jd, sizeof jd, "vllm", "NHD", "bf16", 10, dst, dlb);
    json_of(jf, sizeof jf, "vllm", "NHD", "fp16", 10, dst, dlb);
    te_layout_t ls, ld, lf;
    CHECK_OK(te_layout_create(js, &ls));
    CHECK_OK(te_layout_create(jd, &ld));
    CHECK_OK(te_layout_create(jf, &lf));

    const int32_t sb[] = {0, 1, 2, 5};
    const int32_t db[] = {4, 5, 6, 0};
    te_plan_t p = 1;
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_plan_create(ls, lf, sb, 4, db, 4, 0, 0, &p)); /* dtype */
    CHECK(p == 0);
    CHECK(strstr(tu_last(), "dtype") != NULL);
    const int32_t out_of_range[] = {4, 5, 6, 10};
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_plan_create(ls, ld, sb, 4, out_of_range, 4, 0, 0, &p));
    const int32_t negative[] = {0, -1, 2, 3};
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_plan_create(ls, ld, negative, 4, db, 4, 0, 0, &p));
    const int32_t dup[] = {4, 5, 4, 0};
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_plan_create(ls, ld, sb, 4, dup, 4, 0, 0, &p));
    CHECK(strstr(tu_last(), "twice") != NULL);
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_plan_create(ls, ld, sb, 4, db, 3, 0, 0, &p)); /* unequal */
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_plan_create(ls, ld, sb, 0, db, 0, 0, 0, &p)); /* empty */
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_plan_create(ls, ld, NULL, 4, db, 4, 0, 0, &p));
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_plan_create(ls, ld, sb, 4, NULL, 4, 0, 0, &p));
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_plan_create(ls, ld, sb, 4, db, 4, 2, 1, &p));          /* empty range */
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_plan_create(ls, ld, sb, 4, db, 4, 0, LAYERS + 1, &p)); /* past the layers */
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_plan_create(ls, ld, sb, 4, db, 4, -1, 2, &p));
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_plan_create(ls, 0, sb, 4, db, 4, 0, 0, &p));
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_plan_create(ls, ld, sb, 4, db, 4, 0, 0, NULL));

    CHECK_OK(te_plan_create(ls, ld, sb, 4, db, 4, 0, 0, &p));
    te_plan_t p2 = 1;
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_plan_create(p, ld, sb, 4, db, 4, 0, 0, &p2)); /* a plan is no layout */
    CHECK(p2 == 0);
    te_plan_stats_t st = {.size = sizeof st};
    CHECK_OK(te_plan_stats(p, &st));
    CHECK(st.layers == LAYERS && st.layer_begin == 0 && st.layer_end == LAYERS && st.blocks == 4 && st.pieces == 1);
    CHECK(st.bytes == (uint64_t)LAYERS * 2 * 4 * BB);
    CHECK(st.block_requests == (uint64_t)LAYERS * 2 * 4);
    /* Source 0,1,2 -> destination 4,5,6 is one run: per layer and K/V two
     * requests (that run and block 5 -> 0). */
    CHECK(st.requests == (uint64_t)LAYERS * 2 * 2 && st.max_layer_requests == 4);
    CHECK(st.merged <= st.requests);
    st.size = 0;
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_plan_stats(p, &st));

    size_t count = 0;
    CHECK_OK(te_plan_transfers(p, 1, NULL, 0, &count));
    CHECK(count == 4);
    te_plan_transfer_t ts[8];
    CHECK_OK(te_plan_transfers(p, 1, ts, 8, &count));
    uint64_t total = 0;
    for (size_t i = 0; i < count && i < 8; i++) total += ts[i].length;
    CHECK(total == 2 * 4 * BB);
    CHECK_OK(te_plan_transfers(p, TE_PLAN_ALL_LAYERS, NULL, 0, &count));
    CHECK(count == st.merged);
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_plan_transfers(p, LAYERS, ts, 8, &count));
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_plan_transfers(p, 0, ts, 8, NULL));

    /* Layer by layer through an engine: both caches in this process. */
    te_engine_t e = engine(), other = engine();
    for (int l = 0; l < LAYERS; l++) tu_fill(src + l * slb, slb, 7 + l);
    memset(dst, 0xEE, LAYERS * dlb);
    CHECK_OK(te_register(e, src, LAYERS * slb, "cpu", 1));
    CHECK_OK(te_register(e, dst, LAYERS * dlb, "cpu", 1));
    char name[256];
    CHECK_OK(te_segment_name(e, name, sizeof name));
    te_segment_t seg, foreign;
    CHECK_OK(te_open_segment(e, name, &seg));
    CHECK_OK(te_open_segment(other, name, &foreign));
    te_batch_t b;
    CHECK_OK(te_allocate_batch(e, st.requests, &b));
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_plan_submit_layer(b, seg, p, 0, 7));            /* opcode */
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_plan_submit_layer(b, seg, p, LAYERS, TE_WRITE)); /* layer */
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_plan_submit_layer(b, foreign, p, 0, TE_WRITE));  /* other engine */
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_plan_submit_layer(b, seg, ld, 0, TE_WRITE));     /* layout, not plan */
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_plan_submit_layer(seg, seg, p, 0, TE_WRITE));    /* segment, not batch */
    for (int l = 0; l < LAYERS; l++) CHECK_OK(te_plan_submit_layer(b, seg, p, l, TE_WRITE));
    te_batch_status_t bs;
    CHECK_OK(te_wait(b, 60000, &bs));
    CHECK(bs.tasks == st.requests && bs.transferred == st.bytes);
    CHECK_OK(te_free_batch(b));
    for (int l = 0; l < LAYERS; l++) {
        unsigned char *want = malloc(slb);
        tu_fill(want, slb, 7 + l);
        for (int c = 0; c < 2; c++)
            for (int blk = 0; blk < 10; blk++) {
                const unsigned char *got = dst + l * dlb + c * 10 * BB + blk * BB;
                int from = -1;
                for (int i = 0; i < 4; i++)
                    if (db[i] == blk) from = sb[i];
                for (uint64_t i = 0; i < BB; i++) {
                    unsigned char w = from < 0 ? 0xEE : want[c * 6 * BB + from * BB + i];
                    if (got[i] != w) {
                        fprintf(stderr, "layer %d comp %d block %d byte %" PRIu64 ": %#x, want %#x\n", l, c, blk, i,
                                got[i], w);
                        tu_failures++;
                        break;
                    }
                }
            }
        free(want);
    }

    /* The whole plan at once, pulled (READ) into a cleared destination. */
    memset(dst, 0, LAYERS * dlb);
    CHECK_OK(te_allocate_batch(e, st.merged, &b));
    CHECK_OK(te_plan_submit(b, seg, p, TE_READ));
    CHECK_OK(te_wait(b, 60000, &bs));
    CHECK(bs.transferred == st.bytes);
    CHECK_OK(te_free_batch(b));
    unsigned char *want = malloc(slb);
    tu_fill(want, slb, 7 + 2);
    CHECK(memcmp(dst + 2 * dlb + 10 * BB + 0 * BB, want + 6 * BB + 5 * BB, BB) == 0); /* layer 2, V, 5 -> 0 */
    free(want);

    /* Plans and layouts outlive engines. */
    CHECK_OK(te_close_segment(foreign));
    CHECK_OK(te_close_segment(seg));
    CHECK_OK(te_destroy(other));
    CHECK_OK(te_destroy(e));
    CHECK_OK(te_plan_stats(p, &(te_plan_stats_t){.size = sizeof(te_plan_stats_t)}));
    CHECK_OK(te_plan_free(p));
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_plan_stats(p, &st));
    CHECK_OK(te_layout_free(ls));
    CHECK_OK(te_layout_free(ld));
    CHECK_OK(te_layout_free(lf));
}

static void handoffs(void) {
    te_engine_t e = engine();
    te_handoff_t c = 1;
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_handoff_create(e, NULL, &c));
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_handoff_create(e, "", &c));
    CHECK(c == 0);
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_handoff_create(e, "ftp://127.0.0.1:1", &c));
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_handoff_create(e, "127.0.0.1:1", NULL));
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_handoff_create(0, "127.0.0.1:1", &c));
    /* Nothing listens on port 1. */
    CHECK_OK(te_handoff_create(e, "127.0.0.1:1", &c));

    unsigned char *mem = mmap(NULL, LAYERS * 2 * 4 * BB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    char json[512];
    json_of(json, sizeof json, "vllm", "NHD", "bf16", 4, mem, 2 * 4 * BB);
    te_layout_t l;
    CHECK_OK(te_layout_create(json, &l));
    const int32_t blocks[] = {0, 1};
    te_xfer_t x = 1;
    /* The blocks must be registered memory: the transfer's window covers
     * them before anything is declared. */
    CHECK_RC(TE_ERR_ADDRESS_NOT_REGISTERED, te_handoff_expect(c, "r1", l, blocks, 2, TE_HANDOFF_MODE_PUSH, 0, &x));
    CHECK(x == 0);
    CHECK_OK(te_register(e, mem, LAYERS * 2 * 4 * BB, "cpu", 1));
    CHECK_RC(TE_ERR_PEER_UNREACHABLE, te_handoff_expect(c, "r1", l, blocks, 2, TE_HANDOFF_MODE_PUSH, 0, &x));
    CHECK(x == 0);
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_handoff_expect(c, "r1", l, blocks, 2, 7, 0, &x));   /* mode */
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_handoff_expect(c, "r1", l, blocks, 2, 0, -5, &x));  /* timeout */
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_handoff_expect(c, NULL, l, blocks, 2, 0, 0, &x));   /* id */
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_handoff_ready(c, "r1", l, NULL, 2, 0, 0, &x));      /* blocks */
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_handoff_ready(c, "r1", l, blocks, 0, 0, 0, &x));    /* no blocks */
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_handoff_ready(c, "r1", 0, blocks, 2, 0, 0, &x));    /* layout */
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_handoff_ready(l, "r1", l, blocks, 2, 0, 0, &x));    /* client */
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_handoff_ready(c, "r1", l, blocks, 2, 0, 0, NULL));

    te_handoff_result_t r = {.size = sizeof r};
    te_handoff_status_t st = {.size = sizeof st};
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_handoff_wait(0, 0, &r));
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_handoff_send(c, 0, &r)); /* a client is no transfer */
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_handoff_send_layer(0, 0, 0));
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_handoff_abort(0, "x"));
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_handoff_status(0, &st));
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_handoff_free(0));
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_handoff_destroy(0));

    /* A handoff client reads its engine's notifications; te_notify_drain
     * still gets the ones that are not handoff completions. */
    te_engine_t sender = engine();
    char name[256];
    CHECK_OK(te_segment_name(e, name, sizeof name));
    CHECK_OK(te_notify_send(sender, name, "app", "hello", 5));
    te_notify_t *list = NULL;
    size_t nn = 0;
    CHECK_OK(te_notify_drain(e, &list, &nn));
    CHECK(nn == 1 && list != NULL && strcmp(list[0].name, "app") == 0 && list[0].msg_len == 5 &&
          memcmp(list[0].msg, "hello", 5) == 0);
    CHECK_OK(te_notify_free(list));
    CHECK_OK(te_destroy(sender));

    /* te_destroy takes the engine's clients with it. */
    te_handoff_t c2;
    CHECK_OK(te_handoff_create(e, "http://127.0.0.1:1", &c2));
    CHECK_OK(te_handoff_destroy(c2));
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_handoff_destroy(c2));
    CHECK_OK(te_destroy(e));
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_handoff_destroy(c));
    CHECK_OK(te_layout_free(l));
}

int main(void) {
    layouts();
    plans();
    handoffs();
    return tu_done("kvcache");
}
