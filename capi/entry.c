// The public te_* functions of te.h. Each is a thin C function that refuses
// the call in a forked child before anything enters the Go runtime (which
// cannot run there: its threads did not survive the fork) and otherwise
// calls the Go export of the same name with "tego_" for "te_" (capi/*.go).
// libte.map keeps the tego_ names out of the library's dynamic symbols.
//
// te_abi_version, te_last_error and te_notify_free never enter Go, so they
// work in a forked child too. The calling thread's last error message is
// kept here in thread-local storage: Go writes it through tecapi_set_error
// on the thread that made the failed call.

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "te.h"
#include "entry.h"
#include "_cgo_export.h"

// forked is set in every child forked from a process that has loaded the
// library: the Go runtime started when the library was loaded, and its idle
// threads, which the scheduler would hand work to, do not exist in the
// child. Written once, read on every call.
static int tecapi_forked;

static void tecapi_atfork_child(void) { __atomic_store_n(&tecapi_forked, 1, __ATOMIC_SEQ_CST); }

// Each thread's last error message: a buffer of TECAPI_MAX_MESSAGE bytes
// allocated at the thread's first failure and freed when the thread exits.
// Only the pointer is thread-local: the Go runtime makes libte's TLS
// "static", and a dlopen (ctypes) finds little room for that.
static __thread char *tecapi_msg;
static pthread_key_t tecapi_msg_key;

static void tecapi_free_msg(void *p) {
    tecapi_msg = NULL;
    free(p);
}

// Run when the library is loaded, which is when the runtime starts.
__attribute__((constructor)) static void tecapi_init(void) {
    pthread_key_create(&tecapi_msg_key, tecapi_free_msg);
    pthread_atfork(NULL, NULL, tecapi_atfork_child);
}

void tecapi_set_error(const char *msg, size_t n) {
    if (tecapi_msg == NULL) {
        char *p = malloc(TECAPI_MAX_MESSAGE);
        if (p == NULL) return; // the code still says what failed
        pthread_setspecific(tecapi_msg_key, p);
        tecapi_msg = p;
    }
    if (n >= TECAPI_MAX_MESSAGE) n = TECAPI_MAX_MESSAGE - 1; // Go cuts at a character boundary first
    if (n > 0) memcpy(tecapi_msg, msg, n);
    tecapi_msg[n] = 0;
}

// tecapi_child starts every function that enters Go: in a forked child it
// records why the call is refused and returns 1, and the caller returns
// TE_ERR_FORKED.
static int tecapi_child(const char *fn) {
    if (!__atomic_load_n(&tecapi_forked, __ATOMIC_RELAXED)) return 0;
    char m[256];
    snprintf(m, sizeof m,
             "%s: called in a child process forked after libte was loaded; the Go runtime cannot run here "
             "(exec a new program, or load libte in the child only)",
             fn);
    tecapi_set_error(m, strlen(m));
    return 1;
}

int te_abi_version(void) { return TE_ABI_VERSION; }

int te_last_error(char *buf, size_t len) {
    if (buf == NULL || len == 0) return TE_ERR_INVALID_ARGUMENT; // not recorded: it would replace the message asked for
    const char *m = tecapi_msg != NULL ? tecapi_msg : "";
    size_t n = strlen(m);
    if (n < len) {
        memcpy(buf, m, n + 1);
        return 0;
    }
    // Cut at a UTF-8 character boundary so the result stays valid.
    n = len - 1;
    while (n > 0 && (m[n] & 0xC0) == 0x80) n--;
    memcpy(buf, m, n);
    buf[n] = 0;
    return TE_ERR_BUFFER_TOO_SMALL;
}

// te_notify_drain and te_notify_drain_from return one malloc'ed block.
int te_notify_free(te_notify_t *list) {
    free(list);
    return 0;
}

int te_local_topology(const char *devices, char *buf, size_t len) {
    if (tecapi_child(__func__)) return TE_ERR_FORKED;
    return tego_local_topology(devices, buf, len);
}

