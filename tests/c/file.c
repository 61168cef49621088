/* file: storage buffers through te.h. Local: a file registered by path and
 * one by fd, written from memory and read back at 4 KiB and 1 MiB, O_DIRECT
 * and buffered, every byte checked; a misaligned request; the error paths of
 * te_register_file; a file truncated while registered (TE_ERR_IO on the
 * task). Remote: this program re-executes itself as a storage node
 * (argv[1] == "node") that registers a file; the initiator writes and reads
 * it over tcp behind the cluster secret, and an engine with another secret
 * is refused.
 * Usage: file DIR   (a directory on a file system that takes O_DIRECT) */
#include <fcntl.h>
#include <spawn.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testutil.h"

extern char **environ;

#define SIZE (4u << 20)
#define SECRET "c-file-test-secret-0123456789abcdef"

static te_engine_t engine(const char *secret) {
    te_config_t cfg = TE_CONFIG_INIT;
    cfg.listen_addr = "127.0.0.1:0";
    cfg.auth_secret = secret;
    cfg.log_level = TE_LOG_WARN;
    te_engine_t e = 0;
    if (te_create(&cfg, &e) != 0) {
        fprintf(stderr, "create: %s\n", tu_last());
        exit(1);
    }
    return e;
}

/* move submits n bytes in requests of bs between local and remote; returns
 * the batch state (TE_TASK_*) and the first task error in *err. */
static int move(te_engine_t e, te_segment_t seg, int32_t op, unsigned char *local, uint64_t remote, uint64_t n,
                uint64_t bs, int32_t *err) {
    size_t k = (size_t)((n + bs - 1) / bs);
    te_batch_t b;
    if (te_allocate_batch(e, k, &b) != 0) return -1;
    te_request_t *rq = calloc(k, sizeof *rq);
    for (size_t i = 0; i < k; i++) {
        uint64_t off = i * bs;
        rq[i].opcode = op;
        rq[i].local = local + off;
        rq[i].segment = seg;
        rq[i].remote = remote + off;
        rq[i].length = n - off < bs ? n - off : bs;
    }
    te_batch_status_t st = {0};
    int rc = te_submit(b, rq, k);
    if (rc == 0) {
        rc = te_wait(b, 60000, &st); /* a failed task's code, with out filled */
        if (rc != 0 && st.state != TE_TASK_PENDING) rc = 0;
    }
    free(rq);
    te_free_batch(b);
    if (err) *err = st.error;
    return rc != 0 ? rc : st.state;
}

static void roundtrip(te_engine_t e, te_segment_t seg, unsigned char *src, unsigned char *dst, uint64_t fa,
                      const char *what) {
    uint64_t sizes[] = {4u << 10, 1u << 20};
    for (int i = 0; i < 2; i++) {
        tu_fill(src, SIZE, (unsigned)(sizes[i] + 3));
        memset(dst, 0, SIZE);
        int32_t err = 0;
        int st = move(e, seg, TE_WRITE, src, fa, SIZE, sizes[i], &err);
        if (st != TE_TASK_COMPLETED) {
            fprintf(stderr, "%s: write bs %llu: state %d error %d: %s\n", what, (unsigned long long)sizes[i], st, err,
                    tu_last());
            tu_failures++;
        }
        st = move(e, seg, TE_READ, dst, fa, SIZE, sizes[i], &err);
        if (st != TE_TASK_COMPLETED) {
            fprintf(stderr, "%s: read bs %llu: state %d error %d\n", what, (unsigned long long)sizes[i], st, err);
            tu_failures++;
        }
        long long bad = tu_verify(dst, SIZE, (unsigned)(sizes[i] + 3));
        if (bad >= 0) {
            fprintf(stderr, "%s: bs %llu: byte %lld differs\n", what, (unsigned long long)sizes[i], bad);
            tu_failures++;
        }
    }
}

