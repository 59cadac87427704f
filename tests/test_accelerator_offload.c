/* ZeRO-Offload (docs/accelerator.md "Offload"): offload_optimizer cpu / nvme
 * and offload_param / fsdp_offload_params. Runs plainly (one cpu process) and
 * under `accel launch` (2 processes; on hostless:0 too, tests/zero.cmake).
 *
 * - Training with each offload mode equals training without it bit for bit
 *   (losses and final weights) under ZeRO-1, -2 and -3 (on a device model,
 *   stage 3 without fsdp_offload_params, which is offload_param there): the
 *   update kernels are elementwise, so a step paged through blocks is the
 *   same arithmetic.
 * - nvme: one state file per rank, created under nvme_path and unlinked at
 *   once (tests/test_review_offload.c kills a rank); the memory holding the optimizer state is the paging buffer
 *   (internal counter, and the resident set measured across steps against a
 *   run without offload); checkpoints hold the full state in the normal
 *   format and resume bit for bit, with or without offload.
 * - cpu on a device model: the state is in host memory.
 * - offload_param nvme (stage 3): the shard in accel_param_shard_rank<R>_*
 *   under nvme_path, unlinked as created; after a backward and after
 *   a step few of its pages are resident (mincore); training and resume equal
 *   the run without offload, with offload_optimizer nvme too.
 * - Named errors: missing / non-directory nvme_path, a full disk (EFBIG from
 *   RLIMIT_FSIZE here; ENOSPC on a tiny tmpfs in the "enospc DIR" mode) and
 *   the settings refused by stage. */
#include <malloc.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "accel/accel.h"
#include "accel/accelerator.h"
#include "accel/dist.h"
#include "accelerator/accelerator_internal.h" /* the optimizer's state home and its byte counter */
#include "accelerator/zero_state.h" /* the ZeRO state of a prepared model */
#include "check.h"
#include "params_host.h"

static int N, R;
static accel_device DEV;
static char DIR_[256]; /* nvme_path of this run (one per launch) */

static accel_module *mlp(accel_device dev, int64_t in, int64_t hidden) {
    accel_module *l[3] = {accel_linear_new(in, hidden, true, dev, ACCEL_F32), accel_relu_module_new(),
                          accel_linear_new(hidden, 1, true, dev, ACCEL_F32)};
    return accel_sequential_new(3, l);
}

static accel_optimizer *optimizer(accel_module *m, accel_optim_kind kind) {
    accel_optim_hparams h = accel_optim_defaults(kind, kind == ACCEL_OPTIM_SGD ? 0.1 : 0.01);
    h.momentum = 0.9;
    return accel_optimizer_new_module(kind, m, &h);
}

/* Batch s of rank r: n rows of `in` features and their targets, on dev. */
static accel_tensor *loss_of(accel_module *m, int64_t in, int64_t s, int r) {
    enum { B = 4 };
    float x[B * 2048], y[B];
    for (int64_t i = 0; i < B; i++) {
        for (int64_t j = 0; j < in; j++) x[i * in + j] = (float)(((s * 13 + r * 5 + i * 7 + j * 3) % 11) / 11.0 - 0.5);
        y[i] = (float)((s + r + i) % 5) * 0.2f - 0.4f;
    }
    accel_tensor *xt = accel_to_device(accel_from_floats(ACCEL_SHAPE(B, in), x), DEV);
    accel_tensor *yt = accel_to_device(accel_from_floats(ACCEL_SHAPE(B, 1), y), DEV);
    return accel_mse_loss(accel_module_call(m, xt), yt);
}

/* Steps [from, from + k) through acc; each loss into losses[s] when given. */
static void train(accel_accelerator *acc, accel_module *m, accel_optimizer *o, int64_t in, int64_t from, int64_t k,
                  double *losses) {
    for (int64_t s = from; s < from + k; s++) {
        accel_tensor *loss = loss_of(m, in, s, R);
        CHECK(loss != NULL);
        if (losses && loss) losses[s] = accel_item(loss);
        CHECK_MSG(accel_accelerator_backward(acc, loss) == ACCEL_OK, "%s", accel_last_error());
        CHECK_MSG(accel_accelerator_optimizer_step(acc, o) == ACCEL_OK, "%s", accel_last_error());
        CHECK(accel_accelerator_zero_grad(acc, o) == ACCEL_OK);
        accel_step_reset();
    }
}

