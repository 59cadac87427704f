/* The decoder families under tensor parallelism (accel_llama_parallelize)
 * on 2 and 4 forked processes: five SGD steps of the tiny model (4 heads, 2
 * key/value heads: split over 2 ranks, replicated over 4; tied embeddings)
 * with the loss and every gradient of each step within 1e-5 of the same
 * model on one process, for every family: Llama, Gemma2 (windows,
 * soft-capping), Granite (multipliers), Qwen3 (per-head q/k norms, whole on
 * every rank), GPT-2 (Conv1D cut along its columns, c_attn per q/k/v part,
 * learned positions, LayerNorm), Phi-3 (fused qkv_proj and gate_up_proj
 * cut per part; over 4 ranks qkv_proj replicated), OLMo 2 (q/k norms over
 * every head: the mean square summed over the ranks), Mixtral, Qwen3-MoE
 * and Qwen2-MoE (each expert's MLP cut, the router whole, one region per
 * sparse block; Qwen2-MoE's shared expert cut as a dense MLP, its gate
 * whole, its layer 0 dense by mlp_only_layers; with the load-balancing
 * loss; Qwen3-MoE also with a dense layer 0,
 * Mixtral with its router's jitter drawn from other seeds on ranks > 0),
 * StableLM with qk_layernorm (each rank its heads' own norms, their weights
 * whole on every rank and their gradients summed; also checkpointed), each
 * also under Megatron's sequence parallelism (the norms on T / tp
 * positions, their gradients summed by accel_module_tp_reduce_grads); then greedy generation
 * with the KV cache giving one process's tokens (32 of them, GPT-2 8), also
 * under sequence parallelism (run unsplit), from a cache sized for the
 * rank's key/value heads; Llama with activation checkpointing, with and
 * without sequence parallelism, Mixtral with it (also with the balancing
 * loss, as Qwen2-MoE); Llama under bf16 and fp16
 * autocast, Mixtral under bf16, close to one process within their
 * rounding; each family's rank holding the parameter bytes `accel
 * estimate-memory --tp_size` counts; and the refusals, which the estimate
 * makes in the same words (Qwen3-MoE's moe_intermediate_size: the runtime's
 * only, the estimate refusing experts first); a model of slices refused by
 * save_pretrained and accel_save_module. */
#include <sys/stat.h>
#include <unistd.h>

#include "bigmodel/mesh_memory.h"
#include "check.h"
#include "dist_group.h"
#include "tiny_llama.h"
#include "tp_fixture.h"

enum { B = 2, T = 8, STEPS = 5 };

/* Each rank holds its slices: the heads, the MLP's features (each part of a
 * fused projection), the vocabulary; tied embeddings stay tied. */
