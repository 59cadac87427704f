/* save_state / load_state: resuming continues bit for bit (losses identical to an
 * uninterrupted run, across an epoch boundary, with shuffling, Adam state, an LR
 * schedule and RNG draws); automatic naming with total_limit whose counter survives a
 * restart; a save killed midway leaves the previous checkpoint intact and usable;
 * save_model shards. Runs plainly and under `accel launch`. */
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "accel/accel.h"
#include "accel/accelerator.h"
#include "accel/dist.h"
#include "accel/io.h"
#include "check.h"
#include "optim_groups.h"
#include "io/checkpoint_marker.h"
#include "tiny_llama.h"

static int N, R;
static char DIR_[256];

typedef struct run {
    accel_module *model;
    accel_optimizer *opt;
    accel_lr_scheduler *sched;
    accel_dataset *ds;
    accel_dataloader *dl;
} run;

static void run_make(run *r, uint64_t seed) {
    float x[40 * 3], y[40];
    for (int i = 0; i < 40; i++) {
        for (int j = 0; j < 3; j++) x[i * 3 + j] = (float)((i * 5 + j * 7) % 13) / 13.0f - 0.5f;
        y[i] = x[i * 3] - 0.5f * x[i * 3 + 2];
    }
    accel_tensor *f[2] = {accel_from_floats(ACCEL_SHAPE(40, 3), x), accel_from_floats(ACCEL_SHAPE(40, 1), y)};
    r->ds = accel_tensor_dataset_new(2, f);
    accel_dataloader_opts o = accel_dataloader_opts_default();
    o.batch_size = 4;
    o.shuffle = true;
    o.seed = seed;
    r->dl = accel_dataloader_new(r->ds, &o);
    accel_manual_seed(seed);
    accel_module *l[3] = {accel_linear_new(3, 6, true, ACCEL_CPU_DEVICE, ACCEL_F32), accel_silu_module_new(),
                          accel_linear_new(6, 1, true, ACCEL_CPU_DEVICE, ACCEL_F32)};
    r->model = accel_sequential_new(3, l);
    accel_tensor **ps;
    int n = accel_module_parameters(r->model, &ps);
    accel_optim_hparams h = accel_optim_defaults(ACCEL_OPTIM_ADAMW, 0.01);
    r->opt = accel_optimizer_new_params(ACCEL_OPTIM_ADAMW, n, ps, &h);
    accel_free(ps);
    r->sched = accel_lr_scheduler_new(r->opt, ACCEL_SCHED_COSINE, 3, 40);
    accel_step_reset();
}

static void run_free(accel_accelerator *acc, run *r) {
    CHECK_MSG(accel_accelerator_clear(acc) == ACCEL_OK, "%s", accel_last_error());
    accel_lr_scheduler_free(r->sched);
    accel_optimizer_free(r->opt);
    accel_module_free(r->model);
    accel_dataloader_free(r->dl);
    accel_dataset_free(r->ds);
}

/* `steps` training steps (the data loader restarts at epoch ends); the inputs get
 * noise from the default generator, so the RNG state matters too. */
static void train(accel_accelerator *acc, run *r, int steps, double *losses) {
    accel_batch b;
    for (int s = 0; s < steps; s++) {
        while (!accel_dataloader_next(r->dl, &b)) CHECK(accel_last_status() == ACCEL_OK);
        accel_tensor *noise = accel_empty(ACCEL_F32, ACCEL_SHAPE(b.size, 3));
        accel_rng_normal_(accel_default_rng(), noise, 0.0, 0.01);
        accel_tensor *loss = accel_mse_loss(accel_module_call(r->model, accel_add(b.fields[0], noise)), b.fields[1]);
        CHECK(accel_accelerator_backward(acc, loss) == ACCEL_OK);
        CHECK(accel_accelerator_optimizer_step(acc, r->opt) == ACCEL_OK);
        accel_accelerator_scheduler_step(acc, r->sched);
        accel_accelerator_zero_grad(acc, r->opt);
        losses[s] = accel_item(loss);
        accel_step_reset();
    }
}

static accel_accelerator *make_acc(int total_limit) {
    accel_accelerator_opts o = accel_accelerator_opts_default();
    o.mixed_precision = "no";
    o.project_dir = DIR_;
    o.automatic_checkpoint_naming = true;
    o.total_limit = total_limit;
    return accel_accelerator_new(&o);
}

static bool exists(const char *fmt, int n) {
    char p[512];
    snprintf(p, sizeof p, fmt, DIR_, n);
    struct stat sb;
    return stat(p, &sb) == 0;
}

static accel_accelerator *A;