/* Freeing the accelerator un-prepares what it holds (the state file goes,
 * a ZeRO-3 model gets its full weights back: a released unit holds none);
 * then the model's weights into w (cap 256) when w is set, and the objects.
 * Returns the weights' count (0 without w). */
static int64_t release_reading(accel_accelerator *acc, accel_optimizer *o, accel_module *m, float *w) {
    accel_accelerator_free(acc);
    int64_t n = w ? params_to_host(m, w, 256) : 0;
    accel_optimizer_free(o);
    accel_module_free(m);
    return n;
}

static void release(accel_accelerator *acc, accel_optimizer *o, accel_module *m) { release_reading(acc, o, m, NULL); }

/* A fresh MLP (seed) and its optimizer, prepared by acc. */
static accel_module *prepared(accel_accelerator *acc, uint64_t seed, int64_t in, int64_t hidden, accel_optim_kind kind,
                              accel_optimizer **o) {
    accel_manual_seed(seed);
    accel_module *m = mlp(DEV, in, hidden);
    *o = optimizer(m, kind);
    CHECK_MSG(accel_accelerator_prepare(acc, m, *o, NULL, NULL) == ACCEL_OK, "%s", accel_last_error());
    return m;
}

/* A DeepSpeed JSON for stage `stage` with the given offload_optimizer section (and extra top-level keys). */
static const char *ds_json(const char *name, int stage, const char *offload, const char *extra) {
    static char path[512];
    snprintf(path, sizeof path, "%s/%s_r%d.json", DIR_, name, R);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (!f) return path;
    fprintf(f, "{%s\"zero_optimization\": {\"stage\": %d%s%s}}\n", extra ? extra : "", stage, offload ? ", " : "",
            offload ? offload : "");
    fclose(f);
    return path;
}

typedef struct mode {
    const char *name;
    const char *device; /* offload_optimizer.device, or NULL: none */
    int64_t block;      /* aio.block_size (nvme) */
    int buffers;        /* offload_optimizer.buffer_count (nvme) */
    bool fsdp;          /* fsdp_offload_params instead */
    bool param_nvme;    /* offload_param nvme too (stage 3) */
} mode;

static accel_accelerator *accelerator_for(int stage, const mode *md) {
    accel_accelerator_opts o = accel_accelerator_opts_default();
    o.mixed_precision = "no";
    o.zero_stage = stage;
    char off[512] = "", aio[64] = "";
    if (md && md->device && !strcmp(md->device, "nvme")) {
        snprintf(off, sizeof off, "\"offload_optimizer\": {\"device\": \"nvme\", \"nvme_path\": \"%s\", "
                 "\"buffer_count\": %d, \"pin_memory\": true, \"pipeline_read\": false}", DIR_, md->buffers);
        snprintf(aio, sizeof aio, "\"aio\": {\"block_size\": %lld, \"queue_depth\": 8}, ", (long long)md->block);
        o.deepspeed_config_file = ds_json(md->name, stage, off, aio);
    } else if (md) {
        o.offload_optimizer_device = md->device;
        o.fsdp_offload_params = md->fsdp;
    }
    if (md && md->param_nvme) {
        o.offload_param_device = "nvme";
        o.offload_param_nvme_path = DIR_;
    }
    accel_accelerator *acc = accel_accelerator_new(&o);
    CHECK_MSG(acc != NULL, "stage %d %s: %s", stage, md ? md->name : "plain", accel_last_error());
    if (o.deepspeed_config_file) unlink(o.deepspeed_config_file);
    return acc;
}

/* Four steps of a fresh model (seed 7) under acc: losses and final weights. */
static int64_t run(accel_accelerator *acc, accel_optim_kind kind, double *losses, float *w, int64_t cap) {
    accel_optimizer *o;
    accel_module *m = prepared(acc, 7, 6, 24, kind, &o);
    train(acc, m, o, 6, 0, 4, losses);
    /* gives a ZeRO-3 model its full weights back (released units hold none) */
    CHECK_MSG(accel_accelerator_clear(acc) == ACCEL_OK, "%s", accel_last_error());
    int64_t n = params_to_host(m, w, cap);
    accel_optimizer_free(o);
    accel_module_free(m);
    return n;
}