static void slices_cut(accel_module *tp, const char *family, int world) {
    bool gpt2 = !strcmp(family, "gpt2"), phi3 = !strcmp(family, "phi3"), neox = !strcmp(family, "gpt_neox");
    const char *embed = gpt2 ? "transformer.wte.weight" : neox ? "gpt_neox.embed_in.weight" : "model.embed_tokens.weight";
    CHECK(accel_module_get_tensor(tp, neox ? "embed_out.weight" : "lm_head.weight") ==
          accel_module_get_tensor(tp, embed));
    CHECK(accel_module_get_tensor(tp, embed)->shape[0] == 40 / world);
    if (neox) { /* query_key_value: each rank its heads' q, k, v rows (3 x 4 a head); dense by its inputs */
        CHECK(accel_module_get_tensor(tp, "gpt_neox.layers.0.attention.query_key_value.weight")->shape[0] ==
              3 * 16 / world);
        CHECK(accel_module_get_tensor(tp, "gpt_neox.layers.0.attention.query_key_value.bias")->shape[0] ==
              3 * 16 / world);
        CHECK(accel_module_get_tensor(tp, "gpt_neox.layers.1.attention.dense.weight")->shape[1] == 16 / world);
        CHECK(accel_module_get_tensor(tp, "gpt_neox.layers.1.mlp.dense_h_to_4h.weight")->shape[0] == 24 / world);
        CHECK(accel_module_get_tensor(tp, "gpt_neox.layers.1.mlp.dense_4h_to_h.weight")->shape[1] == 24 / world);
        CHECK(accel_module_get_tensor(tp, "gpt_neox.layers.1.mlp.dense_4h_to_h.bias")->shape[0] == 16);
        return;
    }
    if (gpt2) { /* Conv1D [in, out]: q | k | v columns, 16 each */
        CHECK(accel_module_get_tensor(tp, "transformer.h.0.attn.c_attn.weight")->shape[1] == 3 * 16 / world);
        CHECK(accel_module_get_tensor(tp, "transformer.h.0.attn.c_attn.bias")->shape[0] == 3 * 16 / world);
        CHECK(accel_module_get_tensor(tp, "transformer.h.1.mlp.c_proj.weight")->shape[0] == 24 / world);
        return;
    }
    if (phi3) /* q | k | v rows 16 + 8 + 8; over 4 ranks the 2 kv heads replicated: the whole */
        CHECK(accel_module_get_tensor(tp, "model.layers.0.self_attn.qkv_proj.weight")->shape[0] == (world > 2 ? 32 : 16));
    else {
        CHECK(accel_module_get_tensor(tp, "model.layers.0.self_attn.q_proj.weight")->shape[0] == 4 * 4 / world);
        CHECK(accel_module_get_tensor(tp, "model.layers.0.self_attn.k_proj.weight")->shape[0] == (world > 2 ? 8 : 4));
    }
    if (phi3) CHECK(accel_module_get_tensor(tp, "model.layers.1.mlp.gate_up_proj.weight")->shape[0] == 48 / world);
    if (!strcmp(family, "mixtral")) { /* each of 8 experts' features (24) split, the router [8, 16] whole */
        CHECK(accel_module_get_tensor(tp, "model.layers.1.block_sparse_moe.gate.weight")->shape[0] == 8);
        const char *w3 = "model.layers.1.block_sparse_moe.experts.7.w3.weight";
        const char *w2 = "model.layers.0.block_sparse_moe.experts.0.w2.weight";
        CHECK(accel_module_get_tensor(tp, w3)->shape[0] == 24 / world);
        CHECK(accel_module_get_tensor(tp, w2)->shape[1] == 24 / world);
    } else if (!strcmp(family, "qwen3_moe")) { /* 16 experts of ffn 12; layer 0 dense every second layer */
        CHECK(accel_module_get_tensor(tp, "model.layers.1.mlp.gate.weight")->shape[0] == 16);
        CHECK(accel_module_get_tensor(tp, "model.layers.1.mlp.experts.15.up_proj.weight")->shape[0] == 12 / world);
        CHECK(accel_module_get_tensor(tp, "model.layers.1.mlp.experts.3.down_proj.weight")->shape[1] == 12 / world);
        if (accel_llama_config_of(tp)->decoder_sparse_step == 2)
            CHECK(accel_module_get_tensor(tp, "model.layers.0.mlp.down_proj.weight")->shape[1] == 24 / world);
    } else if (!strcmp(family, "qwen2_moe")) { /* as Qwen3-MoE's, and the shared expert (ffn 8) cut, its gate whole */
        CHECK(accel_module_get_tensor(tp, "model.layers.1.mlp.gate.weight")->shape[0] == 8);
        CHECK(accel_module_get_tensor(tp, "model.layers.1.mlp.experts.7.up_proj.weight")->shape[0] == 12 / world);
        CHECK(accel_module_get_tensor(tp, "model.layers.1.mlp.shared_expert.gate_proj.weight")->shape[0] == 8 / world);
        CHECK(accel_module_get_tensor(tp, "model.layers.1.mlp.shared_expert.down_proj.weight")->shape[1] == 8 / world);
        CHECK(accel_module_get_tensor(tp, "model.layers.1.mlp.shared_expert_gate.weight")->shape[0] == 1);
        CHECK(accel_module_get_tensor(tp, "model.layers.0.mlp.down_proj.weight")->shape[1] == 24 / world);
    } else if (!strcmp(family, "phi")) { /* fc1 and the head's bias by their outputs, dense and fc2 by their inputs */
        CHECK(accel_module_get_tensor(tp, "model.layers.1.mlp.fc1.weight")->shape[0] == 24 / world);
        CHECK(accel_module_get_tensor(tp, "model.layers.1.mlp.fc1.bias")->shape[0] == 24 / world);
        CHECK(accel_module_get_tensor(tp, "model.layers.1.mlp.fc2.weight")->shape[1] == 24 / world);
        CHECK(accel_module_get_tensor(tp, "model.layers.1.mlp.fc2.bias")->shape[0] == 16);
        CHECK(accel_module_get_tensor(tp, "model.layers.0.self_attn.dense.weight")->shape[1] == 16 / world);
        CHECK(accel_module_get_tensor(tp, "lm_head.bias")->shape[0] == 40 / world);
    } else if (!strcmp(family, "starcoder2")) { /* c_fc and its bias by their outputs, o_proj and c_proj by inputs */
        CHECK(accel_module_get_tensor(tp, "model.layers.1.mlp.c_fc.weight")->shape[0] == 24 / world);
        CHECK(accel_module_get_tensor(tp, "model.layers.1.mlp.c_fc.bias")->shape[0] == 24 / world);
        CHECK(accel_module_get_tensor(tp, "model.layers.1.mlp.c_proj.weight")->shape[1] == 24 / world);
        CHECK(accel_module_get_tensor(tp, "model.layers.1.mlp.c_proj.bias")->shape[0] == 16);
        CHECK(accel_module_get_tensor(tp, "model.layers.0.self_attn.o_proj.weight")->shape[1] == 16 / world);
        CHECK(accel_module_get_tensor(tp, "model.layers.0.self_attn.o_proj.bias")->shape[0] == 16);
    } else
        CHECK(accel_module_get_tensor(tp, "model.layers.1.mlp.down_proj.weight")->shape[1] == 24 / world);
}

