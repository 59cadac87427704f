/* The decoder families under tensor parallelism (accel_llama_parallelize)
 * on 2 and 4 forked processes: five SGD steps of the tiny model (4 heads, 2
 * key/value heads: split over 2 ranks, replicated over 4; tied embeddings)
 * with the loss and every gradient of each step within 1e-5 of the same
 * model on one process, for Llama, Gemma2 (windows, soft-capping) and
 * Granite (multipliers), Qwen3 (per-head q/k norms, whole on every rank),
 * each also under Megatron's sequence parallelism
 * (the norms on T / tp positions, their gradients summed by
 * accel_module_tp_reduce_grads); Llama under bf16 autocast, close to one
 * process within bf16's rounding; and the refusals. */
#include "check.h"
#include "dist_group.h"
#include "tiny_llama.h"
#include "tp_fixture.h"

enum { B = 2, T = 8, STEPS = 5 };

static void family_matches(accel_pg *pg, const char *family, bool sp) {
    accel_module *ref = tiny_family(11, family), *tp = tiny_family(11, family);
    accel_status st = accel_llama_parallelize(tp, pg, sp);
    CHECK_MSG(st == ACCEL_OK, "%s: %s", family, accel_last_error());
    if (st != ACCEL_OK) goto out;
    int world = accel_pg_size(pg);
    CHECK(accel_module_get_tensor(tp, "model.layers.0.self_attn.q_proj.weight")->shape[0] == 4 * 4 / world);
    CHECK(accel_module_get_tensor(tp, "model.layers.0.self_attn.k_proj.weight")->shape[0] == (world > 2 ? 8 : 4));
    CHECK(accel_module_get_tensor(tp, "model.layers.1.mlp.down_proj.weight")->shape[1] == 24 / world);
    CHECK(accel_module_get_tensor(tp, "lm_head.weight") == accel_module_get_tensor(tp, "model.embed_tokens.weight"));
    accel_optim_hparams h = {.lr = 0.05, .momentum = 0.9};
    accel_optimizer *o_ref = accel_optimizer_new_module(ACCEL_OPTIM_SGD, ref, &h);
    accel_optimizer *o_tp = accel_optimizer_new_module(ACCEL_OPTIM_SGD, tp, &h);
    for (int s = 0; s < STEPS; s++) {
        int64_t idv[B * T];
        for (int i = 0; i < B * T; i++) idv[i] = (i * 7 + s * 13 + 1) % 40;
        accel_tensor *ids = pi64(ACCEL_SHAPE(B, T), idv);
        accel_tensor *lr = accel_llama_loss(ref, ids);
        CHECK(lr && accel_backward(lr) == ACCEL_OK);
        double want = lr ? accel_item(lr) : NAN;
        accel_step_reset();
        accel_tensor *lt = accel_llama_loss(tp, ids);
        CHECK_MSG(lt && accel_backward(lt) == ACCEL_OK, "%s: %s", family, accel_last_error());
        if (sp) CHECK(accel_module_tp_reduce_grads(tp, pg) == ACCEL_OK); /* the norms' partial gradients */
        if (lt) CHECK_MSG(fabs(accel_item(lt) - want) <= 1e-5 * fmax(1, fabs(want)), "%s%s step %d: loss %.9g, want %.9g",
                          family, sp ? " (sp)" : "", s, accel_item(lt), want);
        grads_match(tp, ref);
        accel_step_reset();
        CHECK(accel_optimizer_step(o_ref) == ACCEL_OK && accel_optimizer_step(o_tp) == ACCEL_OK);
        CHECK(accel_optimizer_zero_grad(o_ref) == ACCEL_OK && accel_optimizer_zero_grad(o_tp) == ACCEL_OK);
        accel_tensor_free(ids);
    }
    /* the logits are this rank's vocabulary columns; no generation */
    int64_t one[T] = {1, 2, 3, 4, 5, 6, 7, 8};
    accel_tensor *ids = pi64(ACCEL_SHAPE(1, T), one);
    accel_tensor *logits = accel_llama_forward(tp, ids, NULL);
    CHECK(logits && logits->shape[2] == 40 / world);
    accel_kv_cache *kc = accel_kv_cache_new(accel_llama_config_of(tp), 1, 16, ACCEL_CPU_DEVICE);
    CHECK(accel_llama_forward(tp, ids, kc) == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "generation under tp is not built");
    accel_kv_cache_free(kc);
    accel_step_reset();
    accel_tensor_free(ids);
    accel_optimizer_free(o_ref), accel_optimizer_free(o_tp);
out:
    accel_module_free(ref), accel_module_free(tp);
}

/* The relative L2 distance between the parallel model's gradients (each
 * against its slice of the reference's), the worst tensor's. */
static double worst_grad_distance(accel_module *tp, accel_module *ref) {
    accel_state_dict *sd = accel_module_state_dict(tp);
    double worst = 0;
    for (int i = 0; sd && i < sd->n; i++) {
        accel_tensor *a = sd->entries[i].t->grad, *b = accel_module_get_tensor(ref, sd->entries[i].name)->grad;
        accel_tp_style style;
        int64_t start;
        if (accel_module_tp_info(sd->entries[i].owner, &style, NULL, &start, NULL) &&
            (style != ACCEL_TP_ROWWISE || a->ndim == 2)) {
            int dim = style == ACCEL_TP_ROWWISE;
            b = accel_slice(b, dim, start, start + a->shape[dim], 1);
        }
        float *x = floats_of(a), *y = floats_of(b);
        double num = 0, den = 0;
        for (int64_t k = 0; k < accel_numel(a); k++) num += (x[k] - y[k]) * (x[k] - y[k]), den += y[k] * y[k];
        worst = fmax(worst, sqrt(num / fmax(den, 1e-30)));
        free(x), free(y);
    }
    accel_state_dict_free(sd);
    return worst;
}

