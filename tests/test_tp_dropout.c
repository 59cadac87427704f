/* Dropout under tensor parallelism (accel_llama_parallelize) and its
 * sequence parallelism, on 2 and 4 forked processes: the activations
 * replicated over the tp group draw their masks from the default generator,
 * alike on every rank, and the sharded ones from the model's per-rank stream
 * (seed + 2718 + tp rank, as Megatron's model-parallel RNG tracker):
 * - GPT-2, Phi and GPT-NeoX with every dropout on: a layer's output (the
 *   residual stream, replicated without sequence parallelism) is the same
 *   on every rank bit for bit, and the default generator has advanced alike
 *   on every rank; under sequence parallelism it has not advanced at all
 *   (every dropout then is on a shard) while the per-rank stream has;
 * - with the attention's dropout off, the embeddings' and branches' masks
 *   are one process's: loss and gradients within 1e-5 of it;
 * - attention dropout with every head's weights alike: the output
 *   projection's input (the rank's heads) is the same on every rank in
 *   eval and differs between ranks while training;
 * - under sequence parallelism with every position's embedding alike (one
 *   token id, no learned positions: Phi, GPT-NeoX) the embeddings' dropout
 *   gives each rank's positions their own mask;
 * - p = 0 while training and p > 0 in eval give the same loss bit for bit
 *   and draw nothing from either generator;
 * - with the layers checkpointed the gradients are the uncheckpointed
 *   ones bit for bit (the recompute replays the per-rank stream);
 * - save_state / load_state at tp 2 (GPT-2 with its dropouts): the resumed
 *   run's losses are the uninterrupted run's bit for bit; a dp_shard 2 x
 *   tp 2 checkpoint loaded on tp 4 resumes the streams of the ranks whose
 *   tp rank is the same and starts the others' afresh;
 *   accel_set_seed(device_specific) gives the ranks of a tp group one seed
 *   (dp_shard 2 x tp 2);
 * - pipeline parallelism (pp 2) refuses dropout while training by name
 *   (GPT-NeoX, StableLM, Starcoder2), context parallelism the embeddings'
 *   and branches' dropout while training (Phi, GPT-NeoX, StableLM's
 *   branches only, Starcoder2), and so does accel_llama_activation_bytes'
 *   cp estimate (both run the same models in eval). */
#include <stdlib.h>
#include <string.h>

#include "accel/accelerator.h"
#include "accel/cp.h"
#include "check.h"
#include "dist_group.h"
#include "nn/tp_internal.h"
#include "tiny_llama.h"
#include "tp_fixture.h"

enum { B = 2, T = 8, MAX_WORLD = 4 };

/* The tiny model of family with attention dropout attn and the embeddings'
 * and branches' hidden (StableLM, which has no embedding dropout: the
 * branches' only), of seed (alike on every rank). */
static accel_module *seeded_model(uint64_t seed, const char *family, double attn, double hidden) {
    accel_manual_seed(seed);
    accel_llama_config c = tiny_family_config(family);
    c.attn_pdrop = attn, c.resid_pdrop = hidden, c.embd_pdrop = strcmp(family, "stablelm") ? hidden : 0;
    accel_module *m = accel_llama_new(&c, ACCEL_CPU_DEVICE);
    CHECK_MSG(m != NULL, "%s: %s", family, accel_last_error());
    return m;
}

static accel_module *dropout_model(const char *family, double attn, double hidden) {
    return seeded_model(11, family, attn, hidden);
}

static accel_module *parallel(accel_module *m, accel_pg *pg, bool sp) {
    CHECK_MSG(m && accel_llama_parallelize(m, pg, sp) == ACCEL_OK, "%s", accel_last_error());
    return m;
}

/* ids [B, T]: one id everywhere when `same`, else varied. */
static accel_tensor *ids_of(bool same) {
    int64_t v[B * T];
    for (int i = 0; i < B * T; i++) v[i] = same ? 5 : (i * 7 + 1) % 40;
    return pi64(ACCEL_SHAPE(B, T), v);
}

static double loss_of(accel_module *m, accel_tensor *ids, bool backward) {
    accel_tensor *l = accel_llama_loss(m, ids);
    CHECK_MSG(l && (!backward || accel_backward(l) == ACCEL_OK), "%s", accel_last_error());
    return l ? accel_item(l) : NAN;
}