/* The rank holds what `accel estimate-memory --tp_size` counts for it
 * (bigmodel/mesh_memory.h, on the whole model ref), byte for byte. */
static void mesh_bytes_match(accel_module *tp, accel_module *ref, const char *family, int world) {
    accel__mesh_bytes want = {0};
    CHECK_MSG(accel__mesh_param_bytes(ref, accel_llama_config_of(ref), world, 1, &want) == ACCEL_OK, "%s: %s", family,
              accel_last_error());
    accel_state_dict *sd = accel_module_state_dict(tp);
    int64_t held = 0;
    for (int i = 0; sd && i < sd->n; i++)
        if (!sd->entries[i].is_tied_alias)
            held += accel_numel(sd->entries[i].t) * (int64_t)accel_dtype_size(sd->entries[i].t->dtype);
    accel_state_dict_free(sd);
    CHECK_MSG(held == want.param_bytes, "%s over %d ranks: a rank holds %lld bytes, the estimate counts %lld", family,
              world, (long long)held, (long long)want.param_bytes);
}

/* Greedy decoding with the KV cache: the same tokens as one process (32 new
 * ones; GPT-2 8, its 16 learned positions the limit), and the prompt's last
 * logits (gathered over the ranks) within 1e-5. Under sequence parallelism
 * the prompt's 5 positions are not a multiple of tp, nor is a decoding
 * step's one: the tp regions run unsplit. */
static void generation_matches(accel_module *tp, accel_module *ref, const char *family, bool sp) {
    enum { P = 5, MAX_NEW = 32 };
    int64_t prompt[P] = {3, 17, 5, 9, 30}, want[P + MAX_NEW], got[P + MAX_NEW], n_want = 0, n_got = 0;
    int64_t n_new = strcmp(family, "gpt2") ? MAX_NEW : 8;
    accel_tensor *l_ref = accel_tensor_new(ACCEL_F32, 1, (int64_t[]){40}, ACCEL_CPU_DEVICE);
    accel_tensor *l_tp = accel_tensor_new(ACCEL_F32, 1, (int64_t[]){40}, ACCEL_CPU_DEVICE);
    accel_generate_opts o = {.max_new_tokens = n_new, .prompt_logits = l_ref};
    CHECK(accel_generate(ref, prompt, P, &o, want, &n_want) == ACCEL_OK);
    o.prompt_logits = l_tp;
    CHECK_MSG(accel_generate(tp, prompt, P, &o, got, &n_got) == ACCEL_OK, "%s%s: %s", family, sp ? " (sp)" : "",
              accel_last_error());
    CHECK_MSG(n_got == n_want && n_want == P + n_new && !memcmp(got, want, (size_t)n_want * sizeof *got),
              "%s%s: generated under tp %lld tokens, one process %lld (or other ones)", family, sp ? " (sp)" : "",
              (long long)n_got, (long long)n_want);
    float *a = floats_of(l_tp), *b = floats_of(l_ref);
    close_all(family, a, b, 40);
    free(a), free(b);
    accel_tensor_free(l_ref), accel_tensor_free(l_tp);
}