static void equals_plain(int stage, const mode *md, accel_optim_kind kind) {
    accel_accelerator *plain = accelerator_for(stage, NULL), *off = accelerator_for(stage, md);
    if (!plain || !off) {
        accel_accelerator_free(plain);
        accel_accelerator_free(off);
        return;
    }
    double la[4], lb[4];
    float wa[256], wb[256];
    int64_t n = run(plain, kind, la, wa, 256);
    CHECK(run(off, kind, lb, wb, 256) == n);
    for (int s = 0; s < 4; s++)
        CHECK_MSG(la[s] == lb[s], "stage %d %s step %d: loss %.9g vs %.9g", stage, md->name, s, lb[s], la[s]);
    int64_t diff = 0;
    for (int64_t k = 0; k < n; k++) diff += wa[k] != wb[k];
    CHECK_MSG(diff == 0, "stage %d %s %s: %lld of %lld weights differ from training without offload", stage,
              md->name, accel_optim_kind_name(kind), (long long)diff, (long long)n);
    accel_accelerator_free(plain);
    accel_accelerator_free(off);
}

/* Blocks of 16 floats: the 6x24 / 24 / 24x1 / 1 shards span several blocks and end inside one. */
static const mode CPU_MODE = {"cpu", "cpu", 0, 0, false, false}, NVME_MODE = {"nvme", "nvme", 64, 2, false, false},
                  FSDP_MODE = {"fsdp_offload_params", NULL, 0, 0, true, false},
                  PARAM_MODE = {"param_nvme", NULL, 0, 0, false, true},
                  BOTH_MODE = {"param_and_optimizer_nvme", "nvme", 64, 2, false, true};

static void test_offload_equals_plain(void) {
    bool host = DEV.type == ACCEL_DEV_CPU;
    for (int stage = 1; stage <= 3; stage++) {
        equals_plain(stage, &CPU_MODE, ACCEL_OPTIM_ADAMW);
        equals_plain(stage, &NVME_MODE, ACCEL_OPTIM_ADAMW);
        /* under FULL_SHARD it is offload_param cpu, refused for a device model (test_accelerator_device.c) */
        if (stage < 3 || host) equals_plain(stage, &FSDP_MODE, ACCEL_OPTIM_ADAMW);
    }
    if (host) { /* offload_param: stage 3 on the cpu (refused for a device model) */
        equals_plain(3, &PARAM_MODE, ACCEL_OPTIM_ADAMW);
        equals_plain(3, &BOTH_MODE, ACCEL_OPTIM_ADAMW);
        equals_plain(3, &PARAM_MODE, ACCEL_OPTIM_SGD);
    }
    equals_plain(2, &NVME_MODE, ACCEL_OPTIM_SGD); /* one state kind (momentum_buffer) */
}

/* The state's home: host memory under cpu offload (or fsdp_offload_params)
 * of a device model, the file under nvme. */
static void test_state_home(void) {
    const mode *modes[3] = {&CPU_MODE, &NVME_MODE, &FSDP_MODE};
    for (int i = 0; i < 3; i++) {
        bool k = modes[i] == &NVME_MODE;
        accel_accelerator *acc = accelerator_for(2, modes[i]);
        if (!acc) return;
        accel_optimizer *o;
        accel_module *m = prepared(acc, 3, 6, 24, ACCEL_OPTIM_ADAMW, &o);
        train(acc, m, o, 6, 0, 1, NULL);
        const char *path = accel__optimizer_state_path(o);
        if (k) {
            CHECK_MSG(path && strstr(path, DIR_) == path, "state file %s, want one under %s", path ? path : "(none)",
                      DIR_);
            char want[64];
            snprintf(want, sizeof want, "accel_optimizer_state_rank%d_", R);
            CHECK(path && strstr(path, want));
            CHECK(path && access(path, F_OK) != 0); /* unlinked as created: nothing to leave behind */
        } else {
            CHECK(path == NULL);
        }
        char file[512];
        snprintf(file, sizeof file, "%s", path ? path : "");
        accel_named_state *st = NULL;
        int n = accel_optimizer_state(o, &st);
        int tensors = 0;
        for (int e = 0; e < n; e++) {
            if (!st[e].t) continue;
            tensors++;
            /* a device model keeps its state on the device unless offloaded: host memory for both modes */
            CHECK_MSG(st[e].t->device.type == ACCEL_DEV_CPU, "%s: state %s is not in host memory", modes[i]->name,
                      st[e].name);
        }
        CHECK(tensors > 0);
        accel_named_state_free(st, n);
        CHECK_MSG(accel_accelerator_clear(acc) == ACCEL_OK, "%s", accel_last_error()); /* un-prepared: the file goes */
        CHECK(accel__optimizer_state_path(o) == NULL);
        accel_accelerator_free(acc);
        accel_optimizer_free(o);
        accel_module_free(m);
    }
}