static void test_resume_bit_for_bit(void) {
    run a, b;
    double want[12], got[12], first[5];
    run_make(&a, 7);
    CHECK(accel_accelerator_prepare(A, a.model, a.opt, a.dl, a.sched) == ACCEL_OK);
    train(A, &a, 5, first);
    char used[512];
    CHECK(accel_accelerator_save_state(A, NULL, used, sizeof used) == ACCEL_OK);
    CHECK_STR_CONTAINS(used, "checkpoints/checkpoint_0");
    CHECK(exists("%s/checkpoints/checkpoint_%d/model.safetensors", 0));
    CHECK(exists("%s/checkpoints/checkpoint_%d/optimizer.safetensors", 0));
    CHECK(exists("%s/checkpoints/checkpoint_%d/scheduler.safetensors", 0));
    char rs[64];
    snprintf(rs, sizeof rs, "%%s/checkpoints/checkpoint_%%d/random_states_%d.safetensors", R);
    CHECK(exists(rs, 0));
    train(A, &a, 12, want); /* uninterrupted: crosses an epoch boundary */
    run_free(A, &a);

    run_make(&b, 99); /* different weights, seed, order: all restored */
    CHECK(accel_accelerator_prepare(A, b.model, b.opt, b.dl, b.sched) == ACCEL_OK);
    accel_resume_point at = {-1, -1, -1, -1};
    CHECK(accel_accelerator_load_state(A, NULL, &at) == ACCEL_OK);
    /* saved after 5 batches: the loader stays on an epoch's last batch until the next call */
    int64_t per_epoch = accel_dataloader_len(b.dl);
    CHECK(at.epoch == 4 / per_epoch && at.batch == 5 - at.epoch * per_epoch);
    CHECK(at.step == accel_accelerator_step(A));
    train(A, &b, 12, got);
    for (int s = 0; s < 12; s++) CHECK_MSG(want[s] == got[s], "step %d: %.9g vs %.9g", s, want[s], got[s]);
    /* model.safetensors carries the HF-style names */
    accel_safetensors *st = accel_safetensors_open(used[0] ? strcat(used, "/model.safetensors") : "");
    CHECK(st && accel_safetensors_find(st, "0.weight") && accel_safetensors_find(st, "2.bias"));
    accel_safetensors_close(st);
    run_free(A, &b);
}

static void test_total_limit_and_counter(void) {
    run a;
    run_make(&a, 3);
    accel_accelerator *acc = A;
    if (N == 1) {
        accel_accelerator_free(A);
        acc = A = make_acc(2);
    }
    CHECK(accel_accelerator_prepare(acc, a.model, a.opt, a.dl, a.sched) == ACCEL_OK);
    /* checkpoint_0 exists from the previous test: the counter continues at 1 */
    for (int i = 0; i < 4; i++) CHECK(accel_accelerator_save_state(acc, NULL, NULL, 0) == ACCEL_OK);
    accel_accelerator_wait_for_everyone(acc);
    CHECK(!exists("%s/checkpoints/checkpoint_%d", 0) && !exists("%s/checkpoints/checkpoint_%d", 2));
    CHECK(exists("%s/checkpoints/checkpoint_%d", 3) && exists("%s/checkpoints/checkpoint_%d", 4));
    run_free(acc, &a);
}

/* ---- a save killed midway (one process: fork, SIGKILL at the K-th allocation) */

static long kill_at, n_allocs;
static void *killing_alloc(void *ctx, size_t bytes, size_t align) {
    if (++n_allocs == kill_at) raise(SIGKILL);
    void *p = NULL;
    return posix_memalign(&p, align < sizeof(void *) ? sizeof(void *) : align, bytes ? bytes : 1) ? NULL : p;
}
static void plain_free(void *ctx, void *p) { free(p); }

static void test_killed_save_keeps_previous(void) {
    run a;
    run_make(&a, 5);
    CHECK(accel_accelerator_prepare(A, a.model, a.opt, a.dl, a.sched) == ACCEL_OK);
    double l[3];
    train(A, &a, 3, l);
    char good[512];
    CHECK(accel_accelerator_save_state(A, NULL, good, sizeof good) == ACCEL_OK);
    accel_tensor **ps;
    accel_module_parameters(a.model, &ps);
    float w_good = ((float *)ps[0]->data)[0];
    train(A, &a, 2, l);
    float w_new = ((float *)ps[0]->data)[0];
    CHECK(w_good != w_new);
    int killed = 0;
    const long points[] = {1, 2, 3, 5, 8, 12, 20, 30, 50};
    for (size_t i = 0; i < sizeof points / sizeof points[0]; i++) {
        fflush(NULL);
        pid_t pid = fork();
        if (pid == 0) {
            kill_at = points[i];
            accel_allocator al = {killing_alloc, plain_free, NULL};
            accel_set_allocator(&al);
            accel_accelerator_save_state(A, NULL, NULL, 0);
            _exit(0);
        }
        int status = 0;
        waitpid(pid, &status, 0);
        killed += WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
        /* whatever happened, the latest checkpoint is complete and loads */
        CHECK(accel_accelerator_load_state(A, NULL, NULL) == ACCEL_OK);
        float w = ((float *)ps[0]->data)[0];
        CHECK(w == w_good || w == w_new);
    }
    CHECK(killed >= 3); /* the kills really happened mid-save */
    /* the checkpoint saved before the kills is intact */
    CHECK(accel_accelerator_load_state(A, good, NULL) == ACCEL_OK);
    CHECK(((float *)ps[0]->data)[0] == w_good);
    accel_free(ps);
    run_free(A, &a);
}

