/* Padded batches under tensor parallelism (accel_llama_parallelize) on 2
 * forked processes: the heads are split, the attention_mask is every rank's
 * whole. For Llama, Gemma2 (window of 4 under prompts of 8, soft-capping),
 * GPT-2 (learned positions from position_ids), Qwen3-MoE, Phi (its head's
 * bias cut with the vocabulary), GPT-NeoX (query_key_value by heads),
 * StableLM with qk_layernorm (per-head q/k norms), Starcoder2 (biases on the
 * row-parallel o_proj and c_proj, a window of 4), and Mixtral and
 * Qwen2-MoE with the routers' load-balancing loss (its means over the kept
 * tokens): the loss with a left-padded mask and every gradient within 1e-5
 * of one process, then accel_generate_batch's greedy tokens identical;
 * Llama, Phi and Starcoder2 also with a right-padded row and one padded on
 * both sides (loss and gradients); Llama (left) and Starcoder2 (right) also
 * with the tp model's layers checkpointed; all of it again under
 * sequence parallelism (each rank's T / tp positions between the tp regions:
 * the mask and position ids are the whole sequence's, as attention sees it);
 * packed rows (no_cache: position ids that restart, no mask) for Llama and
 * Starcoder2 (a window of 4 inside a sequence of 5), plain and checkpointed;
 * under context parallelism the mask is refused by name. */
#include "accel/cp.h"
#include "check.h"
#include "dist_group.h"
#include "tiny_llama.h"
#include "tp_fixture.h"

enum { B = 2, T = 8, NEW = 6 };

static const int64_t MASK[B * T] = {1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 1, 1, 1, 1, 1};
/* row 0 right-padded, row 1 padded on both sides (loss and gradients only) */
static const int64_t RIGHT[B * T] = {1, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 0};
/* no mask: packed rows of these position ids (sequences of 3 and 5 tokens; of 2, 4 and 2) with no_cache */
static const int64_t PACKED[B * T] = {0, 1, 2, 0, 1, 2, 3, 4, 0, 1, 0, 1, 2, 3, 5, 6};

/* The tiny model of `family`, seeded alike; with the balancing loss when
 * `balance`, StableLM's per-head q/k norms when `qk`. */
static accel_module *model_of(const char *family, bool balance, bool qk) {
    accel_manual_seed(11);
    accel_llama_config c = tiny_family_config(family);
    if (balance) c.output_router_logits = true, c.router_aux_loss_coef = 0.5;
    if (qk) c.qk_layernorm = true;
    return accel_llama_new(&c, ACCEL_CPU_DEVICE);
}

/* The loss of ids with attention_mask mask (position ids counting its kept
 * positions from 0; PACKED: no mask, those position ids, no_cache) on one
 * process (ref) and under tp: within 1e-5, and every gradient. */
static void loss_grads_match(accel_pg *pg, accel_module *ref, accel_module *tp, const int64_t *idv,
                             const int64_t *maskv, const char *family, bool sp) {
    bool packed = maskv == PACKED;
    int64_t pos[B * T];
    for (int b = 0; !packed && b < B; b++)
        for (int t = 0, seen = 0; t < T; t++) seen += (int)maskv[b * T + t], pos[b * T + t] = maskv[b * T + t] ? seen - 1 : 0;
    accel_tensor *ids = pi64(ACCEL_SHAPE(B, T), idv), *mask = packed ? NULL : pi64(ACCEL_SHAPE(B, T), maskv),
                 *p = pi64(ACCEL_SHAPE(B, T), packed ? PACKED : pos);
    accel_llama_inputs in = {.ids = ids, .attention_mask = mask, .position_ids = p, .no_cache = packed};
    accel_tensor *lr = accel_llama_loss_ex(ref, &in);
    CHECK(lr && accel_backward(lr) == ACCEL_OK);
    double want = lr ? accel_item(lr) : NAN;
    accel_step_reset();
    accel_tensor *lt = accel_llama_loss_ex(tp, &in);
    CHECK_MSG(lt && accel_backward(lt) == ACCEL_OK, "%s (sp %d): %s", family, sp, accel_last_error());
    if (sp) CHECK(accel_module_tp_reduce_grads(tp, pg) == ACCEL_OK); /* the norms' partial gradients */
    if (lt)
        CHECK_MSG(fabs(accel_item(lt) - want) <= 1e-5 * fmax(1, fabs(want)), "%s (sp %d%s): loss %.9g, want %.9g",
                  family, sp, maskv == RIGHT ? ", right-padded" : packed ? ", packed" : "", accel_item(lt), want);
    grads_match(tp, ref);
    accel_step_reset();
    accel_tensor_free(ids), accel_tensor_free(mask), accel_tensor_free(p);
}