static int node(const char *dir) {
    te_engine_t e = engine(SECRET);
    char path[4096];
    snprintf(path, sizeof path, "%s/c-node", dir);
    int fd = open(path, O_CREAT | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0 || ftruncate(fd, SIZE) != 0) return 1;
    void *fa = NULL;
    if (te_register_file(e, NULL, fd, 0, SIZE, TE_FILE_REMOTE, &fa) != 0) {
        fprintf(stderr, "node: %s\n", tu_last());
        return 1;
    }
    close(fd); /* the library holds its own descriptors */
    /* A private file (no TE_FILE_REMOTE): peers must not reach it. */
    char ppath[4096];
    snprintf(ppath, sizeof ppath, "%s/c-node-private", dir);
    void *pa = NULL;
    if (te_register_file(e, ppath, -1, 0, 1u << 20, TE_FILE_CREATE, &pa) != 0) {
        fprintf(stderr, "node: private file: %s\n", tu_last());
        return 1;
    }
    char name[256];
    te_segment_name(e, name, sizeof name);
    printf("READY %s %llu %llu\n", name, (unsigned long long)(uintptr_t)fa, (unsigned long long)(uintptr_t)pa);
    fflush(stdout);
    char line[64];
    while (fgets(line, sizeof line, stdin) && strncmp(line, "EXIT", 4) != 0) {
    }
    CHECK_OK(te_unregister(e, fa));
    CHECK_OK(te_unregister(e, pa));
    te_destroy(e);
    unlink(path);
    unlink(ppath);
    return tu_failures != 0;
}

static void local(const char *dir, unsigned char *src, unsigned char *dst) {
    te_engine_t e = engine(SECRET);
    CHECK_OK(te_register(e, src, SIZE, "cpu", 0));
    CHECK_OK(te_register(e, dst, SIZE, "cpu", 0));
    char path[4096], name[256];
    snprintf(path, sizeof path, "%s/c-local", dir);
    te_segment_name(e, name, sizeof name);

    /* Error paths: nothing registered, a message left. */
    void *fa = (void *)1;
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_register_file(e, path, 3, 0, SIZE, TE_FILE_CREATE, &fa));
    CHECK(fa == NULL);
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_register_file(e, NULL, -1, 0, SIZE, 0, &fa));
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_register_file(e, path, -1, 0, SIZE, 0x100, &fa));
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_register_file(e, path, -1, 0, SIZE, 0, NULL));
    CHECK_RC(TE_ERR_NOT_FOUND, te_register_file(e, path, -1, 0, SIZE, TE_FILE_REMOTE, &fa));
    CHECK_RC(TE_ERR_INVALID_ARGUMENT, te_register_file(0, path, -1, 0, SIZE, 0, &fa));

    te_segment_t seg;
    /* Published, direct and buffered; then private (no TE_FILE_REMOTE),
     * which this engine reaches through its own segment as well. */
    const uint32_t modes[] = {TE_FILE_REMOTE | TE_FILE_CREATE, TE_FILE_REMOTE | TE_FILE_CREATE | TE_FILE_NO_DIRECT,
                              TE_FILE_CREATE};
    const char *what[] = {"local direct", "local buffered", "local private"};
    for (int m = 0; m < 3; m++) {
        CHECK_OK(te_register_file(e, path, -1, 8192, SIZE, modes[m], &fa));
        CHECK_OK(te_open_segment(e, name, &seg));
        te_buffer_desc_t own[4];
        size_t nown = 0;
        CHECK_OK(te_segment_buffers(seg, own, 4, &nown)); /* the engine's own view lists every file */
        CHECK(nown == 1 && own[0].addr == (uint64_t)(uintptr_t)fa && strcmp(own[0].location, "file") == 0);
        roundtrip(e, seg, src, dst, (uint64_t)(uintptr_t)fa, what[m]);
        /* Misaligned: odd address, offset and length; read back exactly. */
        tu_fill(src, 5001, 9);
        int32_t err;
        CHECK(move(e, seg, TE_WRITE, src + 1, (uint64_t)(uintptr_t)fa + 4097, 5000, 5000, &err) == TE_TASK_COMPLETED);
        memset(dst, 0, 5001);
        CHECK(move(e, seg, TE_READ, dst + 3, (uint64_t)(uintptr_t)fa + 4097, 5000, 5000, &err) == TE_TASK_COMPLETED);
        CHECK(memcmp(src + 1, dst + 3, 5000) == 0);
        /* The file's address is never a local side. */
        te_batch_t b;
        CHECK_OK(te_allocate_batch(e, 1, &b));
        te_request_t rq = {TE_READ, 0, fa, seg, (uint64_t)(uintptr_t)fa, 4096};
        CHECK(te_submit(b, &rq, 1) < 0);
        te_free_batch(b);
        te_close_segment(seg);
        CHECK_OK(te_unregister(e, fa));
    }
    /* By fd, then truncated while registered: reads past the end fail. */
    int fd = open(path, O_RDWR | O_CLOEXEC);
    CHECK(fd >= 0);
    CHECK_OK(te_register_file(e, NULL, fd, 0, SIZE, TE_FILE_REMOTE, &fa));
    close(fd);
    CHECK_OK(te_open_segment(e, name, &seg));
    CHECK(truncate(path, 1u << 20) == 0);
    int32_t err = 0;
    CHECK(move(e, seg, TE_READ, dst, (uint64_t)(uintptr_t)fa, 4096, 4096, &err) == TE_TASK_COMPLETED);
    CHECK(move(e, seg, TE_READ, dst, (uint64_t)(uintptr_t)fa + (2u << 20), 4096, 4096, &err) == TE_TASK_FAILED);
    CHECK(err == TE_ERR_IO);
    te_close_segment(seg);
    CHECK_OK(te_unregister(e, fa));
    unlink(path);
    CHECK_OK(te_destroy(e));
}

