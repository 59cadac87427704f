/* The accelerator with opts.parallelism.tp_size > 1 on forked processes:
 * tp = 2 (2 processes), tp = 4 and dp_shard x tp = 2 x 2 (4 processes, with
 * gradient clipping that bites) train the tiny Llama five SGD steps from the
 * prepared data loader; each rank's loss and every gradient of every step
 * equal, within 1e-5, the same model on one process stepping on the global
 * batch (the data-parallel ranks' batches: every rank of a tp group gets
 * its data-parallel rank's). Under ZeRO-1/2/3 over dp_shard with tp 2 the
 * losses (and, stages 1 and 2, the updated parameters) match the same way,
 * stages 2 and 3 with clipping that bites (the norm from the gradient
 * shards); on the first step every mesh's accel_accelerator_clip_grad_norm
 * is the one-process norm. With Megatron's sequence parallelism (tp 4;
 * dp_shard 2 x tp 2 under DDP with clipping, ZeRO-1, ZeRO-2 and ZeRO-3 with
 * clipping)
 * the same holds. save_model writes the one-process weights from every
 * mesh (ZeRO-3 gathering over both its shard and tp groups), save_state
 * succeeds under each. A model with no plan of its own is refused until the
 * user parallelizes it over accel_accelerator_tp_group; an optimizer made
 * over the whole model and prepared with it is re-targeted to the slices.
 * GPT-2 (Conv1D columns, c_attn's q | k | v parts), Phi-3 (qkv_proj's
 * and gate_up_proj's parts), Phi and GPT-NeoX (query_key_value by heads,
 * its own names) at tp 2 under DDP with clipping that bites: the
 * same losses, weights and save_model, also when the user parallelized
 * them with accel_llama_parallelize before prepare. Mixtral and Qwen3-MoE
 * (experts' MLPs cut, routers whole) at tp 2 under DDP with clipping, with
 * sequence parallelism (Qwen3-MoE over dp_shard 2 x tp 2, Mixtral also
 * under ZeRO-3): the same losses, gradients and save_model. StableLM with
 * qk_layernorm (per-head q/k norms, each rank its heads') at tp 2 under DDP
 * and over dp_shard 2 x tp 2 under ZeRO-3 with sequence parallelism, both
 * with clipping, and with each per-head norm a ZeRO-3 unit of its own (its
 * weight read inside its hooks): the same. Starcoder2 (biases on the
 * row-parallel o_proj and c_proj, a window of 4) at tp 2 under DDP and over
 * dp_shard 2 x tp 2 under ZeRO-3 with sequence parallelism, both with
 * clipping: the same. Padded batches (the loader's fields ids,
 * attention_mask and position_ids; rows padded on the left or the right):
 * Llama at tp 2, and over dp_shard 2 x tp 2 and at tp 4 (its 2 key/value
 * heads replicated) with sequence parallelism, Starcoder2 and GPT-2 at tp 2
 * with it, Phi over dp_shard 2 x tp 2 under
 * ZeRO-3, all with clipping: the same losses, gradients and save_model.
 * Under DDP (every family but GPT-2 and the experts': Llama, Phi-3, Phi,
 * GPT-NeoX, StableLM, Starcoder2) each rank's parameter, gradient and
 * momentum bytes are the plan's 1/tp arithmetic (estimate-memory's
 * per-mesh count; the tiny Llama's by hand). */
#include <stdlib.h>
#include <string.h>

#include "accel/accelerator.h"
#include "bigmodel/mesh_memory.h"
#include "check.h"
#include "dist_group.h"
#include "tiny_llama.h"
#include "tp_fixture.h"

enum { SEQS = 24, T = 8, BS = 2, STEPS = 5 };

/* user: the test parallelizes the model itself (accel_llama_parallelize over
 * accel_accelerator_tp_group) before prepare, which keeps that plan; qk: the
 * family's qk_layernorm on (StableLM's per-head q/k norms); padded: the
 * batches carry an attention_mask and position_ids (padded_rows) */
static struct {
    int tp, dp_shard, zero_stage;
    double clip;
    bool sp, user, qk, padded;
    const char *family, *wrap; /* wrap: ZeRO-3's wrap classes (TRANSFORMER_BASED_WRAP), NULL: the default */
    char dir[64];
} CFG;