/* accel_generate_batch's greedy tokens from the left-padded MASK: identical. */
static void generation_matches(accel_module *ref, accel_module *tp, const int64_t *idv, const char *family) {
    int64_t a[B * (T + NEW)], b[B * (T + NEW)], ca = 0, cb = 0;
    accel_generate_opts o = {.max_new_tokens = NEW};
    CHECK(accel_generate_batch(ref, idv, MASK, B, T, &o, a, &ca) == ACCEL_OK);
    CHECK_MSG(accel_generate_batch(tp, idv, MASK, B, T, &o, b, &cb) == ACCEL_OK, "%s: %s", family, accel_last_error());
    CHECK_MSG(ca == cb && !memcmp(a, b, sizeof(int64_t) * (size_t)(B * ca)), "%s: batched tokens differ under tp",
              family);
}

/* maskv MASK: also the greedy tokens; ckpt: the tp model's layers
 * recomputed in the backward (the padding's state read again there) */
static void family_matches(accel_pg *pg, const char *family, bool balance, bool sp, const int64_t *maskv, bool ckpt) {
    bool qk = !strcmp(family, "stablelm"); /* its per-head norms, each rank its heads' */
    accel_module *ref = model_of(family, balance, qk), *tp = model_of(family, balance, qk);
    accel_status st = accel_llama_parallelize(tp, pg, sp);
    if (st == ACCEL_OK && ckpt) st = accel_module_set_gradient_checkpointing(tp, true);
    CHECK_MSG(st == ACCEL_OK, "%s: %s", family, accel_last_error());
    int64_t idv[B * T];
    for (int i = 0; i < B * T; i++) idv[i] = (i * 7 + 1) % 40;
    loss_grads_match(pg, ref, tp, idv, maskv, family, sp);
    if (maskv == MASK) generation_matches(ref, tp, idv, family);
    accel_module_free(ref), accel_module_free(tp);
}

/* Under context parallelism each rank holds chunks of the positions:
 * refused, under either strategy (all-gather's ring, Ulysses' all-to-all). */
static void context_parallel_refused(accel_pg *pg, accel_cp_strategy strategy) {
    accel_module *cp = tiny_family(11, "llama");
    CHECK(accel_llama_context_parallelize(cp, pg, strategy) == ACCEL_OK);
    int64_t idv[B * T] = {0};
    accel_tensor *ids = pi64(ACCEL_SHAPE(B, T), idv), *mask = pi64(ACCEL_SHAPE(B, T), MASK);
    CHECK(!accel_llama_loss_ex(cp, &(accel_llama_inputs){.ids = ids, .attention_mask = mask}));
    CHECK_STR_CONTAINS(accel_last_error(), "attention_mask and position_ids under context parallelism are not");
    accel_clear_error();
    accel_step_reset();
    accel_tensor_free(ids), accel_tensor_free(mask);
    accel_module_free(cp);
}

static int body(int rank, int world) {
    (void)world;
    if (accel_dist_init() != ACCEL_OK) {
        fprintf(stderr, "rank %d: %s\n", rank, accel_last_error());
        return 1;
    }
    accel_pg *pg = accel_dist_default_group();
    const char *families[] = {"llama", "gemma2", "gpt2", "qwen3_moe", "phi", "gpt_neox", "stablelm", "starcoder2"};
    for (int sp = 0; sp < 2; sp++) {
        for (size_t f = 0; f < sizeof families / sizeof *families; f++)
            family_matches(pg, families[f], false, sp, MASK, false);
        family_matches(pg, "mixtral", true, sp, MASK, false);
        family_matches(pg, "qwen2_moe", true, sp, MASK, false);
        /* right padding (and both sides): Llama, a family with biases, one with a window and biases */
        family_matches(pg, "llama", false, sp, RIGHT, false);
        family_matches(pg, "phi", false, sp, RIGHT, false);
        family_matches(pg, "starcoder2", false, sp, RIGHT, false);
        /* checkpointed: the fused key ranges (Llama), the explicit scores of a window (Starcoder2) */
        family_matches(pg, "llama", false, sp, MASK, true);
        family_matches(pg, "starcoder2", false, sp, RIGHT, true);
        /* packed rows, plain and checkpointed */
        for (int ckpt = 0; ckpt < 2; ckpt++) {
            family_matches(pg, "llama", false, sp, PACKED, ckpt);
            family_matches(pg, "starcoder2", false, sp, PACKED, ckpt);
        }
    }
    context_parallel_refused(pg, ACCEL_CP_ALLGATHER);
    context_parallel_refused(pg, ACCEL_CP_ALLTOALL);
    accel_dist_finalize();
    return check_summary();
}

int main(void) {
    dist_group g = {.world = 2, .one_machine = true, .timeout = "60", .kill_after_s = 120};
    CHECK(dist_group_runs_ok(&g, body, "padded tp 2"));
    return check_summary();
}