/* ---- SIGKILLed from outside at many different times (one process): a child saves
 * in a loop, each save marked in a weight and in the RNG seed; kill offsets sweep
 * about three saves. After each kill the newest checkpoint loads whole. */

static void mark_save(accel_tensor *w, int id) {
    ((float *)w->data)[0] = 1000.0f + (float)id;
    accel_manual_seed((uint64_t)id);
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void sweep_external_kills(int total_limit) {
    char project[300];
    snprintf(project, sizeof project, "%s/kills_%d", DIR_, total_limit);
    accel_accelerator_opts o = accel_accelerator_opts_default();
    o.mixed_precision = "no";
    o.project_dir = project;
    o.automatic_checkpoint_naming = true;
    o.total_limit = total_limit;
    accel_accelerator *acc = accel_accelerator_new(&o);
    run a;
    run_make(&a, 11);
    CHECK(accel_accelerator_prepare(acc, a.model, a.opt, a.dl, a.sched) == ACCEL_OK);
    accel_tensor **ps;
    accel_module_parameters(a.model, &ps);
    double t0 = now_s();
    for (int i = 0; i < total_limit; i++) {
        mark_save(ps[0], i);
        CHECK(accel_accelerator_save_state(acc, NULL, NULL, 0) == ACCEL_OK);
    }
    double save_s = (now_s() - t0) / total_limit;
    const int kills = 24;
    for (int k = 0; k < kills; k++) {
        fflush(NULL);
        pid_t pid = fork();
        if (pid == 0) {
            for (int id = 100 * (k + 1);; id++) {
                mark_save(ps[0], id);
                accel_accelerator_save_state(acc, NULL, NULL, 0);
            }
        }
        double delay = 3.0 * save_s * k / kills;
        usleep((useconds_t)(1e6 * delay));
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        CHECK_MSG(accel_accelerator_load_state(acc, NULL, NULL) == ACCEL_OK, "total_limit %d, kill after %.0f us: %s",
                  total_limit, 1e6 * delay, accel_last_error());
        int id = (int)accel_default_rng()->seed;
        CHECK_MSG(((float *)ps[0]->data)[0] == 1000.0f + (float)id, "total_limit %d: model and RNG state of "
                  "different saves", total_limit);
    }
    accel_free(ps);
    run_free(acc, &a);
    accel_accelerator_free(acc);
}

static void test_killed_at_many_times(void) {
    for (int limit = 1; limit <= 3; limit++) sweep_external_kills(limit);
}

/* ---- load_state(NULL) skips what is not a complete checkpoint, saying so; an
 * explicit path to one is an error naming what is missing. */

static void make_entries(const char *root, const char *good, int64_t g) {
    char cmd[8192];
    snprintf(cmd, sizeof cmd,
             "echo x > %s/checkpoint_%lld && mkdir %s/checkpoint_%lld && "
             "cp -r %s %s/checkpoint_%lld && rm %s/checkpoint_%lld/model.safetensors && "
             "cp -r %s %s/truncated && truncate -s 100 %s/truncated/optimizer.safetensors",
             root, (long long)g + 1, root, (long long)g + 2, good, root, (long long)g + 3, root, (long long)g + 3,
             good, DIR_, DIR_);
    CHECK(system(cmd) == 0);
}

/* load_state(NULL) with stderr going to a file; what it wrote, in out. */
static accel_status load_capturing_stderr(char *out, size_t n) {
    char path[300];
    snprintf(path, sizeof path, "%s/stderr.txt", DIR_);
    fflush(stderr);
    int saved = dup(2), fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 2);
    close(fd);
    accel_dist_allow_other_call_sites(); /* the other ranks call load_state from the test itself */
    accel_status s = accel_accelerator_load_state(A, NULL, NULL);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    FILE *f = fopen(path, "r");
    size_t got = f ? fread(out, 1, n - 1, f) : 0;
    out[got] = 0;
    if (f) fclose(f);
    return s;
}

