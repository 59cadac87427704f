/* Running a program from a CLI test (test_cli_*.c): its stdout and stderr
 * captured into the test's buffers, its stdin from a file (else /dev/null),
 * "K=V" variables added to its environment; and the scratch directory the
 * captures live in. */
#ifndef ACCEL_TESTS_CLI_RUN_H
#define ACCEL_TESTS_CLI_RUN_H

#include <fcntl.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

/* path's text into buf (n bytes, NUL-terminated; "" when it cannot be read). */
static inline void cli_slurp(const char *path, char *buf, size_t n) {
    buf[0] = 0;
    FILE *f = fopen(path, "r");
    if (!f) return;
    buf[fread(buf, 1, n - 1, f)] = 0;
    fclose(f);
}

/* Where a test's runs write: its scratch directory and capture buffers. */
typedef struct cli_io {
    const char *dir;
    char *out, *err;
    size_t out_n, err_n;
} cli_io;

/* Runs exe with the NULL-terminated args after it (exe NULL: args[0] is the
 * program, looked up on PATH), env's "K=V" entries added (NULL: none), stdin
 * from the file `in` (NULL: /dev/null). Its stdout and stderr into io->out
 * and io->err; returns its exit status, or 128 + the signal that ended it. */
static inline int cli_run(const cli_io *io, const char *exe, const char *const *args, const char *const *env,
                          const char *in) {
    char o[PATH_MAX + 16], e[PATH_MAX + 16];
    snprintf(o, sizeof o, "%s/out", io->dir);
    snprintf(e, sizeof e, "%s/err", io->dir);
    const char *argv[64] = {exe};
    int at = exe ? 1 : 0;
    for (int i = 0; args[i] && at < 63; i++) argv[at++] = args[i];
    pid_t pid = fork();
    if (pid == 0) {
        int fo = open(o, O_WRONLY | O_CREAT | O_TRUNC, 0644), fe = open(e, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        int fi = open(in ? in : "/dev/null", O_RDONLY);
        dup2(fi, 0);
        dup2(fo, 1);
        dup2(fe, 2);
        for (int i = 0; env && env[i]; i++) putenv((char *)env[i]);
        if (exe) execv(exe, (char *const *)argv);
        else execvp(argv[0], (char *const *)argv);
        _exit(127);
    }
    int st;
    waitpid(pid, &st, 0);
    cli_slurp(o, io->out, io->out_n);
    cli_slurp(e, io->err, io->err_n);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* A fresh scratch directory /tmp/accel_test_<name>_XXXXXX into dir (n
 * bytes), HF_HOME pointed at it so that no default config of the machine
 * leaks in; false, after saying so, when it cannot be made. */
static inline bool cli_scratch(const char *name, char *dir, size_t n) {
    snprintf(dir, n, "/tmp/accel_test_%s_XXXXXX", name);
    if (!mkdtemp(dir)) {
        perror(dir);
        return false;
    }
    setenv("HF_HOME", dir, 1);
    return true;
}

/* rm -rf dir (a scratch directory cli_scratch made). */
static inline void cli_scratch_remove(const char *dir) {
    char cmd[PATH_MAX + 16];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) fprintf(stderr, "cannot remove %s\n", dir);
}

#endif
