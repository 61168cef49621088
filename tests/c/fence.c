/* fence: a terminal task state, te_unregister and te_destroy are fences, and
 * a peer without the cluster secret gets nothing, through te.h alone.
 *
 * The program re-executes itself as a target process (argv[1] == "target",
 * with the secret in TE_AUTH_SECRET) that serves a 16 MiB buffer filled with
 * 0x11 and answers "READY <segment> <addr>" on stdout; the initiator stops
 * and continues it with SIGSTOP/SIGCONT to play a hung peer.
 *
 *   1. An engine without the secret cannot open the target's segment
 *      (TE_ERR_AUTH) and learns no buffer.
 *   2. With the secret: READs from the stopped target end TE_TASK_TIMEOUT
 *      within the transfer timeout (the progress timeout, which would
 *      fail them as an unreachable peer, is longer); after te_wait reported
 *      them, a canary written into their memory survives the target's
 *      return.
 *   3. te_batch_cancel, then te_batch_reset reuses the batch.
 *   4. te_unregister of local memory under a stalled batch returns 0; the
 *      memory is unmapped at once (a late access would kill the test).
 *   5. te_destroy with 256 reads in flight returns with nothing left to
 *      touch their memory (canary after the target continues). */
#include <dirent.h>
#include <signal.h>
#include <spawn.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "testutil.h"

extern char **environ;

#define SECRET "fence-test-cluster-secret-0123456789"
#define SIZE (16u << 20)
#define BLOCK (64u << 10)

static te_config_t config(const char *secret) {
    te_config_t cfg = TE_CONFIG_INIT;
    cfg.listen_addr = "127.0.0.1:0";
    cfg.hostname = "127.0.0.1";
    cfg.force_transport = "tcp";
    cfg.transports = "tcp";
    cfg.rpc_timeout_ms = 5000;
    cfg.transfer_timeout_ms = 1000;
    cfg.progress_timeout_ms = 5000; /* the 1 s transfer timeout governs */
    cfg.unregister_grace_ms = 200;
    cfg.auth_secret = secret;
    return cfg;
}