static void test_load_skips_incomplete(void) {
    run a;
    run_make(&a, 13);
    CHECK(accel_accelerator_prepare(A, a.model, a.opt, a.dl, a.sched) == ACCEL_OK);
    accel_tensor **ps;
    accel_module_parameters(a.model, &ps);
    mark_save(ps[0], 7);
    char good[512], root[300], p[600];
    CHECK(accel_accelerator_save_state(A, NULL, good, sizeof good) == ACCEL_OK);
    int64_t g = atoll(strrchr(good, '_') + 1);
    snprintf(root, sizeof root, "%s/checkpoints", DIR_);
    if (R == 0) make_entries(root, good, g);
    accel_accelerator_wait_for_everyone(A);
    mark_save(ps[0], 8);
    char err[4096] = "";
    accel_status s = R == 0 ? load_capturing_stderr(err, sizeof err) : accel_accelerator_load_state(A, NULL, NULL);
    CHECK_MSG(s == ACCEL_OK, "%s", accel_last_error());
    CHECK(((float *)ps[0]->data)[0] == 1007.0f && accel_default_rng()->seed == 7);
    for (int i = 1; i <= 3 && R == 0; i++) {
        snprintf(p, sizeof p, "warning: skipping incomplete checkpoint %s/checkpoint_%lld", root, (long long)g + i);
        CHECK_STR_CONTAINS(err, p);
    }
    snprintf(p, sizeof p, "%s/checkpoint_%lld", root, (long long)g + 3);
    CHECK(accel_accelerator_load_state(A, p, NULL) == ACCEL_ERR_FORMAT);
    CHECK_STR_CONTAINS(accel_last_error(), "model.safetensors is missing");
    accel_clear_error();
    snprintf(p, sizeof p, "%s/checkpoint_%lld", root, (long long)g + 2);
    CHECK(accel_accelerator_load_state(A, p, NULL) == ACCEL_ERR_FORMAT);
    CHECK_STR_CONTAINS(accel_last_error(), "has no completion marker accel_checkpoint.json");
    accel_clear_error();
    snprintf(p, sizeof p, "%s/checkpoint_%lld", root, (long long)g + 1);
    CHECK(accel_accelerator_load_state(A, p, NULL) == ACCEL_ERR_IO);
    CHECK_STR_CONTAINS(accel_last_error(), "does not exist");
    accel_clear_error();
    snprintf(p, sizeof p, "%s/truncated", DIR_);
    CHECK(accel_accelerator_load_state(A, p, NULL) == ACCEL_ERR_FORMAT);
    CHECK_STR_CONTAINS(accel_last_error(), "optimizer.safetensors has 100 bytes");
    accel_clear_error();
    /* the counter goes past the strays; total_limit 2 keeps the two newest
     * complete checkpoints and leaves the strays alone */
    char next[512];
    CHECK(accel_accelerator_save_state(A, NULL, next, sizeof next) == ACCEL_OK);
    accel_accelerator_wait_for_everyone(A);
    CHECK(atoll(strrchr(next, '_') + 1) == g + 4);
    CHECK(exists("%s/checkpoints/checkpoint_%d", (int)g) && !exists("%s/checkpoints/checkpoint_%d", (int)g - 1));
    for (int i = 1; i <= 3; i++) CHECK(exists("%s/checkpoints/checkpoint_%d", (int)g + i));
    accel_free(ps);
    run_free(A, &a);
}

static void test_save_model_sharded(void) {
    run a;
    run_make(&a, 9);
    char d[300];
    snprintf(d, sizeof d, "%s/model_out", DIR_);
    CHECK(accel_accelerator_save_model(A, a.model, d, "100") == ACCEL_OK);
    accel_accelerator_wait_for_everyone(A);
    accel_checkpoint *ck = accel_checkpoint_open(d);
    CHECK(ck && accel_checkpoint_num_shards(ck) > 1 && accel_checkpoint_count(ck) == 4);
    accel_checkpoint_close(ck);
    CHECK(accel_accelerator_save_model(A, a.model, d, "5XB") != ACCEL_OK);
    accel_clear_error();
    /* the directory is replaced as a whole: not the working directory, nor one holding it */
    char cwd[4096];
    CHECK(getcwd(cwd, sizeof cwd) != NULL && chdir(d) == 0);
    for (int i = 0; i < 2; i++) {
        accel_status s = accel_accelerator_save_model(A, a.model, i ? ".." : ".", NULL);
        CHECK(R == 0 ? s == ACCEL_ERR_INVALID_ARG : s != ACCEL_OK); /* the others: "another rank failed" */
        if (R == 0) CHECK_STR_CONTAINS(accel_last_error(), "working directory or holds it");
        accel_clear_error();
    }
    CHECK(chdir(cwd) == 0);
    /* replaced as a whole, the directory keeps its permissions, and a link to it stays a link */
    char link[320];
    snprintf(link, sizeof link, "%s/model_link", DIR_);
    if (R == 0) CHECK(chmod(d, 0750) == 0 && symlink(d, link) == 0);
    accel_accelerator_wait_for_everyone(A);
    CHECK(accel_accelerator_save_model(A, a.model, link, "100") == ACCEL_OK);
    accel_accelerator_wait_for_everyone(A);
    struct stat sb;
    CHECK(lstat(link, &sb) == 0 && S_ISLNK(sb.st_mode));
    CHECK(stat(d, &sb) == 0 && S_ISDIR(sb.st_mode) && (sb.st_mode & 07777) == 0750);
    ck = accel_checkpoint_open(link);
    CHECK(ck && accel_checkpoint_count(ck) == 4);
    accel_checkpoint_close(ck);
    run_free(A, &a);
}

