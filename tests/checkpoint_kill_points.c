/* A save killed at every one of its steps leaves a loadable checkpoint, for
 * total_limit 1, 2 and 3 and for a save over an existing directory; a sharded
 * save_model, and io's accel_save_sharded (over shards, and over one file),
 * killed, or failing as on a full disk, at every one of its steps leave the
 * previous model or the new one, never a mix of shards.
 *
 * Built with src/accelerator/checkpoint.c, save.c, src/core/afile.c (the atomic writer) and
 * src/core/staged_dir.c (the staged directories, io's writer's too) compiled in and their fault-injection points on (tests/checkpoint.cmake):
 * accel__ckpt_fault below runs at each step of a save after which the disk
 * changes (temporary directory made, each entry carried over, each write of
 * each file, each file renamed into place, marker written, directories
 * swapped, each old checkpoint renamed away, each entry removed). For k = 1, 2, ... a forked child saves and SIGKILLs
 * itself at the k-th point, on top of whatever the previous kills left, until a
 * save finishes before reaching k. After every kill: load_state(NULL) succeeds
 * and gives the newest save or the one before it, whole (model and RNG state
 * from the same save), and every entry named checkpoint_<N> loads. A
 * save_state failing at every point, and one into a file, leave the previous
 * state and nothing beside it. */
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "accel/accel.h"
#include "accel/accelerator.h"
#include "check.h"

static long kill_at, fail_at, points_seen;
/* At the load's point: swap_dir takes swap_with's name and the other's (as a
 * save over swap_dir by another process does), and with swap_remove the
 * directory swapped away is removed (as that save then removes it). */
static const char *swap_dir, *swap_with;
static bool swap_remove;
/* A writer in late_dir while a save over it runs: at the swap's point it
 * makes, replaces and extends entries by late_dir's name, and after the swap
 * makes one through late_fd, a descriptor of the directory the swap replaced. */
static const char *late_dir;
static int late_fd = -1;
static void late_writes(const char *step);
/* At the point after the staged directory is made: one byte written to
 * staged_pipe, then a nap of staged_nap_ms, or a SIGSTOP with staged_stop. */
static int staged_pipe = -1, staged_nap_ms;
static bool staged_stop;

static void rm_tree(const char *dir);

bool accel__ckpt_fault(const char *step);
bool accel__ckpt_fault(const char *step) {
    if (swap_dir && !strcmp(step, "load: models and optimizers read")) {
        CHECK(renameat2(AT_FDCWD, swap_dir, AT_FDCWD, swap_with, RENAME_EXCHANGE) == 0);
        if (swap_remove) rm_tree(swap_with);
        swap_dir = NULL;
    }
    if (late_dir) late_writes(step);
    if (staged_pipe >= 0 && !strcmp(step, "save: temporary directory made")) {
        CHECK(write(staged_pipe, "s", 1) == 1);
        if (staged_stop) raise(SIGSTOP);
        nanosleep(&(struct timespec){0, staged_nap_ms * 1000000L}, NULL);
    }
    if (++points_seen == kill_at) raise(SIGKILL);
    return points_seen == fail_at;
}

typedef struct run {
    accel_accelerator *acc;
    accel_module *model;
    accel_optimizer *opt;
    accel_lr_scheduler *sched;
    accel_tensor *w; /* the first parameter */
} run;

static void run_make(run *r, const char *project_dir, int total_limit) {
    accel_accelerator_opts o = accel_accelerator_opts_default();
    o.mixed_precision = "no";
    o.project_dir = project_dir;
    o.automatic_checkpoint_naming = total_limit > 0;
    o.total_limit = total_limit;
    r->acc = accel_accelerator_new(&o);
    accel_manual_seed(1);
    r->model = accel_linear_new(3, 2, true, ACCEL_CPU_DEVICE, ACCEL_F32);
    accel_tensor **ps;
    int n = accel_module_parameters(r->model, &ps);
    accel_optim_hparams h = accel_optim_defaults(ACCEL_OPTIM_ADAMW, 0.01);
    r->opt = accel_optimizer_new_params(ACCEL_OPTIM_ADAMW, n, ps, &h);
    accel_free(ps);
    r->sched = accel_lr_scheduler_new(r->opt, ACCEL_SCHED_COSINE, 3, 40);
    CHECK(r->acc && accel_accelerator_prepare(r->acc, r->model, r->opt, NULL, r->sched) == ACCEL_OK);
    accel_module_parameters(r->model, &ps);
    r->w = ps[0];
    accel_free(ps);
}

static void run_free(run *r) {
    CHECK_MSG(accel_accelerator_clear(r->acc) == ACCEL_OK, "%s", accel_last_error());
    accel_lr_scheduler_free(r->sched);
    accel_optimizer_free(r->opt);
    accel_module_free(r->model);
    accel_accelerator_free(r->acc);
}

/* Save number `id` carries id in a weight (model file) and in the RNG seed
 * (random_states file). */