/* ---- capturing a module's input or output through its hook */

typedef struct capture {
    bool input;
    float *v;
    int64_t n;
} capture;

static accel_status keep(capture *c, const accel_tensor *t) {
    free(c->v);
    c->n = accel_numel(t);
    c->v = malloc((size_t)c->n * sizeof *c->v);
    return c->v ? accel_to_floats(t, c->v) : ACCEL_ERR_OOM;
}

static accel_status capture_in(accel_module *m, accel_tensor **x, void *ctx) {
    (void)m;
    capture *c = ctx;
    return c->input ? keep(c, *x) : ACCEL_OK;
}

static accel_status capture_out(accel_module *m, accel_tensor **y, void *ctx) {
    (void)m;
    capture *c = ctx;
    return !c->input && *y ? keep(c, *y) : ACCEL_OK;
}

static void capture_on(accel_module *model, const char *path, capture *c) {
    accel_module *m = accel_module_find(model, path);
    CHECK_MSG(m && accel_module_set_hook(m, &(accel_module_hook){capture_in, capture_out, NULL, c}) == ACCEL_OK,
              "no module %s", path);
}

/* Whether rank r's capture equals rank 0's, for each r (same[world]): every
 * rank's values gathered (each rank holds as many). */
static void same_as_rank0(accel_pg *pg, const capture *c, bool *same) {
    int world = accel_pg_size(pg);
    float *all = malloc((size_t)(world * c->n) * sizeof *all);
    CHECK(c->v && all && accel_pg_all_gather(pg, c->v, all, (size_t)c->n, ACCEL_F32) == ACCEL_OK);
    for (int r = 0; r < world; r++) same[r] = all && !memcmp(all, all + r * c->n, (size_t)c->n * sizeof *all);
    free(all);
}

static const char *layer_prefix(const char *family) {
    return !strcmp(family, "gpt2") ? "transformer.h" : !strcmp(family, "gpt_neox") ? "gpt_neox.layers" : "model.layers";
}

/* ---- the generators' offsets */

typedef struct offsets {
    uint64_t dflt, tp;
} offsets;

static offsets offsets_of(accel_module *m) {
    accel_rng *tp = accel__tp_dropout_rng(m);
    CHECK_MSG(tp != NULL, "the parallelized model has no tp dropout stream");
    return (offsets){accel_default_rng()->offset, tp ? tp->offset : 0};
}

/* Every rank's value v equal. */
static bool alike_on_ranks(accel_pg *pg, uint64_t v) {
    int64_t all[MAX_WORLD], mine = (int64_t)v;
    CHECK(accel_pg_all_gather(pg, &mine, all, 1, ACCEL_I64) == ACCEL_OK);
    bool same = true;
    for (int r = 1; r < accel_pg_size(pg); r++) same &= all[r] == all[0];
    return same;
}

/* Every dropout on: without sequence parallelism layer 1's output (the
 * residual stream) is every rank's alike, and the default generator moved
 * alike on every rank; with it the default generator did not move. The
 * per-rank stream moved in both (the attention's masks). */
static void streams(accel_pg *pg, const char *family, bool sp) {
    accel_module *m = parallel(dropout_model(family, 0.3, 0.3), pg, sp);
    accel_tensor *ids = ids_of(false);
    char path[64];
    snprintf(path, sizeof path, "%s.1", layer_prefix(family));
    capture out = {0};
    capture_on(m, path, &out);
    accel_module_train(m, false);
    loss_of(m, ids, false);
    float *eval = out.v;
    int64_t n = out.n;
    out.v = NULL;
    accel_step_reset();
    accel_module_train(m, true);
    offsets before = offsets_of(m);
    loss_of(m, ids, true);
    offsets after = offsets_of(m);
    CHECK_MSG(out.n == n && eval && out.v && memcmp(eval, out.v, (size_t)n * sizeof *eval),
              "%s (sp %d): the training forward dropped nothing", family, sp);
    CHECK_MSG(after.tp > before.tp, "%s (sp %d): the attention's masks were not the tp stream's", family, sp);
    if (sp) {
        CHECK_MSG(after.dflt == before.dflt, "%s: under sequence parallelism a dropout drew from the default "
                  "generator (%llu values)", family, (unsigned long long)(after.dflt - before.dflt));
    } else {
        CHECK_MSG(after.dflt > before.dflt && alike_on_ranks(pg, after.dflt),
                  "%s: the default generator did not move alike on every tp rank", family);
        bool same[MAX_WORLD];
        same_as_rank0(pg, &out, same);
        for (int r = 1; r < accel_pg_size(pg); r++)
            CHECK_MSG(same[r], "%s: rank %d's replicated residual stream differs from rank 0's", family, r);
    }
    accel_step_reset();
    accel_module_set_hook(accel_module_find(m, path), NULL);
    free(eval), free(out.v);
    accel_tensor_free(ids);
    accel_module_free(m);
}