/* The tiny model of CFG's family, seeded (qk_layernorm on with CFG.qk, as
 * the family has it otherwise: Phi's on). */
static accel_module *cfg_model(uint64_t seed) { return tiny_family_qk(seed, CFG.family, CFG.qk); }

/* ACCEL_TP_KEEP=1: each run's save_model folder is kept (its path printed)
 * with accel_logits.safetensors beside the weights: ids [BS, T] and the tp
 * model's logits for them [BS, T, V], the ranks' vocabulary columns gathered
 * over the tp group, for tools/check_zero3_hf_logits.py to compare with
 * transformers' logits of the saved folder. */
static void keep_logits(accel_accelerator *acc, accel_module *tp, accel_tensor *ids, int rank) {
    bool prev = accel_set_grad_enabled(false);
    accel_tensor *local = accel_contiguous(accel_llama_forward(tp, ids, NULL)); /* [BS, T, V / tp] */
    accel_set_grad_enabled(prev);
    CHECK_MSG(local != NULL, "%s", accel_last_error());
    if (!local) return;
    int64_t n = accel_numel(local), v = local->shape[2], rows = n / v;
    float *all = malloc((size_t)(n * CFG.tp) * sizeof *all);
    CHECK(accel_pg_all_gather(accel_accelerator_tp_group(acc), local->data, all, (size_t)n, ACCEL_F32) == ACCEL_OK);
    if (rank == 0) {
        accel_tensor *logits = accel_tensor_new(ACCEL_F32, 3, (int64_t[]){BS, T, v * CFG.tp}, ACCEL_CPU_DEVICE);
        float *out = logits->data;
        for (int64_t r = 0; r < rows; r++) /* rank p's columns of row r: [p v, (p + 1) v) */
            for (int p = 0; p < CFG.tp; p++) memcpy(out + (r * CFG.tp + p) * v, all + p * n + r * v, (size_t)v * sizeof *out);
        char path[128];
        snprintf(path, sizeof path, "%s/accel_logits.safetensors", CFG.dir);
        const char *names[] = {"ids", "logits"};
        accel_tensor *ts[] = {ids, logits};
        CHECK_MSG(accel_safetensors_save(path, 2, names, ts, 0, NULL) == ACCEL_OK, "%s", accel_last_error());
        printf("kept %s\n", CFG.dir);
        accel_tensor_free(logits);
    }
    free(all);
}

/* What a rank holds, counted from its tensors after a step: parameters (and
 * buffers), their gradients and SGD's momentum, against the plan's
 * arithmetic as `accel estimate-memory --tp_size` counts it
 * (src/bigmodel/mesh_memory.c) and, for the tiny Llama, by hand: 1/tp of
 * every split weight, the norms whole, over 4 ranks k_proj and v_proj whole
 * (2 key/value heads: replicated rows). */
static void rank_bytes_match(accel_module *tp, accel_module *ref, accel_optimizer *opt, const char *family) {
    accel_state_dict *sd = accel_module_state_dict(tp);
    int64_t params = 0, buffers = 0, grads = 0, state = 0;
    for (int i = 0; sd && i < sd->n; i++) {
        const accel_state_entry *e = &sd->entries[i];
        if (e->is_tied_alias) continue;
        *(e->is_buffer ? &buffers : &params) += (int64_t)accel_nbytes(e->t);
        if (!e->is_buffer && e->t->grad) grads += (int64_t)accel_nbytes(e->t->grad);
    }
    accel_state_dict_free(sd);
    accel_named_state *st;
    int n = accel_optimizer_state(opt, &st);
    for (int i = 0; i < n; i++) state += st[i].t ? (int64_t)accel_nbytes(st[i].t) : 0;
    accel_named_state_free(st, n);
    accel__mesh_bytes plan;
    CHECK_MSG(accel__mesh_param_bytes(ref, accel_llama_config_of(ref), CFG.tp, 1, &plan) == ACCEL_OK, "%s",
              accel_last_error());
    CHECK_MSG(params + buffers == plan.param_bytes && grads == params && state == params,
              "%s tp %d: a rank holds %lld bytes of parameters (+ %lld of buffers), %lld of gradients, %lld of "
              "momentum; the plan %lld", family, CFG.tp, (long long)params, (long long)buffers, (long long)grads,
              (long long)state, (long long)plan.param_bytes);
    if (strcmp(family, "llama")) return;
    /* q, k and v, o, gate and up, down, the two norms; the tied vocabulary; the final norm */
    int h = 4 / CFG.tp, kv = CFG.tp > 2 ? 2 : 2 / CFG.tp, f = 24 / CFG.tp;
    int64_t layer = (h * 4 * 16 + 2 * kv * 4 * 16 + 16 * h * 4 + 2 * f * 16 + 16 * f + 2 * 16) * 4;
    CHECK_MSG(params == 2 * layer + 40 / CFG.tp * 16 * 4 + 16 * 4, "llama tp %d: %lld bytes of parameters, by hand "
              "%lld", CFG.tp, (long long)params, (long long)(2 * layer + 40 / CFG.tp * 16 * 4 + 16 * 4));
}