/* The resident set, after free heap pages went back to the system (glibc's
 * malloc_trim), so freed state does not count. */
static int64_t rss_bytes(void) {
    malloc_trim(0);
    long pages = 0, resident = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (f) {
        if (fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
        fclose(f);
    }
    return (int64_t)resident * sysconf(_SC_PAGESIZE);
}

typedef struct rss_run {
    int64_t state;   /* bytes of this rank's Adam state */
    int64_t total;   /* resident growth from before prepare to after the steps */
    int64_t steps;   /* resident growth over two optimizer steps */
    int64_t counted; /* accel__optimizer_state_bytes after them */
} rss_run;

/* A 2048 -> 1024 -> 1 MLP (2.1M parameters: 16.8 MB of Adam state over N
 * ranks) prepared under ZeRO-2, a backward that grows the step arena, then
 * two steps. */
static rss_run measure(const mode *md) {
    rss_run r = {0};
    accel_accelerator *acc = accelerator_for(2, md);
    if (!acc) return r;
    accel_manual_seed(11);
    accel_module *m = mlp(DEV, 2048, 1024);
    accel_optimizer *o = optimizer(m, ACCEL_OPTIM_ADAMW);
    int64_t before = rss_bytes();
    CHECK(accel_accelerator_prepare(acc, m, o, NULL, NULL) == ACCEL_OK);
    int64_t lo, hi;
    CHECK(accel_accelerator_zero_shard(acc, m, &lo, &hi, NULL) == ACCEL_OK);
    r.state = 2 * (hi - lo) * (int64_t)sizeof(float);
    CHECK(accel_accelerator_backward(acc, loss_of(m, 2048, 0, R)) == ACCEL_OK);
    CHECK(accel_accelerator_zero_grad(acc, o) == ACCEL_OK);
    accel_step_reset();
    int64_t ready = rss_bytes();
    train(acc, m, o, 2048, 1, 2, NULL);
    int64_t after = rss_bytes();
    r.total = after - before;
    r.steps = after - ready;
    r.counted = accel__optimizer_state_bytes(o);
    release(acc, o, m);
    return r;
}

#if defined(__SANITIZE_ADDRESS__)
#define RSS_MEANINGFUL 0 /* freed memory stays in the sanitizer's quarantine */
#else
#define RSS_MEANINGFUL 1
#endif

static void test_nvme_memory_bounded(void) {
    if (DEV.type != ACCEL_DEV_CPU) return; /* the cpu run measures it */
    const mode big = {"nvme_big", "nvme", 64 << 10, 2, false, false}; /* 2 blocks of 64 KiB: 128 KiB of buffer */
    rss_run plain = measure(NULL), paged = measure(&big);
    /* the shard's state, less the padding between and after the tensors (no state there) */
    CHECK_MSG(plain.counted <= plain.state && plain.counted > plain.state / 100 * 99,
              "without offload the shard's state takes %lld bytes, counted %lld", (long long)plain.state,
              (long long)plain.counted);
    CHECK_MSG(paged.counted == 128 << 10, "under nvme the state memory is the buffer: counted %lld bytes",
              (long long)paged.counted);
    if (!RSS_MEANINGFUL) return;
    CHECK_MSG(plain.total - paged.total > plain.state * 3 / 4,
              "nvme saved %lld resident bytes of %lld bytes of state (growth %lld without offload, %lld with)",
              (long long)(plain.total - paged.total), (long long)plain.state, (long long)plain.total,
              (long long)paged.total);
    CHECK_MSG(paged.steps < plain.state / 8, "under nvme two steps grew the resident set by %lld bytes (state %lld)",
              (long long)paged.steps, (long long)plain.state);
    if (R == 0)
        printf("offload memory: %lld bytes of state per rank; resident growth from prepare through 2 steps: %lld "
               "without offload, %lld under nvme (buffer 131072; %lld over the steps)\n", (long long)plain.state,
               (long long)plain.total, (long long)paged.total, (long long)paged.steps);
}

/* save_state under md at `stage`, two more steps; then load_state into fresh
 * weights (under md, and without offload) and the same two steps: equal bit for bit. */
static void resume(int stage, const mode *md) {
    char ckpt[300];
    snprintf(ckpt, sizeof ckpt, "%s/ckpt_%s_%d", DIR_, md->name, stage);
    accel_accelerator *acc = accelerator_for(stage, md);
    if (!acc) return;
    accel_optimizer *o;
    accel_module *m = prepared(acc, 5, 6, 24, ACCEL_OPTIM_ADAMW, &o);
    train(acc, m, o, 6, 0, 2, NULL);
    CHECK_MSG(accel_accelerator_save_state(acc, ckpt, NULL, 0) == ACCEL_OK, "%s", accel_last_error());
    train(acc, m, o, 6, 2, 2, NULL);
    float want[256], got[256];
    int64_t n = release_reading(acc, o, m, want);
    for (int k = 0; k < 2; k++) {
        acc = accelerator_for(stage, k ? NULL : md);
        if (!acc) return;
        m = prepared(acc, 99, 6, 24, ACCEL_OPTIM_ADAMW, &o); /* other weights: the load replaces them */
        CHECK_MSG(accel_accelerator_load_state(acc, ckpt, NULL) == ACCEL_OK, "%s", accel_last_error());
        train(acc, m, o, 6, 2, 2, NULL);
        CHECK(release_reading(acc, o, m, got) == n);
        int64_t diff = 0;
        for (int64_t i = 0; i < n; i++) diff += got[i] != want[i];
        CHECK_MSG(diff == 0, "stage %d resumed %s: %lld of %lld weights differ", stage,
                  k ? "without offload" : md->name, (long long)diff, (long long)n);
    }
}

static void test_nvme_resume(void) {
    resume(2, &NVME_MODE);
    resume(3, &NVME_MODE);
    if (DEV.type != ACCEL_DEV_CPU) return; /* offload_param: refused for a device model */
    resume(3, &PARAM_MODE);
    resume(3, &BOTH_MODE);
}

/* Pages of [p, p + bytes) resident in memory (mincore: for a file we own,
 * its pages in the page cache too). */
static int64_t resident_pages(void *p, int64_t bytes, int64_t *pages) {
    int64_t page = sysconf(_SC_PAGESIZE), n = (bytes + page - 1) / page, in = 0;
    unsigned char *vec = calloc((size_t)n, 1);
    CHECK(vec && mincore(p, (size_t)bytes, vec) == 0);
    for (int64_t k = 0; vec && k < n; k++) in += vec[k] & 1;
    free(vec);
    *pages = n;
    return in;
}

/* offload_param nvme: the shard is accel_param_shard_rank<R>_* under
 * nvme_path, unlinked as created; after a step (and after a forward and
 * backward) only a few of its pages are in memory, against all of them when
 * they were not released. A 1024 -> 512 -> 1 MLP: 2 MB of shard over N ranks. */
static void test_param_shard_file(void) {
    if (DEV.type != ACCEL_DEV_CPU) return; /* stage 3 */
    accel_accelerator *acc = accelerator_for(3, &PARAM_MODE);
    if (!acc) return;
    accel_optimizer *o;
    accel_module *m = prepared(acc, 3, 1024, 512, ACCEL_OPTIM_ADAMW, &o);
    accel__zero_model *zm = accel__zero_of(accel__find_model(acc, m));
    CHECK(zm && zm->zpath && zm->zparams);
    if (!zm || !zm->zpath || !zm->zparams) {
        release(acc, o, m);
        return;
    }
    char want[300], file[512];
    snprintf(want, sizeof want, "%s/accel_param_shard_rank%d_", DIR_, R);
    snprintf(file, sizeof file, "%s", zm->zpath);
    CHECK_MSG(strstr(file, want) == file, "shard file %s, want %s*", file, want);
    CHECK_MSG(access(file, F_OK) != 0, "shard file %s has a name while prepared (a killed rank would leave it)", file);
    struct stat sb;
    CHECK(fstat(zm->zfd, &sb) == 0 && sb.st_size >= zm->zn * (int64_t)sizeof(float) && sb.st_nlink == 0);
    for (int k = 0; k < 2; k++) {
        accel_tensor *loss = loss_of(m, 1024, k, R);
        CHECK(accel_accelerator_backward(acc, loss) == ACCEL_OK);
        int64_t pages, in = resident_pages(zm->zparams, zm->zn * (int64_t)sizeof(float), &pages);
        CHECK_MSG(in <= 2 * zm->n_units, "after backward %lld of the shard's %lld pages are resident", (long long)in,
                  (long long)pages);
        CHECK(accel_accelerator_optimizer_step(acc, o) == ACCEL_OK);
        CHECK(accel_accelerator_zero_grad(acc, o) == ACCEL_OK);
        accel_step_reset();
        in = resident_pages(zm->zparams, zm->zn * (int64_t)sizeof(float), &pages);
        CHECK_MSG(pages > 100 && in <= 2 * zm->n_units,
                  "after step %d %lld of the shard's %lld pages are resident", k, (long long)in, (long long)pages);
    }
    CHECK_MSG(accel_accelerator_clear(acc) == ACCEL_OK, "%s", accel_last_error());
    release(acc, o, m);
}

/* accel_accelerator_new refuses, naming the problem. */
static void refused(accel_accelerator_opts o, const char *needle) {
    accel_accelerator *acc = accel_accelerator_new(&o);
    CHECK_MSG(acc == NULL, "accepted; expected \"%s\"", needle);
    accel_accelerator_free(acc);
    CHECK_STR_CONTAINS(accel_last_error(), needle);
    accel_clear_error();
}

static void test_settings_refused(void) {
    accel_accelerator_opts o = accel_accelerator_opts_default();
    o.zero_stage = 2;
    o.offload_optimizer_device = "nvme";
    o.offload_optimizer_nvme_path = "/nonexistent/accel_nvme";
    refused(o, "offload_optimizer.nvme_path \"/nonexistent/accel_nvme\": No such file or directory");
    o.offload_optimizer_nvme_path = "/proc/self/status";
    refused(o, "is not a directory");
    o.offload_optimizer_nvme_path = NULL;
    refused(o, "offload_optimizer.device=nvme needs nvme_path");
    o.offload_optimizer_device = "disk";
    refused(o, "offload_optimizer.device=\"disk\": offload device must be none, cpu or nvme");
    o.offload_optimizer_device = "cpu";
    o.zero_stage = -1;
    refused(o, "it needs ZeRO stage 1, 2 or 3, and this run is stage 0");
    o = accel_accelerator_opts_default();
    o.zero_stage = 2;
    o.offload_param_device = "cpu";
    refused(o, "offload_param.device=cpu offloads the parameter shards of ZeRO stage 3");
    o.zero_stage = 3;
    o.offload_param_device = "nvme";
    refused(o, "offload_param.device=nvme needs nvme_path (a directory for each rank's parameter shard file; "
               "launcher flag --offload_param_nvme_path)");
    o.offload_param_nvme_path = "/nonexistent/accel_nvme";
    refused(o, "offload_param.nvme_path \"/nonexistent/accel_nvme\": No such file or directory");
    o.offload_param_nvme_path = "/proc/self/status";
    refused(o, "offload_param.nvme_path \"/proc/self/status\" is not a directory");
    o = accel_accelerator_opts_default();
    o.deepspeed_config_file = ds_json("typo", 2, "\"offload_optimizer\": {\"device\": \"cpu\", \"pin_memroy\": true}", NULL);
    refused(o, "zero_optimization.offload_optimizer.pin_memroy is not a DeepSpeed key accel knows");
    o.deepspeed_config_file = ds_json("ratio", 3, "\"offload_optimizer\": {\"device\": \"cpu\", \"ratio\": 0.3}", NULL);
    refused(o, "offload_optimizer.ratio: accel offloads all of the optimizer state or none");
    char off[512];
    snprintf(off, sizeof off, "\"offload_optimizer\": {\"device\": \"nvme\", \"nvme_path\": \"%s\", \"buffer_count\": 1}",
             DIR_);
    o.deepspeed_config_file = ds_json("count", 2, off, NULL);
    refused(o, "offload_optimizer.buffer_count=1: the nvme step needs a buffer per state kind");
    snprintf(off, sizeof off, "\"offload_optimizer\": {\"device\": \"nvme\", \"nvme_path\": \"%s\"}", DIR_);
    o.deepspeed_config_file = ds_json("disagree", 2, off, NULL);
    setenv("ACCEL_OFFLOAD_OPTIMIZER_DEVICE", "cpu", 1);
    refused(o, "offload_optimizer.device: the DeepSpeed config says \"nvme\", ACCEL_OFFLOAD_OPTIMIZER_DEVICE says \"cpu\"");
    unsetenv("ACCEL_OFFLOAD_OPTIMIZER_DEVICE");
    o.deepspeed_config_file = ds_json("param3", 3, "\"offload_param\": {\"device\": \"cpu\", \"pin_memory\": true}", NULL);
    accel_accelerator *acc = accel_accelerator_new(&o); /* FULL_SHARD's shards are in host memory: a no-op */
    CHECK_MSG(acc != NULL, "%s", accel_last_error());
    accel_accelerator_free(acc);
    snprintf(off, sizeof off, "\"offload_param\": {\"device\": \"nvme\", \"nvme_path\": \"%s\", \"buffer_count\": 5, "
             "\"buffer_size\": 100000000, \"max_in_cpu\": 1000000000}", DIR_);
    o.deepspeed_config_file = ds_json("param_nvme", 3, off, NULL);
    acc = accel_accelerator_new(&o); /* the JSON's nvme_path is the shard file's directory */
    CHECK_MSG(acc != NULL, "%s", accel_last_error());
    CHECK(acc && acc->offload.param == ACCEL__OFFLOAD_NVME && !strcmp(acc->offload.param_path, DIR_));
    accel_accelerator_free(acc);
    accel_clear_error();
}

/* A full disk at prepare (the state's space is reserved there): the error
 * names the file and the cause, the file is gone, and the optimizer is the
 * user's again (its own segments, stepping its parameters). */
static void full_disk_optimizer(const char *path, const char *why) {
    accel_accelerator_opts o = accel_accelerator_opts_default();
    o.zero_stage = 2;
    o.offload_optimizer_device = "nvme";
    o.offload_optimizer_nvme_path = path;
    accel_accelerator *acc = accel_accelerator_new(&o);
    CHECK_MSG(acc != NULL, "%s", accel_last_error());
    if (!acc) return;
    accel_manual_seed(5);
    accel_module *m = mlp(DEV, 256, 128); /* 33k parameters: 264 KB of Adam state, over 64 KB on 2 ranks too */
    accel_optimizer *opt = optimizer(m, ACCEL_OPTIM_ADAMW);
    int segs = accel_optimizer_num_segments(opt);
    CHECK(accel_accelerator_prepare(acc, m, NULL) == ACCEL_OK);
    CHECK(accel_accelerator_prepare(acc, opt, NULL) != ACCEL_OK);
    CHECK_STR_CONTAINS(accel_last_error(), "cannot reserve");
    CHECK_STR_CONTAINS(accel_last_error(), why);
    CHECK_STR_CONTAINS(accel_last_error(), path);
    CHECK(accel_optimizer_num_segments(opt) == segs);
    CHECK(accel__optimizer_state_path(opt) == NULL);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "test -z \"$(ls %s | grep accel_optimizer_state_rank%d_)\"", path, R);
    CHECK_MSG(system(cmd) == 0, "a state file was left in %s", path);
    release(acc, opt, m);
    accel_step_reset();
}

