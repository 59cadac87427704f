/* `accel launch` of real Python programs: the interpreter choice and an
 * Accelerate program forming one world. Building and testing accel never
 * needs Python: without python3 (or without torch + accelerate for the world
 * test) the checks are skipped and the test exits 77, which ctest reports as
 * skipped. Runs build/bin/accel next to itself. */
#include <fcntl.h>
#include <limits.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "cli_run.h"
#include "sibling_exe.h"

static char ACCEL[PATH_MAX + 32], TMP[PATH_MAX];
static char OUT[1 << 16], ERR[1 << 16];
static int skipped;

static const char *spit(const char *name, const char *text) {
    static char path[PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/%s", TMP, name);
    FILE *f = fopen(path, "w");
    fputs(text, f);
    fclose(f);
    return path;
}

static const cli_io IO = {TMP, OUT, ERR, sizeof OUT, sizeof ERR};

/* Runs argv (argv[0] searched on PATH); stdout/stderr into OUT/ERR. */
static int run(const char *const *argv) { return cli_run(&IO, NULL, argv, NULL, NULL); }

/* python3 on PATH (what accel launch uses without --python, $PYTHON, $VIRTUAL_ENV) can import `modules`. */
static bool python_has(const char *modules) {
    char code[256];
    snprintf(code, sizeof code, "import %s", modules);
    const char *a[] = {"python3", "-c", code, NULL};
    if (run(a) == 0) return true;
    fprintf(stderr, "skipped: python3 cannot `%s`\n", code);
    skipped++;
    return false;
}

/* Issue #11: --python chooses the interpreter of a .py program. */
static void test_python_flag(void) {
    if (!python_has("sys")) return;
    const char *which[] = {"python3", "-c", "import sys, os; print(os.path.realpath(sys.executable))", NULL};
    CHECK(run(which) == 0);
    char python[PATH_MAX], want[PATH_MAX + 16];
    snprintf(python, sizeof python, "%.*s", (int)strcspn(OUT, "\n"), OUT);
    snprintf(want, sizeof want, "exe=%s\n", python);
    const char *prog = spit("exe.py", "import sys, os\nprint('exe=' + os.path.realpath(sys.executable))\n");
    const char *a[] = {ACCEL, "launch", "--python", python, prog, NULL};
    CHECK(run(a) == 0);
    CHECK_STR_CONTAINS(OUT, want);
}

/* Issue #9: without --cpu, on a machine without a GPU, an Accelerate program
 * under `accel launch --num_processes 2` trained alone on each rank (world 1,
 * twice): ACCELERATE_USE_CPU=False made Accelerate look for a GPU backend. */
static void test_accelerate_world(void) {
    if (!python_has("torch, accelerate")) return;
    /* One write(2) per line (atomic on a pipe): the two ranks share the test's
     * stdout pipe, and print() reached it as separate writes of the text and
     * its newline, so the lines interleaved ("rank=0 world=2rank=1 world=2\n\n",
     * seen once in CI under ASan). */
    const char *prog = spit("world.py", "import os\n"
                                        "from accelerate import Accelerator\n"
                                        "acc = Accelerator()\n"
                                        "os.write(1, f'rank={acc.process_index} world={acc.num_processes}\\n'.encode())\n"
                                        "acc.wait_for_everyone()\n");
    const char *a[] = {ACCEL, "launch", "--num_processes", "2", prog, NULL};
    int rc = run(a);
    CHECK(rc == 0);
    CHECK_STR_CONTAINS(OUT, "rank=0 world=2\n");
    CHECK_STR_CONTAINS(OUT, "rank=1 world=2\n");
    if (rc != 0 || !strstr(OUT, "rank=0 world=2\n") || !strstr(OUT, "rank=1 world=2\n"))
        fprintf(stderr, "rc %d, stdout:\n%s\nstderr:\n%s\n", rc, OUT, ERR);
}

int main(void) {
    if (!sibling_exe("accel", ACCEL, sizeof ACCEL) || !cli_scratch("python", TMP, sizeof TMP)) return 1;
    unsetenv("PYTHON");
    unsetenv("VIRTUAL_ENV");
    RUN(test_python_flag);
    RUN(test_accelerate_world);
    cli_scratch_remove(TMP);
    int rc = check_summary();
    return rc ? rc : skipped ? 77 : 0;
}