int te_create(const te_config_t *cfg, te_engine_t *out) {
    if (tecapi_child(__func__)) {
        if (out) *out = 0;
        return TE_ERR_FORKED;
    }
    return tego_create(cfg, out);
}

int te_destroy(te_engine_t engine) {
    if (tecapi_child(__func__)) return TE_ERR_FORKED;
    return tego_destroy(engine);
}

int te_segment_name(te_engine_t engine, char *buf, size_t len) {
    if (tecapi_child(__func__)) return TE_ERR_FORKED;
    return tego_segment_name(engine, buf, len);
}

int te_cxl_memory(te_engine_t engine, uint64_t *addr, uint64_t *size) {
    if (tecapi_child(__func__)) return TE_ERR_FORKED;
    return tego_cxl_memory(engine, addr, size);
}

int te_rpc_port(te_engine_t engine, int32_t *port) {
    if (tecapi_child(__func__)) return TE_ERR_FORKED;
    return tego_rpc_port(engine, port);
}

int te_stats(te_engine_t engine, te_stats_t *out) {
    if (tecapi_child(__func__)) return TE_ERR_FORKED;
    return tego_stats(engine, out);
}

int te_stats_json(te_engine_t engine, char *buf, size_t len) {
    if (tecapi_child(__func__)) return TE_ERR_FORKED;
    return tego_stats_json(engine, buf, len);
}

int te_metrics(te_engine_t engine, char *buf, size_t len, size_t *needed) {
    if (tecapi_child(__func__)) return TE_ERR_FORKED;
    return tego_metrics(engine, buf, len, needed);
}

int te_version(char *buf, size_t len) {
    if (tecapi_child(__func__)) return TE_ERR_FORKED;
    return tego_version(buf, len);
}

int te_register(te_engine_t engine, void *addr, uint64_t length, const char *location, int32_t remote) {
    if (tecapi_child(__func__)) return TE_ERR_FORKED;
    return tego_register(engine, addr, length, location, remote);
}

int te_unregister(te_engine_t engine, void *addr) {
    if (tecapi_child(__func__)) return TE_ERR_FORKED;
    return tego_unregister(engine, addr);
}

int te_register_file(te_engine_t engine, const char *path, int32_t fd, uint64_t offset, uint64_t length,
                     uint32_t flags, void **addr) {
    if (tecapi_child(__func__)) return TE_ERR_FORKED;
    return tego_register_file(engine, path, fd, offset, length, flags, addr);
}

int te_register_batch(te_engine_t engine, const te_region_t *regions, size_t n) {
    if (tecapi_child(__func__)) return TE_ERR_FORKED;
    return tego_register_batch(engine, regions, n);
}

int te_unregister_batch(te_engine_t engine, void *const *addrs, size_t n) {
    if (tecapi_child(__func__)) return TE_ERR_FORKED;
    return tego_unregister_batch(engine, addrs, n);
}

int te_grant_window_to(te_engine_t engine, const char *peer, const te_range_t *ranges, size_t n, uint64_t *key) {
    if (tecapi_child(__func__)) {
        if (key) *key = 0;
        return TE_ERR_FORKED;
    }
    return tego_grant_window_to(engine, peer, ranges, n, key);
}

int te_grant_window_to_first(te_engine_t engine, const te_range_t *ranges, size_t n, uint64_t *key) {
    if (tecapi_child(__func__)) {
        if (key) *key = 0;
        return TE_ERR_FORKED;
    }
    return tego_grant_window_to_first(engine, ranges, n, key);
}

int te_bind_window(te_engine_t engine, uint64_t key, const char *peer) {
    if (tecapi_child(__func__)) return TE_ERR_FORKED;
    return tego_bind_window(engine, key, peer);
}

int te_revoke_window(te_engine_t engine, uint64_t key) {
    if (tecapi_child(__func__)) return TE_ERR_FORKED;
    return tego_revoke_window(engine, key);
}