/* The same for offload_param nvme: the shard's space is reserved when the
 * model is prepared, which fails naming the file and the cause; no file is left. */
static void full_disk_param(const char *path, const char *why) {
    if (DEV.type != ACCEL_DEV_CPU) return; /* stage 3 */
    accel_accelerator_opts o = accel_accelerator_opts_default();
    o.zero_stage = 3;
    o.offload_param_device = "nvme";
    o.offload_param_nvme_path = path;
    accel_accelerator *acc = accel_accelerator_new(&o);
    CHECK_MSG(acc != NULL, "%s", accel_last_error());
    if (!acc) return;
    accel_manual_seed(5);
    accel_module *m = mlp(DEV, 256, 128); /* 132 KB of f32 shard on 1 rank, 66 KB on 2 */
    CHECK(accel_accelerator_prepare(acc, m, NULL) != ACCEL_OK);
    CHECK_STR_CONTAINS(accel_last_error(), "parameter shard file");
    CHECK_STR_CONTAINS(accel_last_error(), "cannot reserve");
    CHECK_STR_CONTAINS(accel_last_error(), "offload_param.nvme_path needs room");
    CHECK_STR_CONTAINS(accel_last_error(), why);
    CHECK_STR_CONTAINS(accel_last_error(), path);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "test -z \"$(ls %s | grep accel_param_shard_rank%d_)\"", path, R);
    CHECK_MSG(system(cmd) == 0, "a shard file was left in %s", path);
    accel_accelerator_free(acc);
    accel_module_free(m);
    accel_step_reset();
}

