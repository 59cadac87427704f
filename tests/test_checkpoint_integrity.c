/* Same-size corruption of a checkpoint is detected (issue 22, item 11): a bit
 * flipped anywhere in any file of a save_state checkpoint makes load_state
 * fail naming the file, for every strategy (DDP, ZeRO-1, ZeRO-2, ZeRO-3 with
 * FULL_STATE_DICT and SHARDED_STATE_DICT); with automatic naming load_state
 * falls back to the previous checkpoint and names the corrupted file on
 * stderr; `accel merge-weights` of a corrupted sharded checkpoint exits
 * non-zero naming the file. The sweep flips one bit at many offsets of every
 * file (every byte of the marker itself). No flip is harmless: the marker's
 * CRC-32C covers every byte of every file (a CRC detects every single-bit
 * error), and the marker carries a CRC of its own content.
 * Runs plainly and under `accel launch` (rank 0 flips, every rank loads and
 * must name the file). */
#include <dirent.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "accel/accel.h"
#include "accel/accelerator.h"
#include "accel/dist.h"
#include "check.h"
#include "core/checksum.h"
#include "io/checkpoint_marker.h"
#include "sibling_exe.h"

static char ROOT[256];
static int R;

typedef struct run {
    accel_accelerator *acc;
    accel_module *model;
    accel_optimizer *opt;
    accel_lr_scheduler *sched;
} run;

static void run_make(run *r, int stage, const char *sdt, bool automatic) {
    accel_accelerator_opts o = accel_accelerator_opts_default();
    o.mixed_precision = "no";
    o.zero_stage = stage;
    o.fsdp_state_dict_type = sdt;
    o.project_dir = ROOT;
    o.automatic_checkpoint_naming = automatic;
    r->acc = accel_accelerator_new(&o);
    CHECK_MSG(r->acc, "%s", accel_last_error());
    accel_manual_seed(3);
    accel_module *l[3] = {accel_linear_new(8, 33, true, ACCEL_CPU_DEVICE, ACCEL_F32), accel_relu_module_new(),
                          accel_linear_new(33, 3, true, ACCEL_CPU_DEVICE, ACCEL_F32)};
    r->model = accel_sequential_new(3, l);
    accel_optim_hparams h = accel_optim_defaults(ACCEL_OPTIM_ADAMW, 0.01);
    r->opt = accel_optimizer_new_module(ACCEL_OPTIM_ADAMW, r->model, &h);
    r->sched = accel_lr_scheduler_new(r->opt, ACCEL_SCHED_COSINE, 3, 40);
    CHECK_MSG(accel_accelerator_prepare(r->acc, r->model, r->opt, NULL, r->sched) == ACCEL_OK, "%s",
              accel_last_error());
    /* one step: the optimizer has state to save */
    float x[2 * 8], y[2 * 3];
    for (int i = 0; i < 16; i++) x[i] = (float)(i % 5) * 0.1f;
    for (int i = 0; i < 6; i++) y[i] = (float)i * 0.2f;
    accel_tensor *loss = accel_mse_loss(accel_module_call(r->model, accel_from_floats(ACCEL_SHAPE(2, 8), x)),
                                        accel_from_floats(ACCEL_SHAPE(2, 3), y));
    CHECK(accel_accelerator_backward(r->acc, loss) == ACCEL_OK);
    CHECK(accel_accelerator_optimizer_step(r->acc, r->opt) == ACCEL_OK);
    accel_accelerator_scheduler_step(r->acc, r->sched);
    accel_accelerator_zero_grad(r->acc, r->opt);
    accel_step_reset();
}

static void run_free(run *r) {
    CHECK_MSG(accel_accelerator_clear(r->acc) == ACCEL_OK, "%s", accel_last_error());
    accel_lr_scheduler_free(r->sched);
    accel_optimizer_free(r->opt);
    accel_module_free(r->model);
    accel_accelerator_free(r->acc);
}

static void rm_tree(const char *dir) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0);
}

static int64_t file_size(const char *path) {
    struct stat sb;
    return stat(path, &sb) ? -1 : (int64_t)sb.st_size;
}

/* Flips bit `bit` of the byte at `off` of path (twice restores it). */
static void flip(const char *path, int64_t off, int bit) {
    int fd = open(path, O_RDWR);
    unsigned char b = 0;
    CHECK(fd >= 0 && pread(fd, &b, 1, off) == 1);
    b ^= (unsigned char)(1u << bit);
    CHECK(pwrite(fd, &b, 1, off) == 1);
    close(fd);
}