static void mark(run *r, int id) {
    ((float *)r->w->data)[0] = 1000.0f + (float)id;
    accel_manual_seed((uint64_t)id);
}

/* The id of the state now loaded; -1 when the two files disagree. */
static int loaded_id(run *r) {
    int id = (int)accel_default_rng()->seed;
    return ((float *)r->w->data)[0] == 1000.0f + (float)id ? id : -1;
}

/* Saves in a child killed at its k-th kill point; true when it was killed. */
static bool save_killed_at(run *r, long k, int id, const char *dir) {
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        mark(r, id);
        points_seen = 0;
        kill_at = k;
        accel_status s = accel_accelerator_save_state(r->acc, dir, NULL, 0);
        _exit(s == ACCEL_OK ? 0 : 1);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    bool killed = WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
    CHECK_MSG(killed || (WIFEXITED(status) && WEXITSTATUS(status) == 0), "save %d (kill point %ld) failed", id, k);
    return killed;
}

/* Every checkpoint_<N> in root loads when named explicitly; returns how many
 * there are and whether any other entry is left. */
static int check_all_load(run *r, const char *root, bool *leftovers) {
    int n = 0;
    *leftovers = false;
    DIR *d = opendir(root);
    for (struct dirent *e; d && (e = readdir(d));) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        if (strncmp(e->d_name, "checkpoint_", 11)) {
            *leftovers = true;
            continue;
        }
        char p[600];
        snprintf(p, sizeof p, "%s/%s", root, e->d_name);
        CHECK_MSG(accel_accelerator_load_state(r->acc, p, NULL) == ACCEL_OK, "%s", accel_last_error());
        n++;
    }
    if (d) closedir(d);
    return n;
}

static void rm_tree(const char *dir) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0);
}

static void sweep_kills(int total_limit) {
    char project[300], root[340];
    snprintf(project, sizeof project, "/tmp/accel_ckpt_kill_%d_%d", (int)getpid(), total_limit);
    snprintf(root, sizeof root, "%s/checkpoints", project);
    rm_tree(project);
    run r;
    run_make(&r, project, total_limit);
    int id = 0;
    for (; id < total_limit; id++) { /* full: the next save rotates */
        mark(&r, id);
        CHECK(accel_accelerator_save_state(r.acc, NULL, NULL, 0) == ACCEL_OK);
    }
    int newest = id - 1, kills = 0;
    for (long k = 1;; k++, id++) {
        bool killed = save_killed_at(&r, k, id, NULL);
        kills += killed;
        CHECK_MSG(accel_accelerator_load_state(r.acc, NULL, NULL) == ACCEL_OK, "total_limit %d, kill point %ld: %s",
                  total_limit, k, accel_last_error());
        int got = loaded_id(&r);
        CHECK_MSG(got == newest || got == id, "total_limit %d, kill point %ld: loaded save %d, want %d or %d",
                  total_limit, k, got, newest, id);
        newest = got;
        bool leftovers;
        int n = check_all_load(&r, root, &leftovers);
        if (!killed) { /* a whole save: exactly total_limit checkpoints, nothing else */
            CHECK_MSG(n == total_limit && !leftovers, "total_limit %d: %d checkpoints%s after a whole save",
                      total_limit, n, leftovers ? " and leftovers" : "");
            break;
        }
    }
    CHECK_MSG(kills >= 12, "total_limit %d: only %d kill points", total_limit, kills);
    run_free(&r);
    rm_tree(project);
}

static void test_kill_every_point_total_limit_1(void) { sweep_kills(1); }
static void test_kill_every_point_total_limit_2(void) { sweep_kills(2); }
static void test_kill_every_point_total_limit_3(void) { sweep_kills(3); }

/* A run whose save 0 is in project (/tmp/accel_ckpt_<tag>_<pid>_dir, made new). */
static void start_saved(run *r, char *project, size_t n, const char *tag) {
    snprintf(project, n, "/tmp/accel_ckpt_%s_%d_dir", tag, (int)getpid());
    rm_tree(project);
    run_make(r, project, 0);
    mark(r, 0);
    CHECK(accel_accelerator_save_state(r->acc, project, NULL, 0) == ACCEL_OK);
}

/* save_state(dir) over an existing dir: killed anywhere, dir holds the old or
 * the new state. */
static void test_kill_every_point_overwrite(void) {
    char project[300];
    run r;
    start_saved(&r, project, sizeof project, "kill");
    int newest = 0, kills = 0;
    for (long k = 1;; k++) {
        bool killed = save_killed_at(&r, k, (int)k, project);
        kills += killed;
        CHECK_MSG(accel_accelerator_load_state(r.acc, project, NULL) == ACCEL_OK, "kill point %ld: %s", k,
                  accel_last_error());
        int got = loaded_id(&r);
        CHECK_MSG(got == newest || got == k, "kill point %ld: loaded save %d, want %d or %ld", k, got, newest, k);
        newest = got;
        if (!killed) break;
    }
    CHECK_MSG(kills >= 8, "only %d kill points", kills);
    run_free(&r);
    rm_tree(project);
}