static int target(void) {
    te_config_t cfg = config(NULL); /* the secret comes from TE_AUTH_SECRET */
    te_engine_t e;
    if (te_create(&cfg, &e) != 0) {
        fprintf(stderr, "target: create: %s\n", tu_last());
        return 1;
    }
    unsigned char *buf = mmap(NULL, SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (buf == MAP_FAILED) return 1;
    memset(buf, 0x11, SIZE);
    char name[256];
    if (te_register(e, buf, SIZE, "cpu", 1) != 0 || te_segment_name(e, name, sizeof name) != 0) {
        fprintf(stderr, "target: %s\n", tu_last());
        return 1;
    }
    printf("READY %s %llu\n", name, (unsigned long long)(uintptr_t)buf);
    fflush(stdout);
    char line[64];
    while (fgets(line, sizeof line, stdin)) {
    }
    te_destroy(e);
    return 0;
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* stop_peer SIGSTOPs pid and returns once every thread of it is stopped:
 * kill only queues the signal, and on a busy machine a running thread can
 * still serve a request before it stops. */
static void stop_peer(pid_t pid) {
    kill(pid, SIGSTOP);
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/task", (int)pid);
    for (int tries = 0; tries < 10000; tries++) { /* at most 10 s */
        DIR *d = opendir(path);
        if (d == NULL) return;
        int running = 0;
        struct dirent *de;
        while ((de = readdir(d)) != NULL) {
            if (de->d_name[0] == '.') continue;
            char stat[sizeof path + sizeof de->d_name + 8], buf[512]; /* room for any name: -Wformat-truncation */
            snprintf(stat, sizeof stat, "%s/%s/stat", path, de->d_name);
            FILE *f = fopen(stat, "r");
            if (f == NULL) continue;
            size_t n = fread(buf, 1, sizeof buf - 1, f);
            fclose(f);
            buf[n] = 0;
            char *p = strrchr(buf, ')');
            if (p == NULL || p[1] != ' ' || (p[2] != 'T' && p[2] != 't')) running = 1;
        }
        closedir(d);
        if (!running) return;
        usleep(1000);
    }
}

static void canary(unsigned char *p, size_t n) { memset(p, 0xC3, n); }

static int intact(const unsigned char *p, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (p[i] != 0xC3) return 0;
    return 1;
}

/* reads fills reqs with n READs of BLOCK bytes from the target into local. */
static void reads(te_request_t *reqs, size_t n, te_segment_t seg, unsigned char *local, uint64_t raddr) {
    for (size_t i = 0; i < n; i++)
        reqs[i] = (te_request_t){TE_READ, 0, local + i * BLOCK, seg, raddr + i * BLOCK, BLOCK};
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "target") == 0) return target();

    char *cargv[] = {argv[0], "target", NULL};
    size_t ne = 0;
    while (environ[ne]) ne++;
    char **env = calloc(ne + 2, sizeof *env);
    memcpy(env, environ, ne * sizeof *env);
    env[ne] = "TE_AUTH_SECRET=" SECRET;
    int to_child[2] = {-1, -1}, from_child[2] = {-1, -1};
    pid_t pid;
    if (tu_spawn(argv[0], cargv, env, &pid, &to_child[1], &from_child[0]) != 0) {
        perror("spawn");
        return 1;
    }
    FILE *in = fdopen(from_child[0], "r");
    char line[512], name[256];
    unsigned long long raddr = 0;
    if (!fgets(line, sizeof line, in) || sscanf(line, "READY %255s %llu", name, &raddr) != 2) {
        fprintf(stderr, "target did not start\n");
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        return 1;
    }

    /* 1. No secret: refused, nothing learned. */
    te_config_t cfg = config(NULL);
    te_engine_t anon = 0;
    CHECK_OK(te_create(&cfg, &anon));
    te_segment_t seg = 0;
    CHECK_RC(TE_ERR_AUTH, te_open_segment(anon, name, &seg));
    CHECK(strstr(tu_last(), "requires the cluster secret") != NULL);
    CHECK_OK(te_destroy(anon));

    cfg = config(SECRET);
    te_engine_t e = 0;
    CHECK_OK(te_create(&cfg, &e));
    const size_t n = 64;
    unsigned char *local = mmap(NULL, n * BLOCK, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK_OK(te_register(e, local, n * BLOCK, "cpu", 0));
    CHECK_OK(te_open_segment(e, name, &seg));
    te_request_t reqs[256];
    te_batch_t b = 0;
    te_batch_status_t st;
    CHECK_OK(te_allocate_batch(e, 256, &b));
    reads(reqs, 1, seg, local, raddr);
    CHECK_OK(te_submit(b, reqs, 1)); /* connections up before the stall */
    CHECK_OK(te_wait(b, 10000, &st));
    CHECK(local[0] == 0x11);
    CHECK_OK(te_batch_reset(b));

    /* 2. A stopped peer: reads end TIMEOUT, and nothing lands after. */
    stop_peer(pid);
    reads(reqs, n, seg, local, raddr);
    double t0 = now_s();
    CHECK_OK(te_submit(b, reqs, n));
    int rc = te_wait(b, 20000, &st);
    CHECK(rc == TE_ERR_TIMEOUT && st.state == TE_TASK_TIMEOUT && st.completed + st.failed == n);
    CHECK(now_s() - t0 < 10.0);
    canary(local, n * BLOCK);
    kill(pid, SIGCONT);
    usleep(300000);
    CHECK(intact(local, n * BLOCK));

    /* 3. Cancel, then reuse the batch. */
    CHECK_OK(te_batch_reset(b));
    stop_peer(pid);
    CHECK_OK(te_submit(b, reqs, n));
    CHECK_OK(te_batch_cancel(b));
    te_wait(b, 20000, &st);
    CHECK(st.state != TE_TASK_PENDING && st.completed + st.failed == n);
    CHECK_OK(te_batch_reset(b));
    kill(pid, SIGCONT);
    CHECK_OK(te_submit(b, reqs, n));
    CHECK_OK(te_wait(b, 20000, &st));
    CHECK(st.state == TE_TASK_COMPLETED && local[n * BLOCK - 1] == 0x11);
    CHECK_OK(te_batch_reset(b));

    /* 4. Unregister local memory under a stalled batch, then unmap it. */
    stop_peer(pid);
    CHECK_OK(te_submit(b, reqs, n));
    t0 = now_s();
    CHECK_OK(te_unregister(e, local));
    CHECK(now_s() - t0 < 10.0);
    te_wait(b, 0, &st);
    CHECK(st.state != TE_TASK_PENDING && st.completed + st.failed == n);
    munmap(local, n * BLOCK);
    kill(pid, SIGCONT);
    usleep(300000); /* still alive: nothing touched the unmapped memory */
    CHECK_OK(te_free_batch(b));

    /* 5. Destroy with 256 reads in flight. */
    unsigned char *big = mmap(NULL, SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK_OK(te_register(e, big, SIZE, "cpu", 0));
    CHECK_OK(te_allocate_batch(e, 256, &b));
    reads(reqs, 256, seg, big, raddr);
    stop_peer(pid);
    CHECK_OK(te_submit(b, reqs, 256));
    CHECK_OK(te_destroy(e));
    canary(big, SIZE);
    kill(pid, SIGCONT);
    usleep(300000);
    CHECK(intact(big, SIZE));
    munmap(big, SIZE);

    close(to_child[1]);
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    return tu_done("fence");
}