/* save_model of a Llama writes config.json beside the weights (issue 22
 * item 8): the directory loads by itself with from_pretrained, same weights,
 * and a user's config.json is replaced while their other files stay. */
static void test_save_model_writes_config(void) {
    accel_module *m = tiny_llama(4);
    char d[300], p[400];
    snprintf(d, sizeof d, "%s/llama_out", DIR_);
    CHECK(accel_accelerator_save_model(A, m, d, "2KB") == ACCEL_OK);
    accel_accelerator_wait_for_everyone(A);
    snprintf(p, sizeof p, "%s/config.json", d);
    accel_llama_config c;
    CHECK_MSG(accel_llama_config_load(p, &c) == ACCEL_OK, "%s", accel_last_error());
    CHECK(c.hidden_size == 16 && c.num_key_value_heads == 2 && c.tie_word_embeddings && c.torch_dtype == ACCEL_F32);
    accel_dispatched *dd = NULL;
    accel_module *back = accel_llama_from_pretrained(d, NULL, NULL, NULL, NULL, &dd);
    CHECK_MSG(back, "%s", accel_last_error());
    accel_state_dict *a = accel_module_state_dict(m), *b = back ? accel_module_state_dict(back) : NULL;
    CHECK(a && b && a->n == b->n);
    for (int i = 0; a && b && i < a->n && i < b->n; i++) {
        CHECK(!strcmp(a->entries[i].name, b->entries[i].name));
        CHECK(accel_nbytes(a->entries[i].t) == accel_nbytes(b->entries[i].t) &&
              !memcmp(a->entries[i].t->data, b->entries[i].t->data, accel_nbytes(a->entries[i].t)));
    }
    accel_state_dict_free(a);
    accel_state_dict_free(b);
    accel_dispatched_free(dd);
    accel_module_free(back);
    /* a model without a config leaves the directory's config.json alone */
    run r;
    run_make(&r, 9);
    CHECK(accel_accelerator_save_model(A, r.model, d, NULL) == ACCEL_OK);
    accel_accelerator_wait_for_everyone(A);
    CHECK(accel_llama_config_load(p, &c) == ACCEL_OK && c.hidden_size == 16);
    run_free(A, &r);
    accel_module_free(m);
}

/* save_model of every other family of the architecture table writes its
 * config.json too (model_type and the family's fields): the directory loads
 * back by itself to the same family. */
static void test_save_model_config_every_family(void) {
    static const char *const FAMILIES[] = {"mistral", "qwen2", "qwen3", "gemma", "gemma2",
                                           "granite", "phi3", "olmo2", "gpt2", "mixtral", "qwen3_moe", "phi"};
    for (size_t i = 0; i < sizeof FAMILIES / sizeof *FAMILIES; i++) {
        accel_module *m = tiny_family(5, FAMILIES[i]);
        CHECK_MSG(m, "%s: %s", FAMILIES[i], accel_last_error());
        if (!m) continue;
        char d[300], p[400];
        snprintf(d, sizeof d, "%s/family_%s", DIR_, FAMILIES[i]);
        CHECK_MSG(accel_accelerator_save_model(A, m, d, NULL) == ACCEL_OK, "%s: %s", FAMILIES[i], accel_last_error());
        accel_accelerator_wait_for_everyone(A);
        snprintf(p, sizeof p, "%s/config.json", d);
        accel_llama_config c;
        CHECK_MSG(accel_llama_config_load(p, &c) == ACCEL_OK, "%s: %s", FAMILIES[i], accel_last_error());
        CHECK_MSG(!strcmp(c.model_type, FAMILIES[i]), "%s: config.json says model_type %s", FAMILIES[i],
                  c.model_type);
        accel_dispatched *dd = NULL;
        accel_module *back = accel_llama_from_pretrained(d, NULL, NULL, NULL, NULL, &dd);
        CHECK_MSG(back && !strcmp(back->ops->type_name, m->ops->type_name), "%s: %s", FAMILIES[i],
                  back ? back->ops->type_name : accel_last_error());
        accel_dispatched_free(dd);
        accel_module_free(back);
        accel_module_free(m);
    }
}