/* The model's own cache holds this rank's key/value heads: 2 (GPT-2, GPT-NeoX 4) over
 * the ranks, or over 4 ranks of 2 the one replicated head; a whole model's
 * cache is bigger (the rank uses its first heads), and a rank's cache is
 * refused by the whole model. */
static void cache_sized(accel_module *tp, accel_module *ref, const char *family, int world) {
    enum { LEN = 16, D = 4, LAYERS = 2 };
    int64_t kv = strcmp(family, "gpt2") && strcmp(family, "gpt_neox") ? 2 : 4, mine = kv >= world ? kv / world : 1;
    accel_kv_cache *kc = accel_llama_kv_cache_new(tp, 1, LEN, ACCEL_CPU_DEVICE);
    accel_kv_cache *whole = accel_kv_cache_new(accel_llama_config_of(ref), 1, LEN, ACCEL_CPU_DEVICE);
    CHECK_MSG(kc && accel_kv_cache_bytes(kc) == LAYERS * 2 * mine * LEN * D * 4, "%s: a rank's cache of %lld bytes",
              family, (long long)accel_kv_cache_bytes(kc));
    CHECK(accel_kv_cache_bytes(whole) == LAYERS * 2 * kv * LEN * D * 4);
    int64_t one[1] = {3};
    accel_tensor *ids = pi64(ACCEL_SHAPE(1, 1), one);
    bool prev = accel_set_grad_enabled(false);
    CHECK(accel_llama_forward(ref, ids, kc) == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "key/value heads");
    CHECK_MSG(accel_llama_forward(tp, ids, whole) != NULL, "%s: %s", family, accel_last_error()); /* its first heads */
    accel_set_grad_enabled(prev);
    accel_step_reset();
    accel_tensor_free(ids);
    accel_kv_cache_free(kc), accel_kv_cache_free(whole);
}

/* The experts' variants: BALANCE with the routers' load-balancing loss,
 * weighted 0.5 for its gradients to show next to the cross-entropy's;
 * DENSE_FIRST (Qwen3-MoE) experts every second layer, layer 0 a dense MLP;
 * JITTER (Mixtral) the router's input noise, each step drawn from the seed
 * the one process draws from on rank 0 and from other seeds on the others
 * (every rank must route with rank 0's); and QK_LAYERNORM StableLM's
 * qk_layernorm, a LayerNorm of its own per head. */
enum { BALANCE = 1, DENSE_FIRST = 2, JITTER = 4, QK_LAYERNORM = 8 };