static void sequences(int64_t *ids) {
    for (int i = 0; i < SEQS * T; i++) ids[i] = (i * 7 + i / T * 5 + 3) % 40;
}

/* Sequence i's attention_mask keeps T - i % 3 positions, its pads on the
 * left (i / 3 even) or on the right, and its position ids count the kept
 * positions from 0 (the pads' 0), as accel_generate_batch derives them. */
static void padded_rows(int64_t *mask, int64_t *pos) {
    for (int i = 0; i < SEQS; i++) {
        int pads = i % 3, first = i / 3 % 2 ? 0 : pads; /* the kept run [first, first + T - pads) */
        for (int t = 0; t < T; t++) {
            bool kept = t >= first && t < first + T - pads;
            mask[i * T + t] = kept, pos[i * T + t] = kept ? t - first : 0;
        }
    }
}

/* rows [first, first + BS) of a [SEQS, T] array */
static accel_tensor *rows(const int64_t *v, int64_t first) {
    return accel_from_data(ACCEL_I64, ACCEL_SHAPE(BS, T), v + first * T);
}

/* The loss of a batch: fields ids, and with CFG.padded its mask and position ids. */
static accel_tensor *batch_loss(accel_module *m, accel_tensor *const *fields) {
    accel_llama_inputs in = {.ids = fields[0]};
    if (CFG.padded) in.attention_mask = fields[1], in.position_ids = fields[2];
    return accel_llama_loss_ex(m, &in);
}

static void refuses_plainless(accel_accelerator *acc) {
    accel_module *l[2] = {accel_linear_new(4, 8, true, ACCEL_CPU_DEVICE, ACCEL_F32),
                          accel_linear_new(8, 4, true, ACCEL_CPU_DEVICE, ACCEL_F32)};
    accel_module *m = accel_sequential_new(2, l);
    CHECK(accel_accelerator_prepare_model(acc, m) == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "has no tensor-parallel plan of its own");
    accel_tp_plan_entry plan[] = {{"0", ACCEL_TP_COLWISE, false}, {"1", ACCEL_TP_ROWWISE, false}};
    CHECK(accel_module_parallelize(m, plan, 2, accel_accelerator_tp_group(acc)) == ACCEL_OK);
    CHECK_MSG(accel_accelerator_prepare_model(acc, m) == ACCEL_OK, "%s", accel_last_error());
    CHECK(accel_accelerator_unprepare_model(acc, m) == ACCEL_OK);
    accel_module_free(m);
}

/* prepare(model, opt) with the optimizer made over the whole model (as
 * Accelerate users write it): the plan freed the whole parameters, the
 * optimizer now steps the slices. */
static void retargets_optimizer(accel_accelerator *acc) {
    accel_module *m = tiny_llama(11);
    accel_optimizer *opt = accel_optimizer_new_module(ACCEL_OPTIM_SGD, m, &(accel_optim_hparams){.lr = 0.05});
    CHECK_MSG(accel_accelerator_prepare(acc, m, opt) == ACCEL_OK, "%s", accel_last_error());
    accel_tensor **ps;
    int n = accel_module_parameters(m, &ps);
    CHECK(accel_optimizer_num_segments(opt) == n);
    for (int i = 0; i < n && i < accel_optimizer_num_segments(opt); i++)
        CHECK_MSG(accel_optimizer_segment_param(opt, i, NULL) == ps[i], "segment %d is not the prepared model's "
                  "parameter %d", i, i);
    accel_free(ps);
    accel_optimizer_free(opt);
    CHECK(accel_accelerator_unprepare_model(acc, m) == ACCEL_OK);
    accel_module_free(m);
}