/* save_state(output_dir) where output_dir is a link to a directory (one
 * process: an accelerator without automatic naming): the directory is
 * replaced and the link kept, as save_model does; the working directory is
 * refused as save_model refuses it. */
static void test_save_state_into_link(void) {
    accel_accelerator_free(A);
    accel_accelerator_opts o = accel_accelerator_opts_default();
    o.mixed_precision = "no";
    o.project_dir = DIR_;
    A = accel_accelerator_new(&o);
    CHECK(A != NULL);
    if (!A) return;
    run a;
    run_make(&a, 5);
    CHECK(accel_accelerator_prepare(A, a.model, a.opt, a.dl, a.sched) == ACCEL_OK);
    char d[300], link[320], p[400], used[400];
    snprintf(d, sizeof d, "%s/state_target", DIR_);
    snprintf(link, sizeof link, "%s/state_link", DIR_);
    CHECK(mkdir(d, 0750) == 0 && symlink(d, link) == 0);
    CHECK(accel_accelerator_save_state(A, link, used, sizeof used) == ACCEL_OK);
    CHECK_STR_CONTAINS(used, "state_link");
    CHECK(accel_accelerator_save_state(A, link, NULL, 0) == ACCEL_OK); /* over the first: the exchange */
    struct stat sb;
    CHECK_MSG(lstat(link, &sb) == 0 && S_ISLNK(sb.st_mode), "the link was replaced by a directory");
    CHECK(stat(d, &sb) == 0 && S_ISDIR(sb.st_mode) && (sb.st_mode & 07777) == 0750);
    snprintf(p, sizeof p, "%s/model.safetensors", d);
    CHECK_MSG(stat(p, &sb) == 0, "nothing written into the link's target");
    CHECK(accel_accelerator_load_state(A, link, NULL) == ACCEL_OK);
    char cwd[4096];
    CHECK(getcwd(cwd, sizeof cwd) != NULL && chdir(d) == 0);
    CHECK(accel_accelerator_save_state(A, ".", NULL, 0) == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "state_target is the process's working directory"); /* "." by its name */
    accel_clear_error();
    CHECK(chdir(cwd) == 0);
    run_free(A, &a);
}

/* A copy of every parameter of m (f32, on the cpu), to compare after. */
static float *params_copy(accel_module *m, int64_t *n_out) {
    accel_tensor **ps;
    int n = accel_module_parameters(m, &ps);
    int64_t total = 0;
    for (int i = 0; i < n; i++) total += accel_numel(ps[i]);
    float *out = malloc(sizeof(float) * (size_t)(total ? total : 1)), *p = out;
    for (int i = 0; i < n && out; i++) {
        memcpy(p, ps[i]->data, sizeof(float) * (size_t)accel_numel(ps[i]));
        p += accel_numel(ps[i]);
    }
    accel_free(ps);
    *n_out = total;
    return out;
}

static bool params_equal(accel_module *m, const float *was, int64_t n) {
    int64_t k;
    float *now = params_copy(m, &k);
    bool same = now && k == n && memcmp(now, was, sizeof(float) * (size_t)n) == 0;
    free(now);
    return same;
}

static accel_module *mlp(int64_t in, int64_t hidden, int64_t out, uint64_t seed) {
    accel_manual_seed(seed);
    accel_module *l[3] = {accel_linear_new(in, hidden, true, ACCEL_CPU_DEVICE, ACCEL_F32), accel_silu_module_new(),
                          accel_linear_new(hidden, out, true, ACCEL_CPU_DEVICE, ACCEL_F32)};
    return accel_sequential_new(3, l);
}

/* A checkpoint of other models (an unlucky user's: another config's
 * directory): load_state fails naming the tensor that does not fit, and no
 * weight of any model changes: not the model before it in the checkpoint,
 * which fits, nor the tensors of the failing model before the one that does
 * not (both were loaded before the failure was found). */