int te_open_segment(te_engine_t engine, const char *name, te_segment_t *out) {
    if (tecapi_child(__func__)) {
        if (out) *out = 0;
        return TE_ERR_FORKED;
    }
    return tego_open_segment(engine, name, out);
}

int te_warmup_segment(te_engine_t engine, const char *name) {
    if (tecapi_child(__func__)) return TE_ERR_FORKED;
    return tego_warmup_segment(engine, name);
}

int te_close_segment(te_segment_t segment) {
    if (tecapi_child(__func__)) return TE_ERR_FORKED;
    return tego_close_segment(segment);
}

int te_segment_buffers(te_segment_t segment, te_buffer_desc_t *out, size_t cap, size_t *count) {
    if (tecapi_child(__func__)) return TE_ERR_FORKED;
    return tego_segment_buffers(segment, out, cap, count);
}

int te_allocate_batch(te_engine_t engine, size_t capacity, te_batch_t *out) {
    if (tecapi_child(__func__)) {
        if (out) *out = 0;
        return TE_ERR_FORKED;
    }
    return tego_allocate_batch(engine, capacity, out);
}

int te_submit(te_batch_t batch, const te_request_t *requests, size_t n) {
    if (tecapi_child(__func__)) return TE_ERR_FORKED;
    return tego_submit(batch, requests, n);
}

int te_submit_with_notify(te_batch_t batch, const te_request_t *requests, size_t n,
        const char *segment, const char *name, const char *msg, size_t msg_len) {
    if (tecapi_child(__func__)) return TE_ERR_FORKED;
    return tego_submit_with_notify(batch, requests, n, segment, name, msg, msg_len);
}

int te_submit_windows(te_batch_t batch, const te_request_t *requests, const uint64_t *windows, size_t n) {
    if (tecapi_child(__func__)) return TE_ERR_FORKED;
    return tego_submit_windows(batch, requests, windows, n);
}

int te_submit_windows_with_notify(te_batch_t batch, const te_request_t *requests, const uint64_t *windows,
        size_t n, const char *segment, const char *name, const char *msg, size_t msg_len) {
    if (tecapi_child(__func__)) return TE_ERR_FORKED;
    return tego_submit_windows_with_notify(batch, requests, windows, n, segment, name, msg, msg_len);
}

int te_task_status(te_batch_t batch, size_t index, te_task_status_t *out) {
    if (tecapi_child(__func__)) return TE_ERR_FORKED;
    return tego_task_status(batch, index, out);
}

int te_batch_status(te_batch_t batch, te_batch_status_t *out) {
    if (tecapi_child(__func__)) return TE_ERR_FORKED;
    return tego_batch_status(batch, out);
}

int te_wait(te_batch_t batch, int64_t timeout_ms, te_batch_status_t *out) {
    if (tecapi_child(__func__)) return TE_ERR_FORKED;
    return tego_wait(batch, timeout_ms, out);
}

int te_batch_fd(te_batch_t batch, int32_t *fd) {
    if (tecapi_child(__func__)) {
        if (fd) *fd = -1;
        return TE_ERR_FORKED;
    }
    return tego_batch_fd(batch, fd);
}

int te_batch_cancel(te_batch_t batch) {
    if (tecapi_child(__func__)) return TE_ERR_FORKED;
    return tego_batch_cancel(batch);
}

int te_batch_reset(te_batch_t batch) {
    if (tecapi_child(__func__)) return TE_ERR_FORKED;
    return tego_batch_reset(batch);
}

int te_free_batch(te_batch_t batch) {
    if (tecapi_child(__func__)) return TE_ERR_FORKED;
    return tego_free_batch(batch);
}

int te_notify_send(te_engine_t engine, const char *segment, const char *name, const char *msg,
        size_t msg_len) {
    if (tecapi_child(__func__)) return TE_ERR_FORKED;
    return tego_notify_send(engine, segment, name, msg, msg_len);
}