/* No hidden staging directory is left beside dir. */
static bool no_leftover(const char *dir) {
    char tmp[700];
    const char *slash = strrchr(dir, '/');
    snprintf(tmp, sizeof tmp, "%.*s/.%s.accel-staging", (int)(slash - dir), dir, slash + 1);
    return access(tmp, F_OK) != 0;
}

/* save_state(dir) over an existing dir failing at every point (a full disk):
 * the save reports it, dir holds the previous state, and no staged copy is
 * left beside it (it stayed, as big as the checkpoint, holding the space). */
static void test_save_state_fails_at_every_point(void) {
    char project[300];
    run r;
    start_saved(&r, project, sizeof project, "fail");
    int fails = 0;
    for (long k = 1;; k++) {
        mark(&r, (int)k);
        points_seen = 0;
        fail_at = k;
        accel_status s = accel_accelerator_save_state(r.acc, project, NULL, 0);
        fail_at = 0;
        bool reached = points_seen >= k;
        if (s != ACCEL_OK) {
            fails++;
            CHECK_STR_CONTAINS(accel_last_error(), "(injected)");
            accel_clear_error();
            CHECK_MSG(no_leftover(project), "fail point %ld: the staging directory is left", k);
        }
        CHECK_MSG(accel_accelerator_load_state(r.acc, project, NULL) == ACCEL_OK, "fail point %ld: %s", k,
                  accel_last_error());
        CHECK_MSG(loaded_id(&r) == (s == ACCEL_OK ? k : 0), "fail point %ld: loaded save %d after a %s save", k,
                  loaded_id(&r), s == ACCEL_OK ? "successful" : "failed");
        if (s == ACCEL_OK) { /* back to save 0 for the next point */
            mark(&r, 0);
            CHECK(accel_accelerator_save_state(r.acc, project, NULL, 0) == ACCEL_OK);
        }
        if (!reached) break;
    }
    CHECK_MSG(fails >= 8, "only %d fail points", fails);
    run_free(&r);
    rm_tree(project);
}

/* A load whose directory another process's save swaps away between its
 * files (the new directory takes the name; then the old one is removed): the
 * load reads the directory it opened and checked, whole (it read the model of
 * one save and the RNG state of the other, each file passing its checks), or,
 * that directory removed meanwhile, fails naming the directory the user gave;
 * never a mix. */
static void test_load_pins_its_directory(void) {
    char project[300], other[340];
    run r;
    start_saved(&r, project, sizeof project, "pin");
    snprintf(other, sizeof other, "%s_other", project);
    rm_tree(other);
    mark(&r, 1);
    CHECK(accel_accelerator_save_state(r.acc, other, NULL, 0) == ACCEL_OK);
    swap_dir = project, swap_with = other, swap_remove = false;
    mark(&r, 7);
    CHECK_MSG(accel_accelerator_load_state(r.acc, project, NULL) == ACCEL_OK, "%s", accel_last_error());
    CHECK_MSG(swap_dir == NULL, "the load passed no swap point");
    CHECK_MSG(loaded_id(&r) == 0, "loaded %d, not the save it checked (0): a mix is -1", loaded_id(&r));
    swap_dir = project, swap_with = other, swap_remove = true; /* project holds save 1 now */
    mark(&r, 7);
    accel_status s = accel_accelerator_load_state(r.acc, project, NULL);
    CHECK_MSG(s != ACCEL_OK, "a load of a removed directory succeeded (loaded %d)", loaded_id(&r));
    CHECK_STR_CONTAINS(accel_last_error(), project);
    CHECK_MSG(!strstr(accel_last_error(), "/proc/"), "the error names the pinned path: %s", accel_last_error());
    accel_clear_error();
    run_free(&r);
    rm_tree(project);
    rm_tree(other);
}

static void put(const char *dir, const char *name, const char *text) {
    char p[700];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "w");
    CHECK_MSG(f && fputs(text, f) >= 0 && fclose(f) == 0, "cannot write %s", p);
}

static bool holds(const char *dir, const char *name, const char *text) {
    char p[700], buf[64] = "";
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "r");
    bool ok = f && fgets(buf, sizeof buf, f) && !strcmp(buf, text);
    if (f) fclose(f);
    return ok;
}

static void late_writes(const char *step) {
    char p[700], q[700];
    if (!strcmp(step, "commit: before the swap")) {
        put(late_dir, "late.txt", "late\n");
        put(late_dir, ".notes.new", "v2\n"); /* an editor's save: written beside, renamed over */
        snprintf(p, sizeof p, "%s/.notes.new", late_dir);
        snprintf(q, sizeof q, "%s/notes.txt", late_dir);
        CHECK(rename(p, q) == 0);
        put(late_dir, "logs/late.log", "late log\n");
        snprintf(p, sizeof p, "%s/late_dir", late_dir);
        CHECK(mkdir(p, 0755) == 0);
        put(late_dir, "late_dir/f", "f\n");
    } else if (!strcmp(step, "commit: directories exchanged")) {
        int fd = openat(late_fd, "via_fd.txt", O_CREAT | O_WRONLY, 0644);
        CHECK(fd >= 0 && write(fd, "fd\n", 3) == 3 && close(fd) == 0);
        late_dir = NULL;
    }
}