/* The files the checkpoint's marker lists ("model.safetensors",
 * "pytorch_model_fsdp_0/shard_0.safetensors", ...) and the marker itself. */
static int marker_files(const char *dir, char names[][128], int cap) {
    char path[600];
    snprintf(path, sizeof path, "%s/accel_checkpoint.json", dir);
    json_t *root = json_load_file(path, 0, NULL);
    json_t *files = json_object_get(root, "files");
    CHECK(json_is_object(files));
    int n = 0;
    const char *k;
    json_t *v;
    json_object_foreach(files, k, v) if (n < cap - 1) snprintf(names[n++], 128, "%s", k);
    snprintf(names[n++], 128, "accel_checkpoint.json");
    json_decref(root);
    return n;
}

/* Offsets to flip in a file of `size` bytes: every byte of the marker (every
 * 5th under the launcher, where each flip costs a few collectives), else the
 * first and last 8 bytes and 48 spread between. */
static int offsets(int64_t size, bool every, int64_t *out) {
    int n = 0;
    if (every) {
        for (int64_t o = 0; o < size; o += accel_dist_world_size() > 1 ? 5 : 1) out[n++] = o;
        return n;
    }
    for (int64_t o = 0; o < 8 && o < size; o++) out[n++] = o;
    for (int k = 1; k <= 48; k++) out[n++] = size * k / 49;
    for (int64_t o = size - 8 < 8 ? 8 : size - 8; o < size; o++) out[n++] = o;
    return n;
}

/* Every flip in every file of dir makes load_state(dir) fail naming the file
 * (on every rank); returns how many flips were tried. */
static int sweep(run *r, const char *dir) {
    static char names[64][128];
    int nf = marker_files(dir, names, 64), tried = 0;
    CHECK(nf >= 4);
    static int64_t offs[1 << 16];
    for (int f = 0; f < nf; f++) {
        char path[9000];
        snprintf(path, sizeof path, "%s/%s", dir, names[f]);
        bool is_marker = !strcmp(names[f], "accel_checkpoint.json");
        int64_t size = file_size(path);
        /* every byte of the marker is flipped (offs holds them); of the others 64 spread (the GEMM
         * choices' file grows with the shapes the process's cache has seen: past 64 KB in a full run) */
        CHECK_MSG(size > 0 && (!is_marker || size < (1 << 16)), "%s: %lld bytes", path, (long long)size);
        int no = offsets(size, is_marker, offs);
        for (int i = 0; i < no; i++, tried++) {
            int bit = (int)((offs[i] + i) % 8);
            if (R == 0) flip(path, offs[i], bit);
            accel_accelerator_wait_for_everyone(r->acc);
            accel_status s = accel_accelerator_load_state(r->acc, dir, NULL);
            CHECK_MSG(s != ACCEL_OK, "%s: a flip of bit %d at byte %lld went undetected", names[f], bit,
                      (long long)offs[i]);
            /* the marker is named as itself; a data file as what the marker calls it */
            CHECK_MSG(s == ACCEL_OK || strstr(accel_last_error(), is_marker ? "accel_checkpoint.json" : names[f]),
                      "%s byte %lld: the error does not name the file: %s", names[f], (long long)offs[i],
                      accel_last_error());
            accel_clear_error();
            accel_accelerator_wait_for_everyone(r->acc); /* every rank has looked */
            if (R == 0) flip(path, offs[i], bit);
        }
        accel_accelerator_wait_for_everyone(r->acc); /* the last flip is undone before anyone reads */
    }
    CHECK_MSG(accel_accelerator_load_state(r->acc, dir, NULL) == ACCEL_OK, "%s", accel_last_error());
    return tried;
}

/* Every file the save wrote into dir (and one level down) is one its marker
 * lists, so that the sweep flips it: the marker leaves out only what is not
 * the checkpoint's (a user's files beside it), by name. */