static void full_disk(const char *path, const char *why) {
    full_disk_optimizer(path, why);
    full_disk_param(path, why);
}

/* EFBIG: a file-size limit below the state (RLIMIT_FSIZE; SIGXFSZ ignored so the write reports it). */
static void test_file_too_large(void) {
    struct rlimit old;
    CHECK(getrlimit(RLIMIT_FSIZE, &old) == 0);
    void (*prev)(int) = signal(SIGXFSZ, SIG_IGN);
    struct rlimit small = {64 << 10, old.rlim_max};
    CHECK(setrlimit(RLIMIT_FSIZE, &small) == 0);
    full_disk(DIR_, "File too large");
    CHECK(setrlimit(RLIMIT_FSIZE, &old) == 0);
    signal(SIGXFSZ, prev);
}

/* Under `accel launch --offload_optimizer_device nvme --offload_optimizer_nvme_path DIR` (param: under
 * `--zero_stage 3 --offload_param_device nvme --offload_param_nvme_path DIR`): the library takes both
 * from the launcher (the optimizer state file, or the parameter shard file, is under DIR). */
static void test_launcher_flags(const char *dir, bool param) {
    accel_accelerator *acc = accel_accelerator_new(NULL);
    CHECK_MSG(acc != NULL, "%s", accel_last_error());
    if (!acc) return;
    accel_optimizer *o;
    accel_module *m = prepared(acc, 5, 6, 24, ACCEL_OPTIM_ADAMW, &o);
    train(acc, m, o, 6, 0, 1, NULL);
    char real[4096];
    accel__zero_model *zm = accel__zero_of(accel__find_model(acc, m));
    const char *path = param ? (zm ? zm->zpath : NULL) : accel__optimizer_state_path(o);
    bool in_dir = path && realpath(dir, real) && strstr(path, real) == path;
    CHECK_MSG(in_dir, "%s file %s, want one under %s", param ? "shard" : "state", path ? path : "(none)", dir);
    if (R == 0)
        printf("offload zero_stage=%d %s_file_in_dir=%d\n", accel_accelerator_zero_stage(acc),
               param ? "shard" : "state", in_dir);
    fflush(stdout);
    accel_accelerator_free(acc);
    accel_optimizer_free(o);
    accel_module_free(m);
}