/* The attention's dropout off: the embeddings' and branches' masks (the
 * default generator's) are one process's, so are the loss and gradients. */
static void replicas_as_one_process(accel_pg *pg, const char *family) {
    accel_module *ref = dropout_model(family, 0.0, 0.3), *m = parallel(dropout_model(family, 0.0, 0.3), pg, false);
    accel_tensor *ids = ids_of(false);
    accel_module_train(ref, false);
    double eval = loss_of(ref, ids, false);
    accel_step_reset();
    accel_module_train(ref, true);
    accel_manual_seed(77);
    double want = loss_of(ref, ids, true);
    accel_manual_seed(77);
    double got = loss_of(m, ids, true);
    CHECK_MSG(want != eval, "%s: the dropout changed nothing", family);
    CHECK_MSG(fabs(got - want) <= 1e-5 * fmax(1, fabs(want)), "%s: loss %.9g under tp, %.9g on one process", family,
              got, want);
    grads_match(m, ref);
    accel_step_reset();
    accel_tensor_free(ids);
    accel_module_free(ref), accel_module_free(m);
}

/* Rows r of w [rows, cols] (a Linear's q/k/v weight or bias, rows per head
 * of d) set to row r % d: every head computes head 0's projection. */
static void heads_alike_rows(accel_tensor *w, int64_t d) {
    int64_t rows = w->shape[0], cols = w->ndim > 1 ? w->shape[1] : 1;
    float *v = floats_of(w);
    for (int64_t r = d; r < rows; r++) memcpy(v + r * cols, v + (r % d) * cols, (size_t)cols * sizeof *v);
    accel_tensor_from_host(w, v);
    free(v);
}

/* GPT-2's c_attn [C, 3C] (bias [3C]): column p C + h D + j of each part p set
 * to its column p C + j. */
static void heads_alike_columns(accel_tensor *w, int64_t C, int64_t D) {
    int64_t rows = w->ndim > 1 ? w->shape[0] : 1, cols = w->shape[w->ndim - 1];
    float *v = floats_of(w);
    for (int64_t i = 0; i < rows; i++)
        for (int64_t c = 0; c < cols; c++) v[i * cols + c] = v[i * cols + c / C * C + c % C % D];
    accel_tensor_from_host(w, v);
    free(v);
}

/* Layer 0's heads all made head 0 (before the plan cuts them). */
static void heads_alike(accel_module *m, const char *family) {
    const accel_llama_config *c = accel_llama_config_of(m);
    int64_t D = c->head_dim, C = c->hidden_size;
    static const char *const PHI[] = {"q_proj.weight", "q_proj.bias", "k_proj.weight", "k_proj.bias",
                                      "v_proj.weight", "v_proj.bias"};
    char name[96];
    if (!strcmp(family, "gpt2")) {
        for (int k = 0; k < 2; k++) {
            snprintf(name, sizeof name, "transformer.h.0.attn.c_attn.%s", k ? "bias" : "weight");
            heads_alike_columns(accel_module_get_tensor(m, name), C, D);
        }
        return;
    }
    for (int k = 0; k < 6; k++) {
        snprintf(name, sizeof name, "model.layers.0.self_attn.%s", PHI[k]);
        accel_tensor *w = accel_module_get_tensor(m, name);
        CHECK_MSG(w != NULL, "no %s", name);
        if (w) heads_alike_rows(w, D);
    }
}

/* Every head alike: the output projection's input, the rank's heads, is
 * every rank's alike in eval; training, each rank's attention masks differ
 * from rank 0's. */