static void all_listed(const char *dir, const char *prefix, char names[][128], int n) {
    DIR *d = opendir(dir);
    CHECK(d != NULL);
    for (struct dirent *e; d && (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        char path[1200], name[300];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        snprintf(name, sizeof name, "%s%s", prefix, e->d_name);
        struct stat sb;
        CHECK(stat(path, &sb) == 0);
        if (S_ISDIR(sb.st_mode)) {
            if (!*prefix) all_listed(path, strcat(name, "/"), names, n);
            continue;
        }
        int i = 0;
        while (i < n && strcmp(names[i], name)) i++;
        CHECK_MSG(i < n, "%s: the save wrote %s, which its marker does not list", dir, name);
    }
    if (d) closedir(d);
}

static void sweep_strategy(int stage, const char *sdt) {
    run r;
    run_make(&r, stage, sdt, false);
    char dir[400];
    snprintf(dir, sizeof dir, "%s/ckpt_%d_%s", ROOT, stage, sdt ? sdt : "default");
    CHECK_MSG(accel_accelerator_save_state(r.acc, dir, NULL, 0) == ACCEL_OK, "%s", accel_last_error());
    static char names[64][128];
    all_listed(dir, "", names, marker_files(dir, names, 64));
    int tried = sweep(&r, dir);
    if (R == 0) printf("stage %d %s: %d flips detected\n", stage, sdt ? sdt : "", tried);
    run_free(&r);
}

static void test_sweep_ddp(void) { sweep_strategy(0, NULL); }
static void test_sweep_zero1(void) { sweep_strategy(1, NULL); }
static void test_sweep_zero2(void) { sweep_strategy(2, NULL); }
static void test_sweep_zero3_full(void) { sweep_strategy(3, "FULL_STATE_DICT"); }
static void test_sweep_zero3_sharded(void) { sweep_strategy(3, "SHARDED_STATE_DICT"); }

/* A marker written before checksums (sizes only) still loads; a marker whose
 * own checksum was removed does not. */
static void test_marker_versions(void) {
    run r;
    run_make(&r, 0, NULL, false);
    char dir[400], path[600];
    snprintf(dir, sizeof dir, "%s/old_marker", ROOT);
    snprintf(path, sizeof path, "%s/accel_checkpoint.json", dir);
    CHECK(accel_accelerator_save_state(r.acc, dir, NULL, 0) == ACCEL_OK);
    json_t *root = json_load_file(path, 0, NULL);
    CHECK(json_is_string(json_object_get(root, "marker_crc32c")) && json_is_object(json_object_get(root, "crc32c")));
    json_object_del(root, "marker_crc32c");
    accel_accelerator_wait_for_everyone(r.acc);
    if (R == 0) CHECK(json_dump_file(root, path, JSON_INDENT(2)) == 0);
    accel_accelerator_wait_for_everyone(r.acc);
    CHECK(accel_accelerator_load_state(r.acc, dir, NULL) == ACCEL_ERR_FORMAT);
    CHECK_STR_CONTAINS(accel_last_error(), "does not match its own checksum (marker_crc32c missing");
    accel_clear_error();
    json_object_del(root, "crc32c");
    accel_accelerator_wait_for_everyone(r.acc);
    if (R == 0) CHECK(json_dump_file(root, path, JSON_INDENT(2)) == 0);
    accel_accelerator_wait_for_everyone(r.acc);
    CHECK_MSG(accel_accelerator_load_state(r.acc, dir, NULL) == ACCEL_OK, "%s", accel_last_error());
    json_decref(root);
    run_free(&r);
}

/* The marker lists bytes, CRC and name of a file outside the checkpoint
 * ("../outside.bin", its true size and CRC, the marker's own checksum
 * recomputed): the check refuses the name instead of reading that file.
 * Also an absolute name, "." / ".." parts and a name two folders deep, none
 * of which accel__marker_write lists. */
static void write_marker_listing(const char *dir, const char *name, const char *outside) {
    char path[600];
    snprintf(path, sizeof path, "%s/%s", dir, ACCEL__MARKER);
    json_t *root = json_load_file(path, 0, NULL);
    CHECK(root != NULL);
    FILE *f = fopen(outside, "rb");
    char bytes[64];
    size_t n = f ? fread(bytes, 1, sizeof bytes, f) : 0;
    if (f) fclose(f);
    char hex[9];
    snprintf(hex, sizeof hex, "%08x", accel__crc32c(bytes, n));
    json_object_set_new(json_object_get(root, "files"), name, json_integer((json_int_t)n));
    json_object_set_new(json_object_get(root, "crc32c"), name, json_string(hex));
    json_object_del(root, "marker_crc32c");
    char *body = json_dumps(root, JSON_COMPACT | JSON_SORT_KEYS);
    snprintf(hex, sizeof hex, "%08x", accel__crc32c(body, strlen(body)));
    free(body);
    json_object_set_new(root, "marker_crc32c", json_string(hex));
    CHECK(json_dump_file(root, path, JSON_INDENT(2)) == 0);
    json_decref(root);
}

static void test_marker_names_outside_refused(void) {
    char dir[400], file[500], outside[500];
    snprintf(dir, sizeof dir, "%s/names_%d", ROOT, R);
    snprintf(outside, sizeof outside, "%s/outside_%d.bin", ROOT, R);
    mkdir(ROOT, 0755);
    CHECK(mkdir(dir, 0755) == 0);
    snprintf(file, sizeof file, "%s/model.safetensors", dir);
    FILE *f = fopen(file, "wb");
    CHECK(f && fputs("weights", f) >= 0 && fclose(f) == 0);
    f = fopen(outside, "wb");
    CHECK(f && fputs("not the checkpoint's", f) >= 0 && fclose(f) == 0);
    CHECK(accel__marker_write(dir, 1, NULL, "test") == ACCEL_OK);
    CHECK_MSG(accel__marker_check(dir, true, NULL, "test") == ACCEL_OK, "%s", accel_last_error());
    char name[64], abs_name[600];
    snprintf(name, sizeof name, "../outside_%d.bin", R);
    snprintf(abs_name, sizeof abs_name, "%s", outside);
    const char *bad[] = {name, abs_name, "./model.safetensors", "a/../model.safetensors", "a/b/model.safetensors", ""};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        CHECK(accel__marker_write(dir, 1, NULL, "test") == ACCEL_OK);
        write_marker_listing(dir, bad[i], outside);
        CHECK_MSG(accel__marker_check(dir, true, NULL, "test") == ACCEL_ERR_FORMAT, "\"%s\" was not refused",
                  bad[i]);
        CHECK_STR_CONTAINS(accel_last_error(), "which is no file of the checkpoint");
        accel_clear_error();
    }
}