/* A writer's entries made in a directory while a save over it runs (a
 * logger's, another process's) are in the directory after the save, beside
 * the new checkpoint: new ones, one renamed over a file the save carried, one
 * in a carried folder, a new folder, one made after the swap through a
 * descriptor of the replaced directory. They were removed with it. */
static void test_writes_during_the_save_kept(void) {
    char project[300], logs[340];
    run r;
    start_saved(&r, project, sizeof project, "late");
    put(project, "notes.txt", "v1\n");
    snprintf(logs, sizeof logs, "%s/logs", project);
    CHECK(mkdir(logs, 0755) == 0);
    put(logs, "a.log", "a\n");
    late_fd = open(project, O_RDONLY | O_DIRECTORY);
    CHECK(late_fd >= 0);
    late_dir = project;
    mark(&r, 3);
    CHECK_MSG(accel_accelerator_save_state(r.acc, project, NULL, 0) == ACCEL_OK, "%s", accel_last_error());
    CHECK_MSG(late_dir == NULL, "the save passed no swap point");
    late_dir = NULL;
    close(late_fd);
    CHECK_MSG(holds(project, "late.txt", "late\n"), "a file made during the save was lost");
    CHECK_MSG(holds(project, "notes.txt", "v2\n"), "a file replaced during the save went back to the old one");
    CHECK_MSG(holds(logs, "a.log", "a\n") && holds(logs, "late.log", "late log\n"), "a folder's entry was lost");
    CHECK_MSG(holds(project, "late_dir/f", "f\n"), "a folder made during the save was lost");
    CHECK_MSG(holds(project, "via_fd.txt", "fd\n"), "a file made in the replaced directory was lost");
    CHECK(no_leftover(project));
    mark(&r, 9);
    CHECK_MSG(accel_accelerator_load_state(r.acc, project, NULL) == ACCEL_OK, "%s", accel_last_error());
    CHECK(loaded_id(&r) == 3);
    run_free(&r);
    rm_tree(project);
}

/* A child saving save 1 into project, paused (stop: stopped) once its staged
 * directory is made; returns its pid when it got there. */
static pid_t pausing_saver(run *r, const char *project, int nap_ms, bool stop) {
    int p[2];
    CHECK(pipe(p) == 0);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        close(p[0]);
        staged_pipe = p[1], staged_nap_ms = nap_ms, staged_stop = stop;
        mark(r, 1);
        _exit(accel_accelerator_save_state(r->acc, project, NULL, 0) == ACCEL_OK ? 0 : 1);
    }
    close(p[1]);
    char c;
    CHECK(read(p[0], &c, 1) == 1);
    close(p[0]);
    return pid;
}

/* Two saves into one directory at once (two jobs; a retry while the first
 * runs): the second waits for the first (each removed the other's staged
 * directory as a leftover: one failed, and the directory held no model), and
 * both succeed, the last one's state loading whole. A first save that stops
 * (SIGSTOP) holds the second for ACCEL_WRITE_STALL_TIMEOUT only:
 * ACCEL_ERR_TIMEOUT naming its pid, nothing changed. */
static void test_concurrent_saves_take_turns(void) {
    char project[300];
    run r;
    start_saved(&r, project, sizeof project, "twice");
    pid_t pid = pausing_saver(&r, project, 300, false);
    mark(&r, 2);
    CHECK_MSG(accel_accelerator_save_state(r.acc, project, NULL, 0) == ACCEL_OK, "%s", accel_last_error());
    int status = 0;
    CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0);
    mark(&r, 9);
    CHECK_MSG(accel_accelerator_load_state(r.acc, project, NULL) == ACCEL_OK, "%s", accel_last_error());
    CHECK_MSG(loaded_id(&r) == 2, "loaded save %d, want the later one (2)", loaded_id(&r));
    CHECK(no_leftover(project));

    pid = pausing_saver(&r, project, 0, true);
    setenv("ACCEL_WRITE_STALL_TIMEOUT", "0.3", 1);
    mark(&r, 3);
    CHECK(accel_accelerator_save_state(r.acc, project, NULL, 0) == ACCEL_ERR_TIMEOUT);
    char want[64];
    snprintf(want, sizeof want, "the save of pid %d (stopped)", (int)pid);
    CHECK_STR_CONTAINS(accel_last_error(), want);
    accel_clear_error();
    unsetenv("ACCEL_WRITE_STALL_TIMEOUT");
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    CHECK_MSG(accel_accelerator_load_state(r.acc, project, NULL) == ACCEL_OK, "%s", accel_last_error());
    CHECK(loaded_id(&r) == 2);
    run_free(&r);
    rm_tree(project);
}

/* save_state into what is no directory: refused before anything is written
 * (it wrote the whole save beside it, failed the rename and left the copy),
 * the file untouched; an empty name is refused. */