static void heads_masks_differ(accel_pg *pg, const char *family, bool sp) {
    accel_module *m = dropout_model(family, 0.5, 0.3);
    heads_alike(m, family);
    parallel(m, pg, sp);
    const char *path = !strcmp(family, "gpt2") ? "transformer.h.0.attn.c_proj" : "model.layers.0.self_attn.dense";
    capture in = {.input = true};
    capture_on(m, path, &in);
    accel_tensor *ids = ids_of(false);
    bool same[MAX_WORLD];
    for (int training = 0; training < 2; training++) {
        accel_module_train(m, training);
        loss_of(m, ids, false);
        same_as_rank0(pg, &in, same);
        for (int r = 1; r < accel_pg_size(pg); r++)
            CHECK_MSG(same[r] == !training, "%s (sp %d, %s): rank %d's heads %s rank 0's", family, sp,
                      training ? "training" : "eval", r, same[r] ? "drew the masks of" : "differ from");
        accel_step_reset();
    }
    accel_module_set_hook(accel_module_find(m, path), NULL);
    free(in.v);
    accel_tensor_free(ids);
    accel_module_free(m);
}

/* Sequence parallelism, one token id everywhere (no learned positions):
 * every rank's positions embed alike, and the embeddings' dropout gives
 * each rank's its own mask (eval: alike). */
static void sequence_shards_differ(accel_pg *pg, const char *family) {
    accel_module *m = parallel(dropout_model(family, 0.0, 0.3), pg, true);
    char path[64];
    snprintf(path, sizeof path, "%s.0", layer_prefix(family));
    capture in = {.input = true};
    capture_on(m, path, &in);
    accel_tensor *ids = ids_of(true);
    bool same[MAX_WORLD];
    for (int training = 0; training < 2; training++) {
        accel_module_train(m, training);
        loss_of(m, ids, false);
        CHECK(in.n == (int64_t)B * T / accel_pg_size(pg) * accel_llama_config_of(m)->hidden_size);
        same_as_rank0(pg, &in, same);
        for (int r = 1; r < accel_pg_size(pg); r++)
            CHECK_MSG(same[r] == !training, "%s (%s): rank %d's positions' embeddings %s rank 0's", family,
                      training ? "training" : "eval", r, same[r] ? "drew the dropout mask of" : "differ from");
        accel_step_reset();
    }
    accel_module_set_hook(accel_module_find(m, path), NULL);
    free(in.v);
    accel_tensor_free(ids);
    accel_module_free(m);
}

/* p = 0 while training, and p > 0 in eval: the same loss bit for bit as
 * p = 0 in eval, and neither generator moved. */
static void no_dropout_draws_nothing(accel_pg *pg, const char *family, bool sp) {
    accel_module *zero = parallel(dropout_model(family, 0.0, 0.0), pg, sp);
    accel_module *on = parallel(dropout_model(family, 0.3, 0.3), pg, sp);
    accel_tensor *ids = ids_of(false);
    accel_module_train(zero, false);
    double want = loss_of(zero, ids, false);
    accel_step_reset();
    accel_module_train(zero, true);
    accel_module_train(on, false);
    accel_module *runs[2] = {zero, on};
    for (int k = 0; k < 2; k++) {
        offsets before = offsets_of(runs[k]);
        double got = loss_of(runs[k], ids, true);
        offsets after = offsets_of(runs[k]);
        CHECK_MSG(got == want, "%s (sp %d, %s): loss %.17g, without dropout %.17g", family, sp,
                  k ? "eval" : "p 0", got, want);
        CHECK_MSG(after.dflt == before.dflt && after.tp == before.tp, "%s (sp %d, %s): a generator moved", family, sp,
                  k ? "eval" : "p 0");
        accel_step_reset();
    }
    accel_tensor_free(ids);
    accel_module_free(zero), accel_module_free(on);
}

