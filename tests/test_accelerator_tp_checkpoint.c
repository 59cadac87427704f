/* save_state / load_state under tensor parallelism (forked processes): a
 * tp = 2 run of the tiny Llama with AdamW saves after 3 steps; its files
 * hold whole tensors (the model's and the Adam moments' shapes are a
 * one-process checkpoint's); resumed on the same mesh from other weights,
 * the next 2 steps' losses equal the uninterrupted run's bit for bit; on
 * one process (tp = 1) they match within 1e-5; on dp_shard 2 x tp 2 under
 * DDP and ZeRO-1, -2 and -3 the loaded state, saved again, is the
 * checkpoint's, tensor for tensor. A dp_shard 2 x tp 2 ZeRO-3 run (one
 * sequence a rank: the same global batch) saves after 3 steps (whole
 * tensors again) and after 5; resumed from the first on the same mesh its
 * 5-step files equal those bit for bit, on tp 2 DDP and on one process
 * within 1e-5. GPT-2 (Conv1D columns, c_attn's q | k | v parts) and Phi-3
 * (qkv_proj's and gate_up_proj's parts) save, resume bit for bit and on one
 * process, and reload on dp_shard 2 x tp 2 ZeRO-3 the same way. */
#include <stdlib.h>

#include "accel/accelerator.h"
#include "accel/io.h"
#include "check.h"
#include "checkpoint_whole.h"
#include "dist_group.h"
#include "tiny_llama.h"

enum { SEQS = 24, T = 8, BS = 2, SAVED_AT = 3, AFTER = 2 };

/* FIRST .. WIDER: the tp 2 DDP checkpoint "ckpt"; Z*: the dp_shard 2 x tp 2
 * ZeRO-3 one, "zckpt", and the 5-step state each run saves at its end. */
typedef enum { FIRST, RESUME, ONE, WIDER, ZFIRST, ZRESUME, ZOTHER } phase;
static struct { phase ph; int tp, dp_shard, zero; const char *end, *family; char dir[64]; } CFG = {.family = "llama"};

static void path_in(char *out, size_t n, const char *name) { snprintf(out, n, "%s/%s", CFG.dir, name); }

static const char *FILES[] = {"model.safetensors", "optimizer.safetensors"};

/* File b equals file a byte for byte. */
static void same_files(const char *a, const char *b) {
    bool same;
    checkpoint_file_diff(a, b, &same);
    CHECK_MSG(same, "%s differs from %s", b, a);
}

/* Every tensor of file b is in file a, within 1e-5 of it. */
static void close_files(const char *a, const char *b) {
    bool same;
    double d = checkpoint_file_diff(a, b, &same);
    CHECK_MSG(d <= 1e-5, "%s differs from %s by %.3g", b, a, d);
}