/* Automatic naming: a corrupted newest checkpoint is skipped with a warning
 * naming the file; the previous one loads. */
static void test_falls_back_to_previous(void) {
    run r;
    run_make(&r, 0, NULL, true);
    accel_tensor **ps;
    accel_module_parameters(r.model, &ps);
    float *w = ps[0]->data, saved = w[0];
    char first[512], second[512], path[700], err_path[600];
    CHECK(accel_accelerator_save_state(r.acc, NULL, first, sizeof first) == ACCEL_OK);
    w[0] = saved + 1.0f;
    CHECK(accel_accelerator_save_state(r.acc, NULL, second, sizeof second) == ACCEL_OK);
    snprintf(path, sizeof path, "%s/model.safetensors", second);
    if (R == 0) flip(path, file_size(path) - 3, 2);
    accel_accelerator_wait_for_everyone(r.acc);
    snprintf(err_path, sizeof err_path, "%s/stderr_%d.txt", ROOT, R);
    fflush(stderr);
    int saved_fd = dup(2), fd = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 2);
    close(fd);
    accel_status s = accel_accelerator_load_state(r.acc, NULL, NULL);
    fflush(stderr);
    dup2(saved_fd, 2);
    close(saved_fd);
    CHECK_MSG(s == ACCEL_OK, "%s", accel_last_error());
    CHECK(w[0] == saved); /* the first save's weights */
    if (R == 0) {
        char err[4096] = "";
        FILE *f = fopen(err_path, "r");
        size_t got = f ? fread(err, 1, sizeof err - 1, f) : 0;
        err[got] = 0;
        if (f) fclose(f);
        CHECK_STR_CONTAINS(err, second);
        CHECK_STR_CONTAINS(err, "is corrupted: model.safetensors has CRC-32C");
    }
    accel_free(ps);
    accel_accelerator_wait_for_everyone(r.acc);
    run_free(&r);
}

/* `accel merge-weights` of a ZeRO-3 sharded checkpoint: a flip in any file
 * of pytorch_model_fsdp_0/ makes it exit non-zero naming the file; a flip in
 * a file it does not read (the optimizer's) does not stop it. */