/* Every gradient of a equal to b's bit for bit. */
static void grads_equal(accel_module *a, accel_module *b, const char *what) {
    accel_state_dict *sd = accel_module_state_dict(a);
    for (int i = 0; sd && i < sd->n; i++) {
        const accel_tensor *ga = sd->entries[i].t->grad, *gb = accel_module_get_tensor(b, sd->entries[i].name)->grad;
        if (!ga || !gb) continue;
        float *x = floats_of(ga), *y = floats_of(gb);
        CHECK_MSG(!memcmp(x, y, (size_t)accel_numel(ga) * sizeof *x), "%s: %s's gradient differs when checkpointed",
                  what, sd->entries[i].name);
        free(x), free(y);
    }
    accel_state_dict_free(sd);
}

/* The layers checkpointed: the recompute draws the forward's masks (both
 * generators replayed), so the gradients are the uncheckpointed ones. */
static void recompute_replays_masks(accel_pg *pg, const char *family, bool sp) {
    accel_module *plain = parallel(dropout_model(family, 0.3, 0.3), pg, sp);
    accel_module *ckpt = parallel(dropout_model(family, 0.3, 0.3), pg, sp);
    CHECK(accel_module_set_gradient_checkpointing(ckpt, true) == ACCEL_OK);
    accel_tensor *ids = ids_of(false);
    accel_manual_seed(77);
    double want = loss_of(plain, ids, true);
    accel_manual_seed(77);
    double got = loss_of(ckpt, ids, true);
    CHECK_MSG(got == want, "%s (sp %d): checkpointed loss %.17g, plain %.17g", family, sp, got, want);
    if (sp) { /* the norms' partial gradients, summed alike in both */
        CHECK(accel_module_tp_reduce_grads(plain, pg) == ACCEL_OK);
        CHECK(accel_module_tp_reduce_grads(ckpt, pg) == ACCEL_OK);
    }
    char what[48];
    snprintf(what, sizeof what, "%s (sp %d)", family, sp);
    grads_equal(ckpt, plain, what);
    accel_step_reset();
    accel_tensor_free(ids);
    accel_module_free(plain), accel_module_free(ckpt);
}

/* Context parallelism: its ranks' generators are seeded alike, so the
 * embeddings' and branches' dropout while training is refused by name, by
 * the step and by its activation estimate (the attention's is refused when
 * the model is sharded: test_cp_llama); in eval the same model runs. */
static void context_parallel_refused(accel_pg *pg, const char *family) {
    accel_module *m = dropout_model(family, 0.0, 0.3);
    CHECK(accel_llama_context_parallelize(m, pg, ACCEL_CP_ALLGATHER) == ACCEL_OK);
    accel_tensor *ids = ids_of(false);
    char words[160];
    snprintf(words, sizeof words, "the embeddings' and branches' dropout while training (resid_pdrop 0.3, "
             "embd_pdrop %g) is not implemented under context parallelism", accel_llama_config_of(m)->embd_pdrop);
    CHECK(!accel_llama_loss(m, ids));
    CHECK_STR_CONTAINS(accel_last_error(), words);
    accel_clear_error();
    /* the training step's estimate refuses it in the same words */
    accel_activation_opts o = {.batch_size = B, .seq_len = T, .autocast = ACCEL_F32, .cp_size = accel_pg_size(pg)};
    accel_activation_bytes ab;
    CHECK(accel_llama_activation_bytes(accel_llama_config_of(m), &o, &ab) == ACCEL_ERR_UNSUPPORTED);
    CHECK_STR_CONTAINS(accel_last_error(), words);
    accel_clear_error();
    accel_step_reset();
    accel_module_train(m, false);
    double eval = loss_of(m, ids, false);
    CHECK_MSG(isfinite(eval), "%s: eval under cp: %s", family, accel_last_error());
    accel_step_reset();
    accel_tensor_free(ids);
    accel_module_free(m);
}

static int body(int rank, int world) {
    (void)world;
    if (accel_dist_init() != ACCEL_OK) {
        fprintf(stderr, "rank %d: %s\n", rank, accel_last_error());
        return 1;
    }
    accel_pg *pg = accel_dist_default_group();
    const char *families[] = {"gpt2", "phi", "gpt_neox"};
    for (int sp = 0; sp < 2; sp++) {
        for (int f = 0; f < 3; f++) streams(pg, families[f], sp);
        for (int f = 0; f < 3; f++) no_dropout_draws_nothing(pg, families[f], sp);
        for (int f = 0; f < 2; f++) heads_masks_differ(pg, families[f], sp);
        recompute_replays_masks(pg, "gpt2", sp);
        recompute_replays_masks(pg, "phi", sp);
    }
    for (int f = 0; f < 3; f++) replicas_as_one_process(pg, families[f]);
    sequence_shards_differ(pg, "phi");
    sequence_shards_differ(pg, "gpt_neox");
    context_parallel_refused(pg, "phi");
    context_parallel_refused(pg, "gpt_neox");
    context_parallel_refused(pg, "stablelm");
    context_parallel_refused(pg, "starcoder2");
    accel_dist_finalize();
    return check_summary();
}