int te_notify_drain(te_engine_t engine, te_notify_t **out, size_t *count) {
    if (tecapi_child(__func__)) {
        if (out) *out = NULL;
        if (count) *count = 0;
        return TE_ERR_FORKED;
    }
    return tego_notify_drain(engine, out, count);
}

int te_notify_drain_from(te_engine_t engine, te_notify_from_t **out, size_t *count) {
    if (tecapi_child(__func__)) {
        if (out) *out = NULL;
        if (count) *count = 0;
        return TE_ERR_FORKED;
    }
    return tego_notify_drain_from(engine, out, count);
}

int te_probe(te_engine_t engine, const char *segment, te_probe_t *out) {
    if (tecapi_child(__func__)) return TE_ERR_FORKED;
    return tego_probe(engine, segment, out);
}

int te_layout_create(const char *json, te_layout_t *out) {
    if (tecapi_child(__func__)) {
        if (out) *out = 0;
        return TE_ERR_FORKED;
    }
    return tego_layout_create(json, out);
}

int te_layout_bytes(const char *json, uint64_t *block_bytes, uint64_t *layer_bytes) {
    if (tecapi_child(__func__)) return TE_ERR_FORKED;
    return tego_layout_bytes(json, block_bytes, layer_bytes);
}

int te_layout_info(te_layout_t layout, te_layout_info_t *out) {
    if (tecapi_child(__func__)) return TE_ERR_FORKED;
    return tego_layout_info(layout, out);
}

int te_layout_regions(te_layout_t layout, te_span_t *out, size_t cap, size_t *count) {
    if (tecapi_child(__func__)) return TE_ERR_FORKED;
    return tego_layout_regions(layout, out, cap, count);
}

int te_store_open(const char *conn, te_store_t *out) {
    if (tecapi_child(__func__)) {
        if (out) *out = 0;
        return TE_ERR_FORKED;
    }
    return tego_store_open(conn, out);
}

int te_store_put(te_store_t store, const char *key, const void *value, size_t len) {
    if (tecapi_child(__func__)) return TE_ERR_FORKED;
    return tego_store_put(store, key, value, len);
}

int te_store_get(te_store_t store, const char *key, void *buf, size_t cap, size_t *len) {
    if (tecapi_child(__func__)) {
        if (len) *len = 0;
        return TE_ERR_FORKED;
    }
    return tego_store_get(store, key, buf, cap, len);
}

int te_store_delete(te_store_t store, const char *key) {
    if (tecapi_child(__func__)) return TE_ERR_FORKED;
    return tego_store_delete(store, key);
}

int te_store_watch(te_store_t store, const char *prefix) {
    if (tecapi_child(__func__)) return TE_ERR_FORKED;
    return tego_store_watch(store, prefix);
}

int te_store_unwatch(te_store_t store, const char *prefix) {
    if (tecapi_child(__func__)) return TE_ERR_FORKED;
    return tego_store_unwatch(store, prefix);
}

int te_store_changes(te_store_t store, char *buf, size_t cap, size_t *len) {
    if (tecapi_child(__func__)) {
        if (len) *len = 0;
        return TE_ERR_FORKED;
    }
    return tego_store_changes(store, buf, cap, len);
}

int te_store_close(te_store_t store) {
    if (tecapi_child(__func__)) return TE_ERR_FORKED;
    return tego_store_close(store);
}

int te_layout_free(te_layout_t layout) {
    if (tecapi_child(__func__)) return TE_ERR_FORKED;
    return tego_layout_free(layout);
}

int te_plan_create(te_layout_t src, te_layout_t dst, const int32_t *src_blocks, size_t n_src,
        const int32_t *dst_blocks, size_t n_dst, int32_t layer_begin, int32_t layer_end,
        te_plan_t *out) {
    if (tecapi_child(__func__)) {
        if (out) *out = 0;
        return TE_ERR_FORKED;
    }
    return tego_plan_create(src, dst, src_blocks, n_src, dst_blocks, n_dst, layer_begin, layer_end, out);
}