static void test_save_state_into_non_directory(void) {
    char project[300], file[340], dangling[340];
    snprintf(project, sizeof project, "/tmp/accel_ckpt_nodir_%d", (int)getpid());
    rm_tree(project);
    run r;
    run_make(&r, project, 0);
    snprintf(file, sizeof file, "%s/notes.txt", project);
    snprintf(dangling, sizeof dangling, "%s/gone", project);
    CHECK(mkdir(project, 0755) == 0);
    FILE *f = fopen(file, "w");
    CHECK(f && fputs("keep me\n", f) >= 0 && fclose(f) == 0);
    CHECK(symlink("nowhere", dangling) == 0);
    points_seen = 0;
    CHECK(accel_accelerator_save_state(r.acc, file, NULL, 0) == ACCEL_ERR_IO);
    CHECK_STR_CONTAINS(accel_last_error(), "should be a directory, not a file");
    CHECK_MSG(points_seen == 0, "%ld disk changes before the refusal", points_seen);
    CHECK(no_leftover(file));
    char got[32] = "";
    f = fopen(file, "r");
    CHECK(f && fgets(got, sizeof got, f) && !strcmp(got, "keep me\n"));
    if (f) fclose(f);
    CHECK(accel_accelerator_save_state(r.acc, dangling, NULL, 0) == ACCEL_ERR_IO);
    CHECK_STR_CONTAINS(accel_last_error(), "a link that leads to no directory");
    CHECK(no_leftover(dangling));
    CHECK(accel_accelerator_save_state(r.acc, "", NULL, 0) == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "the directory to save into is \"\"");
    accel_clear_error();
    run_free(&r);
    rm_tree(project);
}

/* ---------------------------------------------------------------- save_model */

/* 3 -> w -> w -> 2: six tensors, in 3 or more shards at max_shard_size "64"
 * for w = 4 (or 4 * w bytes for larger w). */
static accel_module *mlp(int w) {
    accel_manual_seed(5);
    accel_module *l[3] = {accel_linear_new(3, w, true, ACCEL_CPU_DEVICE, ACCEL_F32),
                          accel_linear_new(w, w, true, ACCEL_CPU_DEVICE, ACCEL_F32),
                          accel_linear_new(w, 2, true, ACCEL_CPU_DEVICE, ACCEL_F32)};
    return accel_sequential_new(3, l);
}

/* Save `id` carries 1000 + id in the first element of every tensor. */
static void mark_model(accel_module *m, int id) {
    accel_tensor **ps;
    int n = accel_module_parameters(m, &ps);
    for (int i = 0; i < n; i++) ((float *)ps[i]->data)[0] = 1000.0f + (float)id;
    accel_free(ps);
}

/* The id of the model in dir (it must load without error, every tensor from
 * the same save: -1 when they mix; in 3 or more shards, but for save
 * one_file_id's, one file), the weights files of that save alone (no
 * model.safetensors beside an index, which a load would prefer), and the
 * user's files beside it intact. */
static int model_id_in(const char *dir, int one_file_id) {
    accel_checkpoint *ck = accel_checkpoint_open(dir);
    CHECK_MSG(ck, "%s does not load: %s", dir, accel_last_error());
    if (!ck) return -2;
    int n = accel_checkpoint_count(ck), id = -2;
    CHECK(n == 6);
    for (int i = 0; i < n; i++) {
        accel_tensor *t = accel_checkpoint_tensor(ck, accel_checkpoint_name(ck, i), ACCEL_F32);
        CHECK_MSG(t, "%s", accel_last_error());
        int got = t ? (int)(((float *)t->data)[0] - 1000.0f) : -2;
        id = i == 0 ? got : id == got ? id : -1;
        accel_tensor_free(t);
    }
    int shards = accel_checkpoint_num_shards(ck);
    CHECK_MSG(id == one_file_id ? shards == 1 : shards >= 3, "%s: save %d in %d shards", dir, id, shards);
    accel_checkpoint_close(ck);
    char p[700], buf[64] = "";
    bool one = (snprintf(p, sizeof p, "%s/model.safetensors", dir), access(p, F_OK) == 0);
    bool index = (snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir), access(p, F_OK) == 0);
    CHECK_MSG(!(one && index), "%s: model.safetensors beside an index (save %d loaded)", dir, id);
    snprintf(p, sizeof p, "%s/README.md", dir);
    FILE *f = fopen(p, "r");
    CHECK_MSG(f && fgets(buf, sizeof buf, f) && !strcmp(buf, "my notes\n"), "%s lost or changed", p);
    if (f) fclose(f);
    snprintf(p, sizeof p, "%s/extra/tokenizer.json", dir);
    CHECK_MSG(access(p, R_OK) == 0, "%s lost", p);
    return id;
}

/* Saves model 0 (w wide, shards of `shard`) into dir beside a README and a
 * subdirectory of the user's; false when that does not fit. */