/* ---- under the accelerator: the checkpoint's streams, set_seed */

enum { SEQS = 10, SAVED_AT = 3, AFTER = 2 };
static struct {
    bool resume;
    char dir[64];
} RUN;

/* tp 2, GPT-2 with its dropouts: 3 steps, save_state, 2 steps (their losses
 * kept); resumed from other weights, the 2 steps' losses bit for bit. */
static int resume_body(int rank, int world) {
    (void)world;
    accel_accelerator_opts o = accel_accelerator_opts_default();
    o.mixed_precision = "no";
    o.parallelism = (accel_parallelism_opts){.tp_size = 2};
    accel_accelerator *acc = accel_accelerator_new(&o);
    if (!acc) {
        fprintf(stderr, "rank %d: %s\n", rank, accel_last_error());
        return 1;
    }
    int64_t idv[SEQS * T];
    for (int i = 0; i < SEQS * T; i++) idv[i] = (i * 7 + i / T * 5 + 3) % 40;
    accel_tensor *all = pi64(ACCEL_SHAPE(SEQS, T), idv);
    accel_dataset *ds = accel_tensor_dataset_new(1, &all);
    accel_dataloader_opts dlo = accel_dataloader_opts_default();
    dlo.batch_size = 2;
    accel_dataloader *dl = accel_dataloader_new(ds, &dlo);
    /* resumed from other weights (and another seed): the checkpoint must replace them */
    accel_module *m = seeded_model(RUN.resume ? 99 : 11, "gpt2", 0.3, 0.3);
    accel_optim_hparams h = {.lr = 0.01};
    CHECK(accel_accelerator_prepare_dataloader(acc, dl) == ACCEL_OK);
    CHECK_MSG(accel_accelerator_prepare_model(acc, m) == ACCEL_OK, "%s", accel_last_error());
    accel_optimizer *opt = accel_optimizer_new_module(ACCEL_OPTIM_SGD, m, &h);
    CHECK(accel_accelerator_prepare_optimizer(acc, opt) == ACCEL_OK);
    char ckpt[96], losses[96];
    snprintf(ckpt, sizeof ckpt, "%s/ckpt", RUN.dir);
    snprintf(losses, sizeof losses, "%s/losses_%d", RUN.dir, rank);
    if (RUN.resume) {
        accel_resume_point at;
        CHECK_MSG(accel_accelerator_load_state(acc, ckpt, &at) == ACCEL_OK, "%s", accel_last_error());
    }
    double got[AFTER];
    for (int s = RUN.resume ? SAVED_AT : 0; s < SAVED_AT + AFTER; s++) {
        if (!RUN.resume && s == SAVED_AT)
            CHECK_MSG(accel_accelerator_save_state(acc, ckpt, NULL, 0) == ACCEL_OK, "%s", accel_last_error());
        accel_batch b;
        CHECK(accel_dataloader_next(dl, &b));
        accel_tensor *loss = accel_llama_loss(m, b.fields[0]);
        CHECK_MSG(loss && accel_accelerator_backward(acc, loss) == ACCEL_OK, "%s", accel_last_error());
        if (s >= SAVED_AT) got[s - SAVED_AT] = loss ? accel_item(loss) : NAN;
        CHECK(accel_accelerator_optimizer_step(acc, opt) == ACCEL_OK);
        CHECK(accel_accelerator_zero_grad(acc, opt) == ACCEL_OK);
        accel_step_reset();
    }
    FILE *f = fopen(losses, RUN.resume ? "rb" : "wb");
    double want[AFTER];
    if (RUN.resume) {
        CHECK(f && fread(want, sizeof want, 1, f) == 1);
        for (int s = 0; s < AFTER; s++)
            CHECK_MSG(got[s] == want[s], "rank %d step %d: resumed loss %.17g, uninterrupted %.17g", rank, s, got[s],
                      want[s]);
    } else {
        CHECK(f && fwrite(got, sizeof got, 1, f) == 1);
    }
    if (f) fclose(f);
    accel_accelerator_free(acc);
    accel_optimizer_free(opt);
    accel_module_free(m);
    accel_dataloader_free(dl), accel_dataset_free(ds), accel_tensor_free(all);
    return check_summary();
}

