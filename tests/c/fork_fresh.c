/* fork_fresh checks the other half of te.h's fork rule: a process that has
 * never loaded libte may fork, and the child may load it (dlopen) and use
 * it: create an engine, copy bytes through it, destroy it. This program is
 * not linked with libte; argv[1] is the library's path. The parent waits
 * for the child with a deadline, so a hang fails the test. */
#include <dlfcn.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "te.h"

/* The functions the child calls, looked up with dlsym. */
static struct {
    int (*create)(const te_config_t *, te_engine_t *);
    int (*segment_name)(te_engine_t, char *, size_t);
    int (*reg)(te_engine_t, void *, uint64_t, const char *, int32_t);
    int (*open_segment)(te_engine_t, const char *, te_segment_t *);
    int (*allocate_batch)(te_engine_t, size_t, te_batch_t *);
    int (*submit)(te_batch_t, const te_request_t *, size_t);
    int (*wait)(te_batch_t, int64_t, te_batch_status_t *);
    int (*free_batch)(te_batch_t);
    int (*destroy)(te_engine_t);
    int (*last_error)(char *, size_t);
} te;

static int child(const char *path) {
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) {
        fprintf(stderr, "child: dlopen %s: %s\n", path, dlerror());
        return 1;
    }
    struct {
        const char *name;
        void **fn;
    } syms[] = {
        {"te_create", (void **)&te.create},         {"te_segment_name", (void **)&te.segment_name},
        {"te_register", (void **)&te.reg},          {"te_open_segment", (void **)&te.open_segment},
        {"te_allocate_batch", (void **)&te.allocate_batch}, {"te_submit", (void **)&te.submit},
        {"te_wait", (void **)&te.wait},             {"te_free_batch", (void **)&te.free_batch},
        {"te_destroy", (void **)&te.destroy},       {"te_last_error", (void **)&te.last_error},
    };
    for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++) {
        *syms[i].fn = dlsym(h, syms[i].name);
        if (*syms[i].fn == NULL) {
            fprintf(stderr, "child: %s missing\n", syms[i].name);
            return 1;
        }
    }
    te_config_t cfg = TE_CONFIG_INIT;
    cfg.listen_addr = "127.0.0.1:0";
    te_engine_t e;
    te_segment_t s;
    te_batch_t b;
    char name[256], msg[1024];
    unsigned char *buf = mmap(NULL, 8192, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (buf == MAP_FAILED) return 1;
    for (int i = 0; i < 4096; i++) buf[i] = (unsigned char)(i * 7 + 3);
    int rc = te.create(&cfg, &e);
    if (rc == 0) rc = te.segment_name(e, name, sizeof name);
    if (rc == 0) rc = te.reg(e, buf, 8192, "cpu", 1);
    if (rc == 0) rc = te.open_segment(e, name, &s);
    if (rc == 0) rc = te.allocate_batch(e, 1, &b);
    if (rc == 0) {
        te_request_t r = {TE_WRITE, 0, buf, s, (uint64_t)(uintptr_t)(buf + 4096), 4096};
        rc = te.submit(b, &r, 1);
    }
    if (rc == 0) rc = te.wait(b, 10000, NULL);
    if (rc == 0) rc = te.free_batch(b);
    if (rc == 0 && memcmp(buf, buf + 4096, 4096) != 0) {
        fprintf(stderr, "child: bytes differ after the transfer\n");
        return 1;
    }
    if (rc == 0) rc = te.destroy(e);
    if (rc != 0) {
        te.last_error(msg, sizeof msg);
        fprintf(stderr, "child: rc %d: %s\n", rc, msg);
        return 1;
    }
    printf("child: engine %s created, used and destroyed\n", name);
    fflush(stdout);
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s path/to/libte.so\n", argv[0]);
        return 2;
    }
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) _exit(child(argv[1]));
    if (pid < 0) {
        perror("fork");
        return 1;
    }
    struct timespec start, now, tick = {0, 1000000};
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (;;) {
        int st;
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid) {
            if (WIFEXITED(st) && WEXITSTATUS(st) == 0) {
                printf("fork_fresh: ok\n");
                return 0;
            }
            fprintf(stderr, "fork_fresh: child ended with status %#x\n", st);
            return 1;
        }
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (r < 0 || now.tv_sec - start.tv_sec > 60) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            fprintf(stderr, "fork_fresh: child did not finish within 60 s\n");
            return 1;
        }
        nanosleep(&tick, NULL);
    }
}