static int body(int rank, int world) {
    accel_accelerator_opts o = accel_accelerator_opts_default();
    o.mixed_precision = "no";
    o.zero_stage = CFG.zero_stage;
    o.gradient_clipping = CFG.clip;
    o.parallelism = (accel_parallelism_opts){.tp_size = CFG.tp, .dp_shard_size = CFG.dp_shard,
                                             .sequence_parallelism = CFG.sp ? ACCEL_TRUE : 0};
    if (CFG.wrap) o.fsdp_auto_wrap_policy = "TRANSFORMER_BASED_WRAP", o.fsdp_transformer_layer_cls_to_wrap = CFG.wrap;
    accel_accelerator *acc = accel_accelerator_new(&o);
    if (!acc) {
        fprintf(stderr, "rank %d: %s\n", rank, accel_last_error());
        return 1;
    }
    int dp = world / CFG.tp, dp_rank = rank / CFG.tp;
    int64_t ids[SEQS * T], mask[SEQS * T], pos[SEQS * T];
    sequences(ids), padded_rows(mask, pos);
    const int64_t *host[3] = {ids, mask, pos};
    accel_tensor *all[3];
    for (int k = 0; k < 3; k++) {
        all[k] = accel_tensor_new(ACCEL_I64, 2, (int64_t[]){SEQS, T}, ACCEL_CPU_DEVICE);
        accel_tensor_from_host(all[k], host[k]);
    }
    accel_dataset *ds = accel_tensor_dataset_new(CFG.padded ? 3 : 1, all);
    accel_dataloader_opts dlo = accel_dataloader_opts_default();
    dlo.batch_size = BS;
    accel_dataloader *dl = accel_dataloader_new(ds, &dlo);
    accel_module *ref = cfg_model(11), *tp = cfg_model(11);
    CHECK_MSG(accel_accelerator_prepare_dataloader(acc, dl) == ACCEL_OK, "%s", accel_last_error());
    if (CFG.user)
        CHECK_MSG(accel_llama_parallelize(tp, accel_accelerator_tp_group(acc), CFG.sp) == ACCEL_OK, "%s",
                  accel_last_error());
    accel_status st = accel_accelerator_prepare_model(acc, tp);
    CHECK_MSG(st == ACCEL_OK, "rank %d: %s", rank, accel_last_error());
    if (st != ACCEL_OK) goto out;
    /* the plan cut the MLP's input projection (GPT-2's Conv1D [in, out]: its columns) */
    bool gpt2 = !strcmp(CFG.family, "gpt2"), phi3 = !strcmp(CFG.family, "phi3");
    bool mixtral = !strcmp(CFG.family, "mixtral"), qwen_moe = !strcmp(CFG.family, "qwen3_moe");
    accel_tensor *up = accel_module_get_tensor(tp, gpt2       ? "transformer.h.0.mlp.c_fc.weight"
                                                   : phi3     ? "model.layers.0.mlp.gate_up_proj.weight"
                                                   : !strcmp(CFG.family, "phi") ? "model.layers.0.mlp.fc1.weight"
                                                   : !strcmp(CFG.family, "gpt_neox") ? "gpt_neox.layers.0.mlp.dense_h_to_4h.weight"
                                                   : !strcmp(CFG.family, "starcoder2") ? "model.layers.0.mlp.c_fc.weight"
                                                   : mixtral  ? "model.layers.0.block_sparse_moe.experts.5.w3.weight"
                                                   : qwen_moe ? "model.layers.0.mlp.experts.9.up_proj.weight"
                                                              : "model.layers.0.mlp.up_proj.weight");
    CHECK(up && up->shape[gpt2] == (phi3 ? 48 : qwen_moe ? 12 : 24) / CFG.tp);
    accel_optim_hparams h = {.lr = 0.05, .momentum = 0.9};
    /* after prepare: the plan replaced the parameters with their slices */
    accel_optimizer *o_tp = accel_optimizer_new_module(ACCEL_OPTIM_SGD, tp, &h);
    accel_optimizer *o_ref = accel_optimizer_new_module(ACCEL_OPTIM_SGD, ref, &h);
    CHECK(accel_accelerator_prepare_optimizer(acc, o_tp) == ACCEL_OK);
    accel_tensor **ps;
    int n_ref = accel_module_parameters(ref, &ps);
    for (int s = 0; s < STEPS; s++) {
        accel_batch b;
        CHECK(accel_dataloader_next(dl, &b));
        accel_tensor *loss = batch_loss(tp, b.fields);
        CHECK_MSG(loss && accel_accelerator_backward(acc, loss) == ACCEL_OK, "%s", accel_last_error());
        double mine = loss ? accel_item(loss) : NAN, want = NAN;
        /* the global batch: data-parallel rank r's is batch s dp + r */
        accel_tensor *total = NULL;
        for (int r = 0; r < dp; r++) {
            int64_t first = (int64_t)(s * dp + r) * BS;
            accel_tensor *l = batch_loss(ref, (accel_tensor *[]){rows(ids, first), rows(mask, first), rows(pos, first)});
            if (r == dp_rank) want = accel_item(l);
            total = total ? accel_add(total, l) : l;
        }
        CHECK(accel_backward(accel_mul_scalar(total, 1.0 / dp)) == ACCEL_OK);
        CHECK_MSG(fabs(mine - want) <= 1e-5 * fmax(1, fabs(want)), "rank %d step %d: loss %.9g, want %.9g", rank, s,
                  mine, want);
        if (s == 0) { /* the global norm (a limit it does not reach: nothing clipped) */
            double got = accel_accelerator_clip_grad_norm(acc, tp, 1e30, 2.0);
            double norm = accel_clip_grad_norm(n_ref, ps, 1e30, 2.0);
            CHECK_MSG(fabs(got - norm) <= 1e-5 * norm, "rank %d: the gradient norm is %.9g, one process's %.9g (%s)",
                      rank, got, norm, isnan(got) ? accel_last_error() : "");
        }
        if (CFG.clip > 0) { /* the norm must be above the limit, so clipping is tested */
            double norm = accel_clip_grad_norm(n_ref, ps, CFG.clip, 2.0);
            CHECK_MSG(norm > 2 * CFG.clip, "the reference gradient norm %g does not exceed the clip %g", norm,
                      CFG.clip);
        }
        CHECK_MSG(accel_accelerator_optimizer_step(acc, o_tp) == ACCEL_OK, "%s", accel_last_error());
        CHECK(accel_optimizer_step(o_ref) == ACCEL_OK);
        /* ZeRO shards over dp_shard too (test_training_memory); GPT-2's Conv1D split is not in the plan's
         * count; the experts no token chose hold no gradient nor momentum (test_tp_llama counts their bytes) */
        if (s == STEPS - 1 && CFG.zero_stage == 0 && !gpt2 && !mixtral && !qwen_moe)
            rank_bytes_match(tp, ref, o_tp, CFG.family);
        /* after the steps: clipped; ZeRO keeps only the shard's gradient: the
         * parameters it updated from the whole one are compared instead
         * (ZeRO-3 holds them whole only inside a forward: there the next
         * step's loss is the check) */
        if (CFG.zero_stage < 3) tp_match(tp, ref, CFG.zero_stage == 0);
        CHECK(accel_accelerator_zero_grad(acc, o_tp) == ACCEL_OK && accel_optimizer_zero_grad(o_ref) == ACCEL_OK);
        accel_step_reset();
    }
    accel_free(ps);
    saves_whole(acc, tp, ref, CFG.dir);
    if (getenv("ACCEL_TP_KEEP")) keep_logits(acc, tp, rows(ids, 0), rank);
    if (CFG.dp_shard == 1) refuses_plainless(acc), retargets_optimizer(acc);
    accel_accelerator_free(acc);
    acc = NULL;
    accel_optimizer_free(o_tp), accel_optimizer_free(o_ref);
out:
    accel_accelerator_free(acc);
    accel_module_free(ref), accel_module_free(tp);
    accel_dataloader_free(dl), accel_dataset_free(ds);
    for (int k = 0; k < 3; k++) accel_tensor_free(all[k]);
    return check_summary();
}