/* A dp_shard 2 x tp 2 checkpoint (after a step: the streams moved) loaded
 * on tp 4 (MESH.tp): ranks 0 and 1 keep their tp rank and resume their
 * streams; ranks 2 and 3, tp rank 0 and 1 in the file, now 2 and 3, start
 * their own afresh (another rank's would repeat its masks). */
static struct {
    int tp;
} MESH;

static int mesh_body(int rank, int world) {
    (void)world;
    accel_accelerator_opts o = accel_accelerator_opts_default();
    o.parallelism = (accel_parallelism_opts){.tp_size = MESH.tp, .dp_shard_size = 4 / MESH.tp};
    accel_accelerator *acc = accel_accelerator_new(&o);
    if (!acc) {
        fprintf(stderr, "rank %d: %s\n", rank, accel_last_error());
        return 1;
    }
    /* loaded into a model of another seed: the job's seed comes from the checkpoint */
    uint64_t seed = MESH.tp == 2 ? 11 : 99;
    accel_module *m = seeded_model(seed, "gpt2", 0.3, 0.3);
    CHECK_MSG(accel_accelerator_prepare_model(acc, m) == ACCEL_OK, "%s", accel_last_error());
    accel_rng *tp = accel__tp_dropout_rng(m);
    CHECK(tp && tp->seed == seed + 2718 + (uint64_t)(rank % MESH.tp) && tp->offset == 0);
    char ckpt[96];
    snprintf(ckpt, sizeof ckpt, "%s/mesh", RUN.dir);
    if (MESH.tp == 2) {
        /* device-specific seeds: the two tp groups' default generators differ (11 and 12) */
        accel_set_seed(acc, 11, true);
        accel_tensor *ids = ids_of(false);
        CHECK(accel_accelerator_backward(acc, accel_llama_loss(m, ids)) == ACCEL_OK);
        accel_step_reset();
        accel_tensor_free(ids);
        CHECK(tp && tp->offset > 0);
        CHECK_MSG(accel_accelerator_save_state(acc, ckpt, NULL, 0) == ACCEL_OK, "%s", accel_last_error());
    } else {
        CHECK_MSG(accel_accelerator_load_state(acc, ckpt, NULL) == ACCEL_OK, "%s", accel_last_error());
        CHECK_MSG(tp && tp->seed == 11 + 2718 + (uint64_t)rank && (tp->offset > 0) == (rank < 2),
                  "rank %d: stream (%llu, %llu) after the load", rank, tp ? (unsigned long long)tp->seed : 0,
                  tp ? (unsigned long long)tp->offset : 0);
        /* the one tp group's default generator is its first rank's (the files of ranks 2 and 3 hold 12's) */
        accel_rng *r = accel_default_rng();
        int64_t lo[2] = {(int64_t)r->seed, (int64_t)r->offset}, hi[2] = {lo[0], lo[1]};
        accel_pg *g = accel_accelerator_tp_group(acc);
        CHECK(g && accel_pg_all_reduce(g, lo, 2, ACCEL_I64, ACCEL_REDUCE_MIN) == ACCEL_OK &&
              accel_pg_all_reduce(g, hi, 2, ACCEL_I64, ACCEL_REDUCE_MAX) == ACCEL_OK);
        CHECK_MSG(r->seed == 11 && lo[0] == hi[0] && lo[1] == hi[1] && lo[1] > 0,
                  "rank %d: default generator (%llu, %llu) after the load; over the group seeds %lld..%lld, offsets "
                  "%lld..%lld", rank, (unsigned long long)r->seed, (unsigned long long)r->offset, (long long)lo[0],
                  (long long)hi[0], (long long)lo[1], (long long)hi[1]);
    }
    accel_accelerator_free(acc);
    accel_module_free(m);
    return check_summary();
}