static void family_matches(accel_pg *pg, const char *family, bool sp, bool ckpt, int moe) {
    accel_llama_config c = tiny_family_config(family);
    if (moe & BALANCE) c.output_router_logits = true, c.router_aux_loss_coef = 0.5;
    if (moe & DENSE_FIRST) c.decoder_sparse_step = 2;
    if (moe & JITTER) c.router_jitter_noise = 0.3;
    if (moe & QK_LAYERNORM) c.qk_layernorm = true;
    accel_manual_seed(11);
    accel_module *ref = accel_llama_new(&c, ACCEL_CPU_DEVICE);
    accel_manual_seed(11);
    accel_module *tp = accel_llama_new(&c, ACCEL_CPU_DEVICE);
    accel_status st = accel_llama_parallelize(tp, pg, sp);
    if (st == ACCEL_OK && ckpt) st = accel_module_set_gradient_checkpointing(tp, true);
    CHECK_MSG(st == ACCEL_OK, "%s: %s", family, accel_last_error());
    if (st != ACCEL_OK) goto out;
    slices_cut(tp, family, accel_pg_size(pg));
    mesh_bytes_match(tp, ref, family, accel_pg_size(pg));
    accel_optim_hparams h = {.lr = 0.05, .momentum = 0.9};
    accel_optimizer *o_ref = accel_optimizer_new_module(ACCEL_OPTIM_SGD, ref, &h);
    accel_optimizer *o_tp = accel_optimizer_new_module(ACCEL_OPTIM_SGD, tp, &h);
    for (int s = 0; s < STEPS; s++) {
        int64_t idv[B * T];
        for (int i = 0; i < B * T; i++) idv[i] = (i * 7 + s * 13 + 1) % 40;
        accel_tensor *ids = pi64(ACCEL_SHAPE(B, T), idv);
        accel_manual_seed(100 + (uint64_t)s);
        accel_tensor *lr = accel_llama_loss(ref, ids);
        CHECK(lr && accel_backward(lr) == ACCEL_OK);
        double want = lr ? accel_item(lr) : NAN;
        accel_step_reset();
        accel_manual_seed(100 + (uint64_t)s + 1000 * (uint64_t)accel_pg_rank(pg));
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
    if (moe & JITTER) accel_module_train(ref, false), accel_module_train(tp, false); /* generating: no noise */
    /* the logits are this rank's vocabulary columns; generating, the whole vocabulary's */
    int64_t one[T] = {1, 2, 3, 4, 5, 6, 7, 8};
    accel_tensor *ids = pi64(ACCEL_SHAPE(1, T), one);
    accel_tensor *logits = accel_llama_forward(tp, ids, NULL);
    CHECK(logits && logits->shape[2] == 40 / accel_pg_size(pg));
    accel_step_reset();
    generation_matches(tp, ref, family, sp);
    if (!sp) cache_sized(tp, ref, family, accel_pg_size(pg));
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
        CHECK_MSG(!a == !b, "%s: a gradient in one model only", sd->entries[i].name);
        if (!a || !b) continue; /* an expert no token chose */
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

/* Under bf16 (fp16) autocast the ranks' partial sums are rounded before
 * they are added: the losses of 5 SGD steps within loss_tol of one
 * process's (relative), every gradient within grad_tol (relative L2). */
static void autocast_close(accel_pg *pg, const char *family, accel_dtype dt, bool sp, double loss_tol,
                           double grad_tol) {
    const char *dn = accel_dtype_name(dt);
    accel_module *ref = tiny_family(11, family), *tp = tiny_family(11, family);
    CHECK(accel_llama_parallelize(tp, pg, sp) == ACCEL_OK);
    accel_optim_hparams h = {.lr = 0.05, .momentum = 0.9};
    accel_optimizer *o_ref = accel_optimizer_new_module(ACCEL_OPTIM_SGD, ref, &h);
    accel_optimizer *o_tp = accel_optimizer_new_module(ACCEL_OPTIM_SGD, tp, &h);
    for (int s = 0; s < STEPS; s++) {
        int64_t idv[B * T];
        for (int i = 0; i < B * T; i++) idv[i] = (i * 5 + s * 11 + 2) % 40;
        accel_tensor *ids = pi64(ACCEL_SHAPE(B, T), idv);
        accel_dtype prev = accel_autocast_begin(dt);
        accel_tensor *lr = accel_llama_loss(ref, ids);
        CHECK(lr && accel_backward(lr) == ACCEL_OK);
        double want = lr ? accel_item(lr) : NAN;
        accel_step_reset();
        accel_tensor *lt = accel_llama_loss(tp, ids);
        CHECK_MSG(lt && accel_backward(lt) == ACCEL_OK, "%s", accel_last_error());
        accel_autocast_end(prev);
        if (sp) CHECK(accel_module_tp_reduce_grads(tp, pg) == ACCEL_OK);
        double got = lt ? accel_item(lt) : NAN, d = worst_grad_distance(tp, ref);
        CHECK_MSG(fabs(got - want) <= loss_tol * fabs(want), "%s %s%s step %d: loss %.6g, want %.6g", family, dn,
                  sp ? " sp" : "", s, got, want);
        CHECK_MSG(d <= grad_tol, "%s %s%s step %d: a gradient %.3g (relative L2) from one process's", family, dn,
                  sp ? " sp" : "", s, d);
        accel_step_reset();
        CHECK(accel_optimizer_step(o_ref) == ACCEL_OK && accel_optimizer_step(o_tp) == ACCEL_OK);
        CHECK(accel_optimizer_zero_grad(o_ref) == ACCEL_OK && accel_optimizer_zero_grad(o_tp) == ACCEL_OK);
        accel_tensor_free(ids);
    }
    accel_optimizer_free(o_ref), accel_optimizer_free(o_tp);
    accel_module_free(ref), accel_module_free(tp);
}

static void refusals(accel_pg *pg) {
    if (accel_pg_size(pg) < 4) return;
    accel_manual_seed(1);
    accel_llama_config c = accel_llama_config_default();
    c.vocab_size = 40, c.hidden_size = 24, c.intermediate_size = 24, c.num_hidden_layers = 1;
    c.num_attention_heads = 6, c.num_key_value_heads = 6;
    accel_module *m = accel_llama_new(&c, ACCEL_CPU_DEVICE);
    CHECK(accel_llama_parallelize(m, pg, false) == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "accel_llama_parallelize: num_attention_heads is not a multiple of tp 4");
    /* the estimate refuses it in the same words (accel__llama_tp_check) */
    char runtime[512];
    snprintf(runtime, sizeof runtime, "%s", strchr(accel_last_error(), ':'));
    accel_activation_opts o = {.batch_size = 1, .seq_len = 8, .autocast = ACCEL_F32, .tp_size = 4};
    accel_activation_bytes b;
    CHECK(accel_llama_activation_bytes(&c, &o, &b) == ACCEL_ERR_INVALID_ARG);
    CHECK_MSG(!strcmp(strchr(accel_last_error(), ':'), runtime), "the estimate: %s", accel_last_error());
    CHECK(accel_module_get_tensor(m, "model.layers.0.self_attn.q_proj.weight")->shape[0] == 24); /* untouched */
    accel_module_free(m);
    /* Qwen's experts are cut along moe_intermediate_size; intermediate_size,
     * which only its dense layers read, is free when every layer is sparse */
    c = tiny_family_config("qwen3_moe");
    c.moe_intermediate_size = 6;
    m = accel_llama_new(&c, ACCEL_CPU_DEVICE);
    CHECK(accel_llama_parallelize(m, pg, false) == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "moe_intermediate_size is not a multiple of tp 4 (heads 4, kv heads 2, "
                                           "intermediate_size 24, moe_intermediate_size 6, vocab_size 40)");
    CHECK(accel_module_get_tensor(m, "model.layers.1.mlp.experts.2.up_proj.weight")->shape[0] == 6);
    accel_module_free(m);
    c.moe_intermediate_size = 12, c.intermediate_size = 22;
    m = accel_llama_new(&c, ACCEL_CPU_DEVICE);
    CHECK_MSG(accel_llama_parallelize(m, pg, false) == ACCEL_OK, "%s", accel_last_error());
    CHECK(accel_module_get_tensor(m, "model.layers.1.mlp.experts.2.up_proj.weight")->shape[0] == 3);
    accel_module_free(m);
    /* Qwen2-MoE's shared expert is cut along its own intermediate size */
    c = tiny_family_config("qwen2_moe");
    c.shared_expert_intermediate_size = 6;
    m = accel_llama_new(&c, ACCEL_CPU_DEVICE);
    CHECK(accel_llama_parallelize(m, pg, false) == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "shared_expert_intermediate_size is not a multiple of tp 4 (heads 4, kv "
                                           "heads 2, intermediate_size 24, moe_intermediate_size 12, "
                                           "shared_expert_intermediate_size 6, vocab_size 40)");
    accel_module_free(m);
}

/* A model cut to this rank's tensor-parallel slices is not saved as if whole:
 * save_pretrained and accel_save_module of it, or of one of its layers,
 * refused naming accel_accelerator_save_model (which gathers), nothing
 * written; the model before parallelize saves. */
static void save_refused(accel_pg *pg, int rank) {
    char dir[64];
    snprintf(dir, sizeof dir, "/tmp/accel_tp_save_%d_%d", (int)getpid(), rank);
    CHECK(mkdir(dir, 0755) == 0);
    accel_module *m = tiny_family(3, "llama");
    CHECK(accel_llama_parallelize(m, pg, false) == ACCEL_OK);
    CHECK(accel_save_pretrained(m, dir, 0) == ACCEL_ERR_STATE);
    CHECK_STR_CONTAINS(accel_last_error(), "tensor-parallel slices");
    CHECK(accel_save_module(dir, accel_module_find(m, "model.layers.0"), 0) == ACCEL_ERR_STATE);
    CHECK_STR_CONTAINS(accel_last_error(), "accel_accelerator_save_model");
    accel_clear_error();
    char f[128];
    snprintf(f, sizeof f, "%s/config.json", dir);
    CHECK(access(f, F_OK) != 0);
    accel_module_free(m);
    m = tiny_family(3, "llama");
    CHECK_MSG(accel_save_pretrained(m, dir, 0) == ACCEL_OK, "%s", accel_last_error());
    CHECK(access(f, F_OK) == 0);
    accel_module_free(m);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0);
}

static int body(int rank, int world) {
    if (accel_dist_init() != ACCEL_OK) {
        fprintf(stderr, "rank %d: %s\n", rank, accel_last_error());
        return 1;
    }
    accel_pg *pg = accel_dist_default_group();
    const char *families[] = {"llama", "gemma2", "granite", "qwen3", "gpt2", "phi3", "olmo2", "mixtral", "qwen3_moe",
                              "qwen2_moe", "gemma3_text", "phi", "gpt_neox", "stablelm", "starcoder2", "mistral",
                              "qwen2", "gemma"};
    for (int sp = 0; sp < 2; sp++) {
        for (int f = 0; f < (int)(sizeof families / sizeof *families); f++) family_matches(pg, families[f], sp, false, 0);
        /* the routers' load-balancing loss: the same on every rank, its gradient through one rank's */
        for (int f = 7; f < 10; f++) family_matches(pg, families[f], sp, false, BALANCE);
        family_matches(pg, "qwen3_moe", sp, false, DENSE_FIRST); /* the MLP's plan on layer 0 */
        family_matches(pg, "mixtral", sp, false, JITTER);
        family_matches(pg, "stablelm", sp, false, QK_LAYERNORM);
    }
    /* the layers recomputed in the backward: the shared region entries (q/k/v, gate/up) re-made */
    family_matches(pg, "llama", false, true, 0);
    family_matches(pg, "llama", true, true, 0);
    family_matches(pg, "mixtral", true, true, 0);
    family_matches(pg, "stablelm", true, true, QK_LAYERNORM);
    /* the balancing loss's gradient from the recomputed blocks, rank 0's tie alone */
    family_matches(pg, "mixtral", true, true, BALANCE);
    family_matches(pg, "qwen2_moe", false, true, BALANCE);
    /* measured (tp 2 and 4, with and without sp): bf16 losses within 6e-5,
     * gradients 5e-3 to 1.1e-2; fp16 (3 more mantissa bits) losses within
     * 4e-6, gradients 1e-3 to 4e-3 */
    autocast_close(pg, "llama", ACCEL_BF16, false, 2e-3, 5e-2);
    autocast_close(pg, "llama", ACCEL_BF16, true, 2e-3, 5e-2);
    autocast_close(pg, "llama", ACCEL_F16, false, 1e-4, 2e-2);
    autocast_close(pg, "llama", ACCEL_F16, true, 1e-4, 2e-2);
    /* Mixtral's experts under bf16 (measured: losses within 4e-5, gradients
     * 8e-3 to 1.7e-2; the same experts chosen). Not Qwen3-MoE's 16: at tp 4
     * the ranks' rounded partial sums flip a near tie of its router, and
     * another expert runs than on one process. */
    autocast_close(pg, "mixtral", ACCEL_BF16, false, 2e-3, 5e-2);
    autocast_close(pg, "mixtral", ACCEL_BF16, true, 2e-3, 5e-2);
    refusals(pg);
    save_refused(pg, rank);
    accel_dist_finalize();
    return check_summary();
}

int main(void) {
    int worlds[] = {2, 4};
    for (int k = 0; k < 2; k++) {
        dist_group g = {.world = worlds[k], .one_machine = true, .timeout = "60", .kill_after_s = 240};
        CHECK(dist_group_runs_ok(&g, body, "world %d", g.world));
    }
    return check_summary();
}