static void test_load_of_other_models_changes_nothing(void) {
    accel_module *a = mlp(3, 6, 1, 3), *b = mlp(2, 4, 2, 4);
    CHECK(accel_accelerator_prepare(A, a, b) == ACCEL_OK);
    /* under automatic naming the directory is the next checkpoint_<n> instead: dir says which */
    char given[300], dir[512];
    snprintf(given, sizeof given, "%s/other_models", DIR_);
    CHECK_MSG(accel_accelerator_save_state(A, given, dir, sizeof dir) == ACCEL_OK, "%s", accel_last_error());
    CHECK(accel_accelerator_clear(A) == ACCEL_OK);
    /* the same first model (other values); the second's last layer 4 -> 3 outputs */
    accel_module *a2 = mlp(3, 6, 1, 5), *b2 = mlp(2, 4, 3, 6);
    CHECK(accel_accelerator_prepare(A, a2, b2) == ACCEL_OK);
    int64_t na, nb;
    float *wa = params_copy(a2, &na), *wb = params_copy(b2, &nb);
    accel_status st = accel_accelerator_load_state(A, dir, NULL);
    CHECK_MSG(st == ACCEL_ERR_FORMAT, "load_state -> %d: %s", (int)st, accel_last_error());
    CHECK_STR_CONTAINS(accel_last_error(), "model_1.safetensors: 2.weight does not fit: [2, 4] in the file, the model's [3, 4]");
    CHECK_STR_CONTAINS(accel_last_error(), "nothing was loaded");
    accel_clear_error();
    CHECK_MSG(params_equal(a2, wa, na), "the first model was loaded before the second failed");
    CHECK_MSG(params_equal(b2, wb, nb), "the failing model's first layer was loaded");
    /* the models that fit load */
    CHECK(accel_accelerator_clear(A) == ACCEL_OK);
    CHECK(accel_accelerator_prepare(A, a2, b) == ACCEL_OK);
    CHECK_MSG(accel_accelerator_load_state(A, dir, NULL) == ACCEL_OK, "%s", accel_last_error());
    CHECK(!params_equal(a2, wa, na));
    CHECK(accel_accelerator_clear(A) == ACCEL_OK);
    /* models that fit, an optimizer that does not (its checkpoint's over all
     * of a's parameters after a step, this one over the first layer's): the
     * models stay as they were too */
    accel_tensor **ps;
    int np = accel_module_parameters(a, &ps);
    accel_optim_hparams h = accel_optim_defaults(ACCEL_OPTIM_ADAMW, 0.01);
    accel_optimizer *opt = accel_optimizer_new_params(ACCEL_OPTIM_ADAMW, np, ps, &h);
    accel_free(ps);
    CHECK(accel_accelerator_prepare(A, a, opt) == ACCEL_OK);
    float xs[6] = {0.5f, -1, 2, 1, 0, -0.5f};
    accel_tensor *loss = accel_mean_all(accel_module_call(a, accel_from_floats(ACCEL_SHAPE(2, 3), xs)));
    CHECK(loss && accel_accelerator_backward(A, loss) == ACCEL_OK && accel_accelerator_optimizer_step(A, opt) == ACCEL_OK);
    accel_step_reset();
    CHECK_MSG(accel_accelerator_save_state(A, given, dir, sizeof dir) == ACCEL_OK, "%s", accel_last_error());
    CHECK(accel_accelerator_clear(A) == ACCEL_OK);
    np = accel_module_parameters(a2, &ps);
    accel_optimizer *opt2 = accel_optimizer_new_params(ACCEL_OPTIM_ADAMW, 2, ps, &h); /* layer 0's weight and bias */
    accel_free(ps);
    CHECK(accel_accelerator_prepare(A, a2, opt2) == ACCEL_OK);
    float *wa2 = params_copy(a2, &na);
    st = accel_accelerator_load_state(A, dir, NULL);
    CHECK_MSG(st != ACCEL_OK, "an optimizer over 2 of 4 parameters loaded one over 4");
    accel_clear_error();
    CHECK_MSG(params_equal(a2, wa2, na), "the model was loaded before its optimizer failed");
    CHECK(accel_accelerator_clear(A) == ACCEL_OK);
    accel_optimizer_free(opt);
    accel_optimizer_free(opt2);
    free(wa2);
    free(wa);
    free(wb);
    accel_module_free(a);
    accel_module_free(b);
    accel_module_free(a2);
    accel_module_free(b2);
    accel_step_reset();
}

/* dir as a checkpoint saved before the param groups' counts were recorded:
 * rank 0 writes its optimizer file again without "param_groups.<g>.num_params"
 * and the marker again over it; every rank waits. */
static void drop_group_counts(const char *dir) {
    if (R == 0) {
        char path[600];
        snprintf(path, sizeof path, "%s/optimizer.safetensors", dir);
        accel_safetensors *f = accel_safetensors_open(path);
        CHECK(f != NULL);
        int n = f ? accel_safetensors_count(f) : 0, k = 0;
        const char **names = calloc((size_t)n + 1, sizeof *names);
        accel_tensor **ts = calloc((size_t)n + 1, sizeof *ts);
        for (int i = 0; i < n; i++) {
            const char *name = accel_safetensors_at(f, i)->name;
            if (strstr(name, ".num_params")) continue;
            names[k] = name;
            ts[k++] = accel_safetensors_tensor(f, name, -1);
        }
        CHECK(k == n - 2 && accel_safetensors_save(path, k, names, ts, 0, NULL) == ACCEL_OK);
        for (int i = 0; i < k; i++) accel_tensor_free(ts[i]);
        free(names);
        free(ts);
        accel_safetensors_close(f);
        CHECK_MSG(accel__marker_write(dir, N, NULL, "drop_group_counts") == ACCEL_OK, "%s", accel_last_error());
    }
    accel_accelerator_wait_for_everyone(A);
}