static void make_dir(accel_accelerator *a) {
    const char *base = getenv("ACCEL_OFFLOAD_TEST_DIR");
    snprintf(DIR_, sizeof DIR_, "%s/accel_offload_%d", base ? base : "/tmp", (int)(N > 1 ? getppid() : getpid()));
    mkdir(DIR_, 0700); /* every rank: EEXIST is fine */
    accel_accelerator_wait_for_everyone(a);
}

int main(int argc, char **argv) {
    accel_accelerator *a = accel_accelerator_new(NULL);
    if (!a) return 1;
    N = accel_accelerator_num_processes(a);
    R = accel_accelerator_process_index(a);
    DEV = accel_accelerator_device(a);
    if (argc == 3) { /* "enospc DIR": DIR is a 64 KiB tmpfs (tests/offload.cmake); "flags DIR", "pflags DIR": */
        /* the launcher flags of the optimizer state file, of the parameter shard file */
        snprintf(DIR_, sizeof DIR_, "%s", argv[2]);
        if (!strcmp(argv[1], "enospc")) full_disk(DIR_, "No space left on device");
        else test_launcher_flags(DIR_, !strcmp(argv[1], "pflags"));
        accel_accelerator_free(a);
        accel_thread_cleanup();
        return check_summary();
    }
    make_dir(a);
    RUN(test_offload_equals_plain);
    RUN(test_state_home);
    RUN(test_nvme_memory_bounded);
    RUN(test_nvme_resume);
    RUN(test_param_shard_file);
    RUN(test_settings_refused);
    RUN(test_file_too_large);
    accel_accelerator_wait_for_everyone(a);
    if (R == 0) {
        char cmd[300];
        snprintf(cmd, sizeof cmd, "rm -rf %s", DIR_);
        CHECK(system(cmd) == 0);
    }
    accel_accelerator_free(a);
    accel_thread_cleanup();
    return check_summary();
}