static void remote(const char *self, const char *dir, unsigned char *src, unsigned char *dst) {
    char *argv[] = {(char *)self, "node", (char *)dir, NULL};
    int to_child[2] = {-1, -1}, from_child[2] = {-1, -1};
    pid_t pid;
    if (tu_spawn(self, argv, environ, &pid, &to_child[1], &from_child[0]) != 0) exit(1);
    FILE *in = fdopen(from_child[0], "r"), *out = fdopen(to_child[1], "w");
    char line[512], name[256];
    unsigned long long faddr = 0, paddr = 0;
    if (!fgets(line, sizeof line, in) || sscanf(line, "READY %255s %llu %llu", name, &faddr, &paddr) != 3) {
        fprintf(stderr, "node said: %s\n", line);
        tu_failures++;
        return;
    }
    te_engine_t e = engine(SECRET);
    CHECK_OK(te_register(e, src, SIZE, "cpu", 0));
    CHECK_OK(te_register(e, dst, SIZE, "cpu", 0));
    te_segment_t seg;
    CHECK_OK(te_open_segment(e, name, &seg));
    te_buffer_desc_t bd[4];
    size_t nb = 0;
    CHECK_OK(te_segment_buffers(seg, bd, 4, &nb));
    /* The node's private file is not in its descriptor, and a request to
     * its address is refused. */
    CHECK(nb == 1 && bd[0].addr == faddr && bd[0].length == SIZE && strcmp(bd[0].location, "file") == 0);
    int32_t perr = 0;
    CHECK(move(e, seg, TE_READ, dst, paddr, 4096, 4096, &perr) != TE_TASK_COMPLETED);
    roundtrip(e, seg, src, dst, faddr, "remote");
    te_close_segment(seg);
    CHECK_OK(te_destroy(e));
    /* Another secret: refused before anything is learned. */
    te_engine_t bad = engine("not-the-cluster-secret-0123456789");
    CHECK_RC(TE_ERR_AUTH, te_open_segment(bad, name, &seg));
    te_destroy(bad);
    fprintf(out, "EXIT\n");
    fflush(out);
    int status;
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    fclose(in);
    fclose(out);
}

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "node") == 0) return node(argv[2]);
    if (argc != 2) {
        fprintf(stderr, "usage: file DIR\n");
        return 2;
    }
    unsigned char *src = mmap(NULL, SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    unsigned char *dst = mmap(NULL, SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (src == MAP_FAILED || dst == MAP_FAILED) return 1;
    local(argv[1], src, dst);
    remote(argv[0], argv[1], src, dst);
    return tu_done("file");
}