static void test_merge_weights_refuses_corruption(void) {
    run r;
    run_make(&r, 3, "SHARDED_STATE_DICT", false);
    char dir[400], accel_bin[8192];
    snprintf(dir, sizeof dir, "%s/merge_src", ROOT);
    CHECK(accel_accelerator_save_state(r.acc, dir, NULL, 0) == ACCEL_OK);
    accel_accelerator_wait_for_everyone(r.acc);
    if (R == 0 && sibling_exe("accel", accel_bin, sizeof accel_bin)) {
        static char names[64][128];
        int nf = marker_files(dir, names, 64), merged = 0;
        for (int f = 0; f < nf; f++) {
            if (strncmp(names[f], "pytorch_model_fsdp_0/", 21)) continue;
            char path[9000], cmd[20000], out[900];
            snprintf(path, sizeof path, "%s/%s", dir, names[f]);
            int64_t size = file_size(path);
            for (int k = 0; k < 9; k++) {
                int64_t off = size * k / 9;
                flip(path, off, k % 8);
                snprintf(out, sizeof out, "%s/merge_out_%d.txt", ROOT, k);
                for (int via_sub = 0; via_sub < 2; via_sub++) { /* the checkpoint, or its model directory */
                    snprintf(cmd, sizeof cmd, "'%s' merge-weights '%s%s' '%s/merged' >'%s' 2>&1", accel_bin, dir,
                             via_sub ? "/pytorch_model_fsdp_0" : "", ROOT, out);
                    int rc = system(cmd);
                    CHECK_MSG(WIFEXITED(rc) && WEXITSTATUS(rc) != 0, "%s byte %lld: merge-weights exited 0",
                              names[f], (long long)off);
                    char text[4096] = "";
                    FILE *fo = fopen(out, "r");
                    size_t got = fo ? fread(text, 1, sizeof text - 1, fo) : 0;
                    text[got] = 0;
                    if (fo) fclose(fo);
                    CHECK_STR_CONTAINS(text, names[f]);
                    merged++;
                }
                flip(path, off, k % 8);
            }
        }
        CHECK(merged >= 36);
        /* a DDP save_state directory merged through its model.safetensors */
        char ddp[500], path[9000], cmd[20000];
        snprintf(ddp, sizeof ddp, "%s/ckpt_0_default", ROOT);
        snprintf(path, sizeof path, "%s/model.safetensors", ddp);
        flip(path, file_size(path) / 2, 5);
        snprintf(cmd, sizeof cmd, "'%s' merge-weights '%s' '%s/merged_ddp' 2>&1 | grep -q 'model.safetensors has CRC-32C'",
                 accel_bin, ddp, ROOT);
        CHECK(system(cmd) == 0);
        snprintf(cmd, sizeof cmd, "'%s' merge-weights '%s' '%s/merged_ddp' >/dev/null 2>&1", accel_bin, ddp, ROOT);
        CHECK(system(cmd) != 0);
        flip(path, file_size(path) / 2, 5);
        CHECK(system(cmd) == 0);
        /* an optimizer file is not the model: the merge goes on */
        for (int f = 0; f < nf; f++) {
            if (strncmp(names[f], "optimizer_0/", 12)) continue;
            char path[9000], cmd[20000];
            snprintf(path, sizeof path, "%s/%s", dir, names[f]);
            flip(path, 0, 1);
            snprintf(cmd, sizeof cmd, "'%s' merge-weights '%s' '%s/merged' >/dev/null", accel_bin, dir, ROOT);
            CHECK(system(cmd) == 0);
            flip(path, 0, 1);
            break;
        }
    }
    accel_accelerator_wait_for_everyone(r.acc);
    run_free(&r);
}

int main(void) {
    snprintf(ROOT, sizeof ROOT, "/tmp/accel_integrity_%d", (int)(accel_dist_world_size() > 1 ? getppid() : getpid()));
    R = accel_dist_rank();
    if (R == 0) rm_tree(ROOT);
    RUN(test_sweep_ddp);
    RUN(test_sweep_zero1);
    RUN(test_sweep_zero2);
    RUN(test_sweep_zero3_full);
    RUN(test_sweep_zero3_sharded);
    RUN(test_marker_versions);
    RUN(test_marker_names_outside_refused);
    RUN(test_falls_back_to_previous);
    RUN(test_merge_weights_refuses_corruption);
    if (R == 0) rm_tree(ROOT);
    accel_thread_cleanup();
    return check_summary();
}
