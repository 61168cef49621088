/* Small helpers shared by the C test programs; they use only te.h. */
#ifndef TE_TESTUTIL_H
#define TE_TESTUTIL_H

#include <limits.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

#include "te.h"

static int tu_failures;

static inline const char *tu_last(void) {
    static __thread char buf[1024];
    if (te_last_error(buf, sizeof buf) < 0 && buf[0] == 0) snprintf(buf, sizeof buf, "(te_last_error failed)");
    return buf;
}

/* CHECK_OK: the call must return 0. */
#define CHECK_OK(call)                                                                                    \
    do {                                                                                                  \
        int rc_ = (call);                                                                                 \
        if (rc_ != 0) {                                                                                   \
            fprintf(stderr, "%s:%d: %s = %d, want 0: %s\n", __FILE__, __LINE__, #call, rc_, tu_last()); \
            tu_failures++;                                                                                \
        }                                                                                                 \
    } while (0)

/* CHECK_RC: the call must fail with want, and leave a message behind. */
#define CHECK_RC(want, call)                                                                             \
    do {                                                                                                 \
        int rc_ = (call);                                                                                \
        if (rc_ != (want)) {                                                                             \
            fprintf(stderr, "%s:%d: %s = %d, want %d (%s): %s\n", __FILE__, __LINE__, #call, rc_, (want), \
                    #want, tu_last());                                                                   \
            tu_failures++;                                                                               \
        } else if ((want) != 0 && tu_last()[0] == 0) {                                                  \
            fprintf(stderr, "%s:%d: %s failed without a message\n", __FILE__, __LINE__, #call);          \
            tu_failures++;                                                                               \
        }                                                                                                \
    } while (0)

#define CHECK(cond)                                                                 \
    do {                                                                            \
        if (!(cond)) {                                                              \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
            tu_failures++;                                                          \
        }                                                                           \
    } while (0)

/* A deterministic byte pattern: position i of stream seed. Offsets that are
 * off by any amount give different bytes. */
static inline unsigned char tu_pattern(uint64_t i, unsigned seed) {
    uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull ^ ((uint64_t)seed << 32);
    x ^= x >> 29;
    return (unsigned char)(x ^ (x >> 17));
}

static inline void tu_fill(unsigned char *p, uint64_t n, unsigned seed) {
    for (uint64_t i = 0; i < n; i++) p[i] = tu_pattern(i, seed);
}

/* tu_verify returns the index of the first wrong byte, or -1. */
static inline long long tu_verify(const unsigned char *p, uint64_t n, unsigned seed) {
    for (uint64_t i = 0; i < n; i++)
        if (p[i] != tu_pattern(i, seed)) return (long long)i;
    return -1;
}

static inline int tu_done(const char *name) {
    if (tu_failures) {
        fprintf(stderr, "%s: %d check(s) failed\n", name, tu_failures);
        return 1;
    }
    printf("%s: ok\n", name);
    return 0;
}

/* tu_spawn starts path with argv and envp, its standard input and output
 * connected to pipes: *to is the write end of its input, *from the read end
 * of its output. Returns 0, or -1 with nothing left open.
 * With TE_TEST_EXEC set (make test-arm64: arm64 programs run under
 * qemu-user, which does not follow execve into another arm64 binary) it
 * starts that emulator with path's real path first (under the emulator
 * /proc/self/exe reads as the program, for the emulator it would be itself). */
static inline int tu_spawn(const char *path, char *const argv[], char *const envp[], pid_t *pid, int *to,
                           int *from) {
    const char *emu = getenv("TE_TEST_EXEC");
    char real[4096];
    char *wrapped[64];
    if (emu && *emu) {
        size_t n = 0;
        while (argv[n]) n++;
        if (n + 2 > sizeof wrapped / sizeof wrapped[0] || !realpath(path, real)) return -1;
        wrapped[0] = (char *)emu;
        wrapped[1] = real;
        for (size_t i = 1; i <= n; i++) wrapped[i + 1] = argv[i]; /* argv[n] is the NULL */
        path = emu;
        argv = wrapped;
    }
    int in[2], out[2];
    if (pipe(in)) return -1;
    if (pipe(out)) {
        close(in[0]);
        close(in[1]);
        return -1;
    }
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, in[0], 0);
    posix_spawn_file_actions_adddup2(&fa, out[1], 1);
    posix_spawn_file_actions_addclose(&fa, in[1]);
    posix_spawn_file_actions_addclose(&fa, out[0]);
    int err = posix_spawn(pid, path, &fa, NULL, argv, envp);
    posix_spawn_file_actions_destroy(&fa);
    close(in[0]);
    close(out[1]);
    if (err != 0) {
        close(in[1]);
        close(out[0]);
        return -1;
    }
    *to = in[1];
    *from = out[0];
    return 0;
}

#endif