static bool save_model_setup(const char *dir, int w, const char *shard, accel_accelerator **acc, accel_module **m) {
    rm_tree(dir);
    accel_accelerator_opts o = accel_accelerator_opts_default();
    o.mixed_precision = "no";
    *acc = accel_accelerator_new(&o);
    *m = mlp(w);
    mark_model(*m, 0);
    char p[700];
    snprintf(p, sizeof p, "%s/extra", dir);
    if (accel_accelerator_save_model(*acc, *m, dir, shard) || mkdir(p, 0755)) return false;
    snprintf(p, sizeof p, "%s/README.md", dir);
    FILE *f = fopen(p, "w");
    bool ok = f && fputs("my notes\n", f) >= 0;
    if (f) ok &= fclose(f) == 0;
    snprintf(p, sizeof p, "%s/extra/tokenizer.json", dir);
    f = fopen(p, "w");
    ok &= f && fputs("{}", f) >= 0;
    if (f) ok &= fclose(f) == 0;
    return ok;
}

/* A save in torch's format over one in safetensors (and back): the other
 * format's weights go, the user's files stay. The older model.safetensors
 * stayed beside the new pytorch_model.bin, and a load read it. */
static void test_save_model_switches_format(void) {
    char dir[300], p[400];
    snprintf(dir, sizeof dir, "/tmp/accel_ckpt_format_%d_model", (int)getpid());
    accel_accelerator *acc;
    accel_module *m;
    CHECK(save_model_setup(dir, 4, NULL, &acc, &m));
    for (int id = 1; id <= 2; id++) {
        bool torch = id == 1;
        mark_model(m, id);
        CHECK_MSG(accel_accelerator_save_model_with(acc, m, dir, &(accel_save_model_opts){
                      .no_safe_serialization = torch}) == ACCEL_OK, "%s", accel_last_error());
        snprintf(p, sizeof p, "%s/model.safetensors", dir);
        CHECK_MSG((access(p, F_OK) == 0) == !torch, "save %d: %s %s", id, p, torch ? "left" : "missing");
        snprintf(p, sizeof p, "%s/pytorch_model.bin", dir);
        CHECK_MSG((access(p, F_OK) == 0) == torch, "save %d: %s %s", id, p, torch ? "missing" : "left");
        accel_checkpoint *ck = accel_checkpoint_open(dir);
        CHECK_MSG(ck, "%s", accel_last_error());
        accel_tensor *t = ck ? accel_checkpoint_tensor(ck, accel_checkpoint_name(ck, 0), ACCEL_F32) : NULL;
        CHECK_MSG(t && ((float *)t->data)[0] == 1000.0f + (float)id, "save %d: another save's weights read", id);
        accel_tensor_free(t);
        if (ck) accel_checkpoint_close(ck);
        CHECK(holds(dir, "README.md", "my notes\n"));
    }
    accel_module_free(m);
    accel_accelerator_free(acc);
    rm_tree(dir);
}

/* One save of model m into dir in shards of at most 64 bytes (3 or more):
 * the accelerator's save_model, or io's writer (accel_save_module, which is
 * accel_save_sharded). */
typedef accel_status (*model_saver)(accel_accelerator *acc, accel_module *m, const char *dir);

static accel_status by_save_model(accel_accelerator *acc, accel_module *m, const char *dir) {
    return accel_accelerator_save_model(acc, m, dir, "64");
}

static accel_status by_save_module(accel_accelerator *acc, accel_module *m, const char *dir) {
    (void)acc;
    return accel_save_module(dir, m, 64);
}

/* save killed at every point, over model 0 saved by save_model in shards of
 * first_shard (NULL: one file): dir holds the previous model or the new one. */
static void killed_at_every_point(const char *tag, model_saver save, const char *first_shard) {
    char dir[300];
    snprintf(dir, sizeof dir, "/tmp/accel_ckpt_kill_%d_%s", (int)getpid(), tag);
    accel_accelerator *acc;
    accel_module *m;
    CHECK(save_model_setup(dir, 4, first_shard, &acc, &m));
    int newest = 0, kills = 0, one_file_id = first_shard ? -1 : 0;
    for (long k = 1;; k++) {
        fflush(NULL);
        pid_t pid = fork();
        if (pid == 0) {
            mark_model(m, (int)k);
            points_seen = 0;
            kill_at = k;
            _exit(save(acc, m, dir) == ACCEL_OK ? 0 : 1);
        }
        int status = 0;
        waitpid(pid, &status, 0);
        bool killed = WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
        CHECK_MSG(killed || (WIFEXITED(status) && WEXITSTATUS(status) == 0), "%s, kill point %ld: save failed", tag,
                  k);
        int got = model_id_in(dir, one_file_id);
        CHECK_MSG(got == newest || got == k, "%s, kill point %ld: %s holds save %d, want %d or %ld (-1: a mix)", tag, k,
                  dir, got, newest, k);
        newest = got;
        kills += killed;
        if (!killed) {
            CHECK(got == k && no_leftover(dir));
            break;
        }
    }
    CHECK_MSG(kills >= 20, "%s: only %d kill points", tag, kills);
    accel_module_free(m);
    accel_accelerator_free(acc);
    rm_tree(dir);
}