/* pp 2, a family's model: dropout while training refused by name (a stage
 * recomputes its forward in the backward without replaying the
 * generators); in eval the same model's step runs. Returns the model,
 * which the accelerator holds until it is freed. */
static accel_module *pipeline_refuses(accel_accelerator *acc, const char *family) {
    accel_module *m = dropout_model(family, 0.3, 0.3);
    CHECK_MSG(accel_accelerator_prepare_model(acc, m) == ACCEL_OK, "%s: %s", family, accel_last_error());
    accel_tensor *ids = ids_of(false);
    double loss;
    char words[160];
    snprintf(words, sizeof words, "dropout while training (attn_pdrop 0.3, resid_pdrop 0.3, embd_pdrop %g) is not "
             "built with pipeline parallelism", accel_llama_config_of(m)->embd_pdrop);
    CHECK(accel_accelerator_pipeline_step(acc, m, ids, &loss, NULL) == ACCEL_ERR_UNSUPPORTED);
    CHECK_STR_CONTAINS(accel_last_error(), words);
    accel_clear_error();
    accel_module_train(m, false);
    CHECK_MSG(accel_accelerator_pipeline_step(acc, m, ids, &loss, NULL) == ACCEL_OK, "%s: %s", family,
              accel_last_error());
    accel_step_reset();
    accel_tensor_free(ids);
    return m;
}

static int pipeline_body(int rank, int world) {
    (void)world;
    accel_accelerator_opts o = accel_accelerator_opts_default();
    o.parallelism.pp_size = 2;
    o.parallelism.num_micro_batches = 2;
    accel_accelerator *acc = accel_accelerator_new(&o);
    if (!acc) {
        fprintf(stderr, "rank %d: %s\n", rank, accel_last_error());
        return 1;
    }
    static const char *const FAMILIES[] = {"gpt_neox", "stablelm", "starcoder2"};
    accel_module *m[3];
    for (int f = 0; f < 3; f++) m[f] = pipeline_refuses(acc, FAMILIES[f]);
    accel_accelerator_free(acc);
    for (int f = 0; f < 3; f++) accel_module_free(m[f]);
    return check_summary();
}

/* dp_shard 2 x tp 2: a device-specific seed per tp group, not per rank. */
static int seed_body(int rank, int world) {
    (void)world;
    accel_accelerator_opts o = accel_accelerator_opts_default();
    o.parallelism = (accel_parallelism_opts){.tp_size = 2, .dp_shard_size = 2};
    accel_accelerator *acc = accel_accelerator_new(&o);
    if (!acc) {
        fprintf(stderr, "rank %d: %s\n", rank, accel_last_error());
        return 1;
    }
    accel_set_seed(acc, 5, true);
    CHECK_MSG(accel_default_rng()->seed == 5 + (uint64_t)rank / 2, "rank %d: seed %llu, want %d", rank,
              (unsigned long long)accel_default_rng()->seed, 5 + rank / 2);
    accel_accelerator_free(acc);
    return check_summary();
}

static void run_group(int world, dist_body_fn fn, const char *what) {
    dist_group g = {.world = world, .one_machine = true, .timeout = "60", .kill_after_s = 240};
    CHECK(dist_group_runs_ok(&g, fn, "%s", what));
}

int main(void) {
    run_group(2, body, "tp 2");
    run_group(4, body, "tp 4");
    snprintf(RUN.dir, sizeof RUN.dir, "/tmp/accel_tpdrop_XXXXXX");
    CHECK(mkdtemp(RUN.dir) != NULL);
    run_group(2, resume_body, "save at tp 2");
    RUN.resume = true;
    run_group(2, resume_body, "resume at tp 2");
    MESH.tp = 2;
    run_group(4, mesh_body, "save at dp_shard 2 x tp 2");
    MESH.tp = 4;
    run_group(4, mesh_body, "load at tp 4");
    char rm[96];
    snprintf(rm, sizeof rm, "rm -rf %s", RUN.dir);
    CHECK(system(rm) == 0);
    run_group(4, seed_body, "set_seed at dp_shard 2 x tp 2");
    run_group(2, pipeline_body, "pp 2");
    return check_summary();
}