/* Under bf16 autocast the ranks' partial sums are rounded before they are
 * added: the losses of 5 SGD steps within 2e-3 of one process's (relative),
 * every gradient within 5e-2 (relative L2; measured: losses within 1e-4,
 * gradients 5e-3 to 1e-2, the rounding of bf16). */
static void bf16_close(accel_pg *pg, bool sp) {
    accel_module *ref = tiny_family(11, "llama"), *tp = tiny_family(11, "llama");
    CHECK(accel_llama_parallelize(tp, pg, sp) == ACCEL_OK);
    accel_optim_hparams h = {.lr = 0.05, .momentum = 0.9};
    accel_optimizer *o_ref = accel_optimizer_new_module(ACCEL_OPTIM_SGD, ref, &h);
    accel_optimizer *o_tp = accel_optimizer_new_module(ACCEL_OPTIM_SGD, tp, &h);
    for (int s = 0; s < STEPS; s++) {
        int64_t idv[B * T];
        for (int i = 0; i < B * T; i++) idv[i] = (i * 5 + s * 11 + 2) % 40;
        accel_tensor *ids = pi64(ACCEL_SHAPE(B, T), idv);
        accel_dtype prev = accel_autocast_begin(ACCEL_BF16);
        accel_tensor *lr = accel_llama_loss(ref, ids);
        CHECK(lr && accel_backward(lr) == ACCEL_OK);
        double want = lr ? accel_item(lr) : NAN;
        accel_step_reset();
        accel_tensor *lt = accel_llama_loss(tp, ids);
        CHECK_MSG(lt && accel_backward(lt) == ACCEL_OK, "%s", accel_last_error());
        accel_autocast_end(prev);
        if (sp) CHECK(accel_module_tp_reduce_grads(tp, pg) == ACCEL_OK);
        double got = lt ? accel_item(lt) : NAN, d = worst_grad_distance(tp, ref);
        CHECK_MSG(fabs(got - want) <= 2e-3 * fabs(want), "bf16%s step %d: loss %.6g, want %.6g", sp ? " sp" : "", s,
                  got, want);
        CHECK_MSG(d <= 5e-2, "bf16%s step %d: a gradient %.3g (relative L2) from one process's", sp ? " sp" : "", s, d);
        accel_step_reset();
        CHECK(accel_optimizer_step(o_ref) == ACCEL_OK && accel_optimizer_step(o_tp) == ACCEL_OK);
        CHECK(accel_optimizer_zero_grad(o_ref) == ACCEL_OK && accel_optimizer_zero_grad(o_tp) == ACCEL_OK);
        accel_tensor_free(ids);
    }
    accel_optimizer_free(o_ref), accel_optimizer_free(o_tp);
    accel_module_free(ref), accel_module_free(tp);
}

static void refusals(accel_pg *pg) {
    accel_module *m = tiny_family(1, "gpt2");
    CHECK(accel_llama_parallelize(m, pg, false) == ACCEL_ERR_UNSUPPORTED);
    CHECK_STR_CONTAINS(accel_last_error(), "gpt2 models (Conv1D projections) have no tensor-parallel plan yet");
    accel_module_free(m);
    if (accel_pg_size(pg) < 4) return;
    accel_manual_seed(1);
    accel_llama_config c = accel_llama_config_default();
    c.vocab_size = 40, c.hidden_size = 24, c.intermediate_size = 24, c.num_hidden_layers = 1;
    c.num_attention_heads = 6, c.num_key_value_heads = 6;
    m = accel_llama_new(&c, ACCEL_CPU_DEVICE);
    CHECK(accel_llama_parallelize(m, pg, false) == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "num_attention_heads is not a multiple of tp 4");
    CHECK(accel_module_get_tensor(m, "model.layers.0.self_attn.q_proj.weight")->shape[0] == 24); /* untouched */
    accel_module_free(m);
}

static int body(int rank, int world) {
    if (accel_dist_init() != ACCEL_OK) {
        fprintf(stderr, "rank %d: %s\n", rank, accel_last_error());
        return 1;
    }
    accel_pg *pg = accel_dist_default_group();
    const char *families[] = {"llama", "gemma2", "granite", "qwen3"};
    for (int f = 0; f < 4; f++) family_matches(pg, families[f], false);
    for (int f = 0; f < 4; f++) family_matches(pg, families[f], true);
    bf16_close(pg, false);
    bf16_close(pg, true);
    refusals(pg);
    accel_dist_finalize();
    return check_summary();
}

int main(void) {
    int worlds[] = {2, 4};
    for (int k = 0; k < 2; k++) {
        dist_group g = {.world = worlds[k], .one_machine = true, .timeout = "60", .kill_after_s = 240};
        int status[DIST_GROUP_MAX];
        dist_group_run(&g, body, status);
        for (int r = 0; r < g.world; r++)
            CHECK_MSG(dist_exited_ok(status[r]), "world %d: rank %d failed", g.world, r);
    }
    return check_summary();
}