static void test_save_model_killed_at_every_point(void) { killed_at_every_point("model", by_save_model, "64"); }
/* io's writer: it wrote the shards in place, then the index, then removed
 * the stale files; killed in its second shard the directory loaded, with no
 * error, as the new first shard and the old others */
static void test_save_sharded_killed_at_every_point(void) { killed_at_every_point("sharded", by_save_module, "64"); }
/* from one file to shards: model.safetensors, which a load prefers, went last */
static void test_save_sharded_from_one_file_killed(void) { killed_at_every_point("onefile", by_save_module, NULL); }

/* save failing at every point (a full disk): it reports it, dir holds the
 * previous model, and nothing is left beside it. */
static void fails_at_every_point(const char *tag, model_saver save) {
    char dir[300];
    snprintf(dir, sizeof dir, "/tmp/accel_ckpt_fail_%d_%s", (int)getpid(), tag);
    accel_accelerator *acc;
    accel_module *m;
    CHECK(save_model_setup(dir, 4, "64", &acc, &m));
    int fails = 0;
    for (long k = 1;; k++) {
        mark_model(m, (int)k);
        points_seen = 0;
        fail_at = k;
        accel_status s = save(acc, m, dir);
        fail_at = 0;
        bool reached = points_seen >= k;
        int got = model_id_in(dir, -1);
        if (s != ACCEL_OK) {
            fails++;
            CHECK_STR_CONTAINS(accel_last_error(), "(injected)");
            accel_clear_error();
            CHECK_MSG(got == 0, "%s, fail point %ld: %s holds save %d after a failed save (-1: a mix)", tag, k, dir,
                      got);
            CHECK_MSG(no_leftover(dir), "%s, fail point %ld: the staging directory is left", tag, k);
        } else {
            CHECK_MSG(got == k, "%s, fail point %ld: %s holds save %d after a successful save", tag, k, dir, got);
            mark_model(m, 0); /* back to save 0 for the next point */
            CHECK(save(acc, m, dir) == ACCEL_OK);
        }
        if (!reached) break;
    }
    CHECK_MSG(fails >= 15, "%s: only %d fail points", tag, fails);
    accel_module_free(m);
    accel_accelerator_free(acc);
    rm_tree(dir);
}

static void test_save_model_fails_at_every_point(void) { fails_at_every_point("model", by_save_model); }
static void test_save_sharded_fails_at_every_point(void) { fails_at_every_point("sharded", by_save_module); }

/* `enospc DIR` (tests/run_save_model_enospc.sh, DIR a small tmpfs): model 0
 * then model 1 saved into DIR/model; when model 1 runs out of space, DIR/model
 * still holds model 0 whole and nothing is left beside it. Prints what
 * happened for the script to count. */
static int enospc(const char *root) {
    char dir[600];
    snprintf(dir, sizeof dir, "%s/model", root);
    accel_accelerator *acc;
    accel_module *m;
    if (!save_model_setup(dir, 100, "1KB", &acc, &m)) {
        printf("enospc: model 0 does not fit\n");
        accel_clear_error();
    } else {
        mark_model(m, 1);
        accel_status s = accel_accelerator_save_model(acc, m, dir, "1KB");
        if (s != ACCEL_OK) {
            CHECK_STR_CONTAINS(accel_last_error(), "No space left on device");
            accel_clear_error();
        }
        int got = model_id_in(dir, -1);
        CHECK_MSG(got == (s == ACCEL_OK ? 1 : 0), "%s holds save %d after a %s save (-1: a mix)", dir, got,
                  s == ACCEL_OK ? "successful" : "failed");
        CHECK(no_leftover(dir));
        printf("enospc: model 1 %s\n", s == ACCEL_OK ? "saved" : "ran out of space, model 0 intact");
    }
    accel_module_free(m);
    accel_accelerator_free(acc);
    accel_thread_cleanup();
    return check_summary();
}

/* `mount-point DIR OUTER` (tests/run_save_mount_point.sh, DIR and OUTER/data
 * tmpfs mounts on directories of another filesystem): the swap cannot replace
 * a mount point, so save_model and save_state into DIR, or through a link to
 * it, fail at once naming it, before writing anything beside it (they used to
 * stage the whole save on the parent's filesystem, then fail the exchange);
 * io's weight writers write DIR in place; into OUTER all fail naming
 * OUTER/data, before anything changes. */