int te_plan_stats(te_plan_t plan, te_plan_stats_t *out) {
    if (tecapi_child(__func__)) return TE_ERR_FORKED;
    return tego_plan_stats(plan, out);
}

int te_plan_transfers(te_plan_t plan, int32_t layer, te_plan_transfer_t *out, size_t cap,
        size_t *count) {
    if (tecapi_child(__func__)) return TE_ERR_FORKED;
    return tego_plan_transfers(plan, layer, out, cap, count);
}

int te_plan_submit_layer(te_batch_t batch, te_segment_t segment, te_plan_t plan, int32_t layer,
        int32_t opcode) {
    if (tecapi_child(__func__)) return TE_ERR_FORKED;
    return tego_plan_submit_layer(batch, segment, plan, layer, opcode);
}

int te_plan_submit(te_batch_t batch, te_segment_t segment, te_plan_t plan, int32_t opcode) {
    if (tecapi_child(__func__)) return TE_ERR_FORKED;
    return tego_plan_submit(batch, segment, plan, opcode);
}

int te_plan_free(te_plan_t plan) {
    if (tecapi_child(__func__)) return TE_ERR_FORKED;
    return tego_plan_free(plan);
}

int te_handoff_create(te_engine_t engine, const char *sidecar, te_handoff_t *out) {
    if (tecapi_child(__func__)) {
        if (out) *out = 0;
        return TE_ERR_FORKED;
    }
    return tego_handoff_create(engine, sidecar, out);
}

int te_handoff_destroy(te_handoff_t client) {
    if (tecapi_child(__func__)) return TE_ERR_FORKED;
    return tego_handoff_destroy(client);
}

int te_handoff_expect(te_handoff_t client, const char *id, te_layout_t layout,
        const int32_t *blocks, size_t n, int32_t mode, int64_t timeout_ms, te_xfer_t *out) {
    if (tecapi_child(__func__)) {
        if (out) *out = 0;
        return TE_ERR_FORKED;
    }
    return tego_handoff_expect(client, id, layout, blocks, n, mode, timeout_ms, out);
}

int te_handoff_ready(te_handoff_t client, const char *id, te_layout_t layout,
        const int32_t *blocks, size_t n, int32_t mode, int64_t timeout_ms, te_xfer_t *out) {
    if (tecapi_child(__func__)) {
        if (out) *out = 0;
        return TE_ERR_FORKED;
    }
    return tego_handoff_ready(client, id, layout, blocks, n, mode, timeout_ms, out);
}

int te_handoff_send_layer(te_xfer_t xfer, int32_t layer, int64_t timeout_ms) {
    if (tecapi_child(__func__)) return TE_ERR_FORKED;
    return tego_handoff_send_layer(xfer, layer, timeout_ms);
}

int te_handoff_wait(te_xfer_t xfer, int64_t timeout_ms, te_handoff_result_t *out) {
    if (tecapi_child(__func__)) return TE_ERR_FORKED;
    return tego_handoff_wait(xfer, timeout_ms, out);
}

int te_handoff_send(te_xfer_t xfer, int64_t timeout_ms, te_handoff_result_t *out) {
    if (tecapi_child(__func__)) return TE_ERR_FORKED;
    return tego_handoff_send(xfer, timeout_ms, out);
}

int te_handoff_abort(te_xfer_t xfer, const char *reason) {
    if (tecapi_child(__func__)) return TE_ERR_FORKED;
    return tego_handoff_abort(xfer, reason);
}

int te_handoff_status(te_xfer_t xfer, te_handoff_status_t *out) {
    if (tecapi_child(__func__)) return TE_ERR_FORKED;
    return tego_handoff_status(xfer, out);
}

int te_handoff_free(te_xfer_t xfer) {
    if (tecapi_child(__func__)) return TE_ERR_FORKED;
    return tego_handoff_free(xfer);
}