static void run_family(const char *family, int world, int tp, int dp_shard, int zero_stage, double clip, bool sp) {
    CFG.family = family, CFG.tp = tp, CFG.dp_shard = dp_shard, CFG.zero_stage = zero_stage, CFG.clip = clip, CFG.sp = sp;
    snprintf(CFG.dir, sizeof CFG.dir, "/tmp/accel_tp_XXXXXX");
    CHECK(mkdtemp(CFG.dir) != NULL);
    dist_group g = {.world = world, .one_machine = true, .timeout = "60", .kill_after_s = 240};
    CHECK(dist_group_runs_ok(&g, body, "%s%s tp %d x dp_shard %d, zero %d%s%s", family,
                             CFG.user ? " (parallelized by the user)" : "", tp, dp_shard, zero_stage,
                             sp ? ", sequence parallel" : "", CFG.padded ? ", padded" : ""));
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", CFG.dir);
    CHECK(getenv("ACCEL_TP_KEEP") || system(cmd) == 0);
}

static void run(int world, int tp, int dp_shard, int zero_stage, double clip, bool sp) {
    run_family("llama", world, tp, dp_shard, zero_stage, clip, sp);
}

int main(void) {
    run_family("gpt2", 2, 2, 1, 0, 0.05, false);
    run_family("phi3", 2, 2, 1, 0, 0.05, false);
    run_family("phi", 2, 2, 1, 0, 0.05, false); /* fc1 / fc2, dense, lm_head's bias cut with the vocabulary */
    run_family("gpt_neox", 2, 2, 1, 0, 0.05, false); /* query_key_value by heads, its own names */
    /* experts: each one's features split, the router whole; under sp routing the gathered sequence */
    run_family("mixtral", 2, 2, 1, 0, 0.05, false);
    run_family("qwen3_moe", 2, 2, 1, 0, 0.05, false);
    run_family("mixtral", 2, 2, 1, 0, 0.05, true);
    run_family("qwen3_moe", 4, 2, 2, 0, 0.05, true);
    run_family("mixtral", 4, 2, 2, 3, 0.05, true);
    /* StableLM's per-head q/k norms: each rank its heads' own, their gradients summed in the graph (not again) */
    CFG.qk = true;
    run_family("stablelm", 2, 2, 1, 0, 0.05, false);
    run_family("stablelm", 4, 2, 2, 3, 0.05, true);
    /* each per-head norm a ZeRO-3 unit of its own: its weight read inside its hooks under tp too */
    CFG.wrap = "StableLmDecoderLayer,LayerNorm";
    run_family("stablelm", 4, 2, 2, 3, 0.05, false);
    CFG.wrap = NULL;
    CFG.qk = false;
    /* Starcoder2: o_proj's and c_proj's biases on row-parallel Linears (added once, after the ranks' sum) */
    run_family("starcoder2", 2, 2, 1, 0, 0.05, false);
    run_family("starcoder2", 4, 2, 2, 3, 0.05, true);
    /* padded batches (left and right, each sequence its position ids): the mask every rank's whole */
    CFG.padded = true;
    run_family("llama", 2, 2, 1, 0, 0.05, false);
    run_family("llama", 4, 2, 2, 0, 0.05, true);
    run_family("llama", 4, 4, 1, 0, 0.05, true); /* 2 key/value heads, each on 2 ranks */
    run_family("starcoder2", 2, 2, 1, 0, 0.05, true);
    run_family("phi", 4, 2, 2, 3, 0.05, false);
    run_family("gpt2", 2, 2, 1, 0, 0.05, true); /* learned positions: the position ids' own rows */
    CFG.padded = false;
    CFG.user = true;
    run_family("gpt2", 2, 2, 1, 0, 0.05, false);
    run_family("phi3", 2, 2, 1, 0, 0.05, false);
    CFG.user = false;
    run(2, 2, 1, 0, 0, false);
    run(4, 4, 1, 0, 0, false);
    run(4, 2, 2, 0, 0.05, false);
    run(4, 2, 2, 1, 0, false);
    run(4, 2, 2, 2, 0.05, false);
    run(4, 2, 2, 3, 0.05, false);
    run(4, 4, 1, 0, 0.05, true);
    run(4, 2, 2, 0, 0.05, true);
    run(4, 2, 2, 1, 0, true);
    run(4, 2, 2, 2, 0.05, true);
    run(4, 2, 2, 3, 0.05, true);
    return check_summary();
}