static int mount_point(const char *dir, const char *outer) {
    accel_accelerator_opts o = accel_accelerator_opts_default();
    o.mixed_precision = "no";
    accel_accelerator *acc = accel_accelerator_new(&o);
    accel_module *m = mlp(100);
    char link[700];
    snprintf(link, sizeof link, "%s_link", dir);
    unlink(link);
    CHECK(symlink(dir, link) == 0);
    for (int i = 0; i < 4; i++) {
        const char *target = i % 2 ? link : dir;
        accel_status s = i < 2 ? accel_accelerator_save_model(acc, m, target, NULL)
                               : accel_accelerator_save_state(acc, target, NULL, 0);
        CHECK_MSG(s == ACCEL_ERR_IO, "save %d into %s: %d %s", i, target, (int)s, accel_last_error());
        CHECK_STR_CONTAINS(accel_last_error(), "is a mount point");
        CHECK_STR_CONTAINS(accel_last_error(), dir);
        accel_clear_error();
        CHECK_MSG(no_leftover(dir), "save %d staged beside the mount point", i);
    }
    /* io's writers (accel_save_sharded's family, save_pretrained) into the
     * mount point itself write in place, as transformers' save_pretrained
     * does (they refused it too): the user's files stay, and the previous
     * save's weights files go once the new save's are written (one file over
     * shards, shards over one file, the other format over both); through a
     * link to it as well, and nothing is staged beside it */
    char extra[700];
    snprintf(extra, sizeof extra, "%s/extra", dir);
    put(dir, "README.md", "my notes\n");
    CHECK(mkdir(extra, 0755) == 0);
    put(extra, "tokenizer.json", "{}\n");
    for (int id = 1; id <= 3; id++) {
        mark_model(m, id);
        accel_status s = accel_save_module(id == 2 ? link : dir, m, id == 2 ? 1 << 30 : 64);
        CHECK_MSG(s == ACCEL_OK, "accel_save_module %d into %s: %s", id, dir, accel_last_error());
        CHECK_MSG(model_id_in(dir, 2) == id, "%s does not hold save %d alone", dir, id);
        CHECK_MSG(no_leftover(dir), "accel_save_module %d staged beside the mount point", id);
    }
    accel_state_dict *sd = accel_module_state_dict(m);
    const char *names[6];
    accel_tensor *ts[6];
    for (int i = 0; sd && i < 6; i++) names[i] = sd->entries[i].name, ts[i] = sd->entries[i].t;
    CHECK(sd && sd->n == 6 && accel_save_sharded_as(dir, 6, names, ts, 1 << 30, ACCEL_WEIGHTS_PYTORCH) == ACCEL_OK);
    accel_state_dict_free(sd);
    DIR *d = opendir(dir);
    int weights = 0;
    for (struct dirent *e; d && (e = readdir(d));)
        weights += !strncmp(e->d_name, "model", 5) || !strncmp(e->d_name, "pytorch_model", 13);
    if (d) closedir(d);
    CHECK_MSG(weights == 1 && holds(dir, "README.md", "my notes\n"), "%s: %d weights files beside pytorch_model.bin, "
              "or the README lost", dir, weights - 1);
    unlink(link);
    /* outer/data, a mount inside the directory saved into: refused by name,
     * its file intact (it was copied into the new directory and removed from
     * the mount with the replaced one) */
    char data[700];
    snprintf(data, sizeof data, "%s/data", outer);
    put(data, "train.bin", "mine\n");
    for (int i = 0; i < 3; i++) { /* io's writers too: the mount inside is no mount point they write in place */
        accel_status s = i == 2 ? accel_save_module(outer, m, 64)
                         : i    ? accel_accelerator_save_state(acc, outer, NULL, 0)
                                : accel_accelerator_save_model(acc, m, outer, NULL);
        CHECK_MSG(s == ACCEL_ERR_IO, "save %d into %s: %d %s", i, outer, (int)s, accel_last_error());
        CHECK_STR_CONTAINS(accel_last_error(), "is a mount point");
        CHECK_STR_CONTAINS(accel_last_error(), data);
        accel_clear_error();
        CHECK_MSG(holds(data, "train.bin", "mine\n"), "the mount's file was lost");
        CHECK_MSG(no_leftover(outer), "save %d left its staged directory", i);
    }
    accel_module_free(m);
    accel_accelerator_free(acc);
    accel_thread_cleanup();
    int rc = check_summary();
    if (rc == 0) printf("mount-point-ok\n");
    return rc;
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "enospc")) return enospc(argv[2]);
    if (argc == 4 && !strcmp(argv[1], "mount-point")) return mount_point(argv[2], argv[3]);
    RUN(test_kill_every_point_total_limit_1);
    RUN(test_kill_every_point_total_limit_2);
    RUN(test_kill_every_point_total_limit_3);
    RUN(test_kill_every_point_overwrite);
    RUN(test_save_state_fails_at_every_point);
    RUN(test_save_state_into_non_directory);
    RUN(test_load_pins_its_directory);
    RUN(test_writes_during_the_save_kept);
    RUN(test_concurrent_saves_take_turns);
    RUN(test_save_model_switches_format);
    RUN(test_save_model_killed_at_every_point);
    RUN(test_save_model_fails_at_every_point);
    RUN(test_save_sharded_killed_at_every_point);
    RUN(test_save_sharded_from_one_file_killed);
    RUN(test_save_sharded_fails_at_every_point);
    accel_thread_cleanup();
    return check_summary();
}