static int body(int rank, int world) {
    (void)world;
    accel_accelerator_opts o = accel_accelerator_opts_default();
    o.mixed_precision = "no";
    o.zero_stage = CFG.zero;
    o.parallelism = (accel_parallelism_opts){.tp_size = CFG.tp, .dp_shard_size = CFG.dp_shard};
    accel_accelerator *acc = accel_accelerator_new(&o);
    if (!acc) {
        fprintf(stderr, "rank %d: %s\n", rank, accel_last_error());
        return 1;
    }
    int64_t ids[SEQS * T];
    for (int i = 0; i < SEQS * T; i++) ids[i] = (i * 7 + i / T * 5 + 3) % 40;
    accel_tensor *all = accel_tensor_new(ACCEL_I64, 2, (int64_t[]){SEQS, T}, ACCEL_CPU_DEVICE);
    accel_tensor_from_host(all, ids);
    accel_dataset *ds = accel_tensor_dataset_new(1, &all);
    accel_dataloader_opts dlo = accel_dataloader_opts_default();
    dlo.batch_size = BS / CFG.dp_shard; /* the same global batch on every mesh */
    accel_dataloader *dl = accel_dataloader_new(ds, &dlo);
    /* resumed runs start from other weights: the checkpoint must replace them */
    accel_module *m = tiny_family(CFG.ph == FIRST || CFG.ph == ZFIRST ? 11 : 99, CFG.family);
    accel_optim_hparams h = {.lr = 0.01, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.01};
    CHECK(accel_accelerator_prepare_dataloader(acc, dl) == ACCEL_OK);
    CHECK_MSG(accel_accelerator_prepare_model(acc, m) == ACCEL_OK, "%s", accel_last_error());
    accel_optimizer *opt = accel_optimizer_new_module(ACCEL_OPTIM_ADAMW, m, &h);
    CHECK_MSG(accel_accelerator_prepare_optimizer(acc, opt) == ACCEL_OK, "%s", accel_last_error());
    bool z = CFG.ph >= ZFIRST, first = CFG.ph == FIRST || CFG.ph == ZFIRST;
    char ckpt[128], again[128], losses[128];
    path_in(ckpt, sizeof ckpt, z ? "zckpt" : "ckpt");
    path_in(again, sizeof again, "again");
    path_in(losses, sizeof losses, "losses");
    if (!first) {
        accel_resume_point at;
        CHECK_MSG(accel_accelerator_load_state(acc, ckpt, &at) == ACCEL_OK, "%s", accel_last_error());
        CHECK(at.batch == SAVED_AT);
    }
    if (CFG.ph == WIDER) { /* sliced on this mesh, gathered back: the same files */
        CHECK_MSG(accel_accelerator_save_state(acc, again, NULL, 0) == ACCEL_OK, "%s", accel_last_error());
        if (rank == 0) {
            char a[160], b[160];
            for (int i = 0; i < 2; i++) {
                snprintf(a, sizeof a, "%s/%s", ckpt, FILES[i]);
                snprintf(b, sizeof b, "%s/%s", again, FILES[i]);
                same_files(a, b);
            }
        }
        goto out;
    }
    double got[AFTER], want[AFTER];
    FILE *lf = z || first ? NULL : fopen(losses, "rb");
    CHECK(z || first || (lf && fread(want, sizeof want, 1, lf) == 1));
    if (lf) fclose(lf);
    for (int s = first ? 0 : SAVED_AT; s < SAVED_AT + AFTER; s++) {
        if (first && s == SAVED_AT)
            CHECK_MSG(accel_accelerator_save_state(acc, ckpt, NULL, 0) == ACCEL_OK, "%s", accel_last_error());
        accel_batch b;
        CHECK(accel_dataloader_next(dl, &b));
        accel_tensor *loss = accel_llama_loss(m, b.fields[0]);
        CHECK_MSG(loss && accel_accelerator_backward(acc, loss) == ACCEL_OK, "%s", accel_last_error());
        if (s >= SAVED_AT) got[s - SAVED_AT] = loss ? accel_item(loss) : NAN;
        CHECK_MSG(accel_accelerator_optimizer_step(acc, opt) == ACCEL_OK, "%s", accel_last_error());
        CHECK(accel_accelerator_zero_grad(acc, opt) == ACCEL_OK);
        accel_step_reset();
    }
    if (first && rank == 0) {
        lf = z ? NULL : fopen(losses, "wb");
        CHECK(z || (lf && fwrite(got, sizeof got, 1, lf) == 1));
        if (lf) fclose(lf);
        accel_module *whole = tiny_family(11, CFG.family);
        check_whole_checkpoint(ckpt, whole);
        accel_module_free(whole);
    }
    for (int s = 0; s < AFTER && !first && !z; s++) {
        if (CFG.ph == RESUME) /* the same mesh: the same arithmetic */
            CHECK_MSG(got[s] == want[s], "rank %d step %d: loss %.17g, uninterrupted %.17g", rank, s, got[s], want[s]);
        else
            CHECK_MSG(fabs(got[s] - want[s]) <= 1e-5 * fmax(1, fabs(want[s])), "step %d: loss %.9g, want %.9g", s,
                      got[s], want[s]);
    }
    if (z) { /* the 5-step state, against the uninterrupted ZeRO-3 run's */
        char end[128], a[160], b[160];
        path_in(end, sizeof end, CFG.end);
        CHECK_MSG(accel_accelerator_save_state(acc, end, NULL, 0) == ACCEL_OK, "%s", accel_last_error());
        for (int i = 0; i < 2 && rank == 0 && CFG.ph != ZFIRST; i++) {
            snprintf(a, sizeof a, "%s/zend/%s", CFG.dir, FILES[i]);
            snprintf(b, sizeof b, "%s/%s", end, FILES[i]);
            if (CFG.ph == ZRESUME) same_files(a, b); /* the same mesh: the same arithmetic */
            else close_files(a, b);
        }
    }
out:
    accel_accelerator_free(acc);
    accel_optimizer_free(opt);
    accel_module_free(m);
    accel_dataloader_free(dl), accel_dataset_free(ds), accel_tensor_free(all);
    return check_summary();
}

static void run(phase ph, int world, int tp, int dp_shard, int zero, const char *end) {
    CFG.ph = ph, CFG.tp = tp, CFG.dp_shard = dp_shard, CFG.zero = zero, CFG.end = end;
    dist_group g = {.world = world, .one_machine = true, .timeout = "60", .kill_after_s = 240};
    CHECK(dist_group_runs_ok(&g, body, "%s phase %d (tp %d x dp_shard %d, zero %d)", CFG.family, (int)ph, tp, dp_shard,
                             zero));
}

int main(void) {
    snprintf(CFG.dir, sizeof CFG.dir, "/tmp/accel_tpckpt_XXXXXX");
    CHECK(mkdtemp(CFG.dir) != NULL);
    run(FIRST, 2, 2, 1, 0, NULL);
    run(RESUME, 2, 2, 1, 0, NULL);
    run(ONE, 1, 1, 1, 0, NULL);
    for (int zero = 0; zero <= 3; zero++) run(WIDER, 4, 2, 2, zero, NULL);
    run(ZFIRST, 4, 2, 2, 3, "zend");
    run(ZRESUME, 4, 2, 2, 3, "zend_same");
    run(ZOTHER, 2, 2, 1, 0, "zend_tp");
    run(ZOTHER, 1, 1, 1, 0, "zend_one");
    for (int f = 0; f < 2; f++) { /* the fused and Conv1D families' slices */
        CFG.family = f ? "phi3" : "gpt2";
        run(FIRST, 2, 2, 1, 0, NULL);
        run(RESUME, 2, 2, 1, 0, NULL);
        run(ONE, 1, 1, 1, 0, NULL);
        run(WIDER, 4, 2, 2, 3, NULL);
    }
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", CFG.dir);
    CHECK(system(cmd) == 0);
    return check_summary();
}