/* A checkpoint of an optimizer whose parameters were grouped [A, B], [C]
 * loaded into one grouped [A], [B, C] (same shapes, so every entry fits):
 * it used to load, giving B group 0's lr and weight decay; load_state now
 * refuses it as torch's load_state_dict does, naming the group and both
 * counts, before any model or optimizer changes. The same grouping loads; so
 * does the other one from a checkpoint saved before the counts were recorded
 * (nothing in it to check). */
static void test_load_of_other_grouping(void) {
    accel_module *m = squares(11);
    accel_optimizer *opt = grouped(m, 2, 0.01, 0.02);
    prepare_and_step(A, m, opt);
    char given[300], dir[512];
    snprintf(given, sizeof given, "%s/other_grouping", DIR_);
    CHECK_MSG(accel_accelerator_save_state(A, given, dir, sizeof dir) == ACCEL_OK, "%s", accel_last_error());
    CHECK(accel_accelerator_clear(A) == ACCEL_OK);

    accel_module *m2 = squares(12);
    accel_optimizer *other = grouped(m2, 1, 0.03, 0.04);
    CHECK(accel_accelerator_prepare(A, m2, other) == ACCEL_OK);
    int64_t n;
    float *w = params_copy(m2, &n);
    accel_status st = accel_accelerator_load_state(A, dir, NULL);
    CHECK_MSG(st == ACCEL_ERR_FORMAT, "load_state -> %d: %s", (int)st, accel_last_error());
    CHECK_STR_CONTAINS(accel_last_error(), "param group 0 holds 2 parameters in the saved state, 1 in this optimizer");
    accel_clear_error();
    CHECK_MSG(params_equal(m2, w, n), "the model was loaded before its optimizer failed");
    CHECK(accel_optimizer_get_lr(other, 0) == 0.03 && accel_optimizer_get_lr(other, 1) == 0.04);
    CHECK(accel_accelerator_clear(A) == ACCEL_OK);

    accel_optimizer *same = grouped(m2, 2, 0.05, 0.06);
    CHECK(accel_accelerator_prepare(A, m2, same) == ACCEL_OK);
    CHECK_MSG(accel_accelerator_load_state(A, dir, NULL) == ACCEL_OK, "%s", accel_last_error());
    CHECK(accel_optimizer_get_lr(same, 0) == 0.01 && accel_optimizer_get_lr(same, 1) == 0.02);
    CHECK(!params_equal(m2, w, n));
    CHECK(accel_accelerator_clear(A) == ACCEL_OK);

    drop_group_counts(dir);
    CHECK(accel_accelerator_prepare(A, m2, other) == ACCEL_OK);
    CHECK_MSG(accel_accelerator_load_state(A, dir, NULL) == ACCEL_OK, "%s", accel_last_error());
    CHECK(accel_optimizer_get_lr(other, 0) == 0.01 && accel_optimizer_get_lr(other, 1) == 0.02);
    CHECK(accel_accelerator_clear(A) == ACCEL_OK);
    free(w);
    accel_optimizer_free(opt);
    accel_optimizer_free(other);
    accel_optimizer_free(same);
    accel_module_free(m);
    accel_module_free(m2);
    accel_step_reset();
}

int main(void) {
    /* one directory per run: under the launcher every rank has the same parent */
    snprintf(DIR_, sizeof DIR_, "/tmp/accel_ckpt_test_%d",
             (int)(accel_dist_world_size() > 1 ? getppid() : getpid()));
    /* several processes: one accelerator for the whole run (the group is set up once);
     * one process: test_total_limit_and_counter restarts with total_limit 2 */
    A = make_acc(accel_dist_world_size() > 1 ? 2 : 0);
    if (!A) {
        fprintf(stderr, "%s\n", accel_last_error());
        return 1;
    }
    N = accel_accelerator_num_processes(A);
    R = accel_accelerator_process_index(A);
    RUN(test_resume_bit_for_bit);
    RUN(test_total_limit_and_counter);
    if (N == 1) RUN(test_killed_save_keeps_previous);
    if (N == 1) RUN(test_killed_at_many_times);
    RUN(test_load_skips_incomplete);
    RUN(test_save_model_sharded);
    RUN(test_save_model_writes_config);
    RUN(test_save_model_config_every_family);
    if (N == 1) RUN(test_save_state_into_link);
    RUN(test_load_of_other_models_changes_nothing);
    RUN(test_load_of_other_grouping);
    accel_accelerator_wait_for_everyone(A);
    if (R == 0) {
        char cmd[300];
        snprintf(cmd, sizeof cmd, "rm -rf %s", DIR_);
        CHECK(system(cmd) == 0);
    }
    accel_accelerator_free(A);
    accel_thread_cleanup();
    return check_summary();
}
