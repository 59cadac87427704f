/* Context parallelism composed with tensor parallelism through the
 * Accelerator, on 4 forked processes: tp 2 x cp 2 (each cp_comm_strategy),
 * tp 2 x sp 2 (Ulysses' sp_size) and each of them with Megatron's sequence
 * parallelism on the tp side. The tp group splits the heads (and the
 * key/value heads), the cp group the sequence into load-balanced chunks; the
 * attention's cp exchange runs over the rank's heads only, RoPE at the
 * chunks' global positions, the loss is the vocab-parallel one over the
 * rank's chunks. Every rank gets the same batches from the prepared data
 * loader (no data-parallel dimension), and on 8 processes dp_shard 2 x cp 2
 * x tp 2 each data-parallel rank its own. For 5 SGD steps each rank's loss and
 * every gradient (this rank's tp slice of it) equal, within 1e-5 (f32), the
 * same model on one process stepping on the global batch, and the first
 * step's accel_accelerator_clip_grad_norm is the one-process norm; Llama
 * (grouped-query attention), Gemma-2 (a sliding window that bites on
 * layer 0, soft-capped scores and logits) and OLMo 2 (q/k norms over every
 * head, their mean square summed over the tp group) in each of these
 * meshes, Phi-3 (fused projections), Phi, GPT-NeoX and StableLM (its
 * per-head q/k LayerNorms on: tp 2 x cp 2 all-gather, and all-to-all with
 * sequence parallelism) in two of them, Mixtral (tp 2 x cp 2
 * with sequence parallelism) and Qwen3-MoE (tp 2 x sp 2) in one: each
 * rank routes its chunks' tokens, its tp group alike. OLMo 2 steps with lr
 * 0.02, the others 0.05: at 0.05 its tiny model's trajectory turns
 * ill-conditioned by step 3 (on one process, weights perturbed by 1e-7
 * give gradients 7.6e-6 apart at step 4, Llama's 1.5e-7), so the meshes'
 * other summation order alone put a tied-embedding gradient 2.2e-5 off;
 * at 0.02 the same perturbation stays within 5e-7.
 * save_model writes the
 * one-process weights, save_state succeeds. Under ZeRO-1, -2 and -3
 * (sharding over the cp ranks; ZeRO-3 with sequence parallelism) the 5
 * steps' losses are the one-process ones. Under all-to-all a model with one
 * head per tp rank is refused at prepare, naming the heads. */
#include <stdlib.h>
#include <string.h>

#include "accel/accel.h"
#include "check.h"
#include "dist_group.h"
#include "tiny_llama.h"
#include "tp_fixture.h"

enum { SEQS = 24, T = 8, BS = 2, STEPS = 5 };

static struct {
    const char *family, *strategy;
    int cp, sp, zero_stage;
    double lr;
    bool seq_par;
    bool qk_layernorm; /* StableLM's per-head q/k LayerNorms on (tiny_family_config's StableLM has none) */
    char dir[64];
} CFG;

static void sequences(int64_t *ids) {
    for (int i = 0; i < SEQS * T; i++) ids[i] = (i * 7 + i / T * 5 + 3) % 40;
}

/* tiny_family(seed, CFG.family), with qk_layernorm when CFG asks for it. */
static accel_module *family_model(uint64_t seed) { return tiny_family_qk(seed, CFG.family, CFG.qk_layernorm); }

/* Under all-to-all a model of 2 heads has one per tp rank: nothing to
 * split over cp 2, refused at prepare naming it. */
static void refuses_odd_heads(accel_accelerator *acc) {
    accel_manual_seed(5);
    accel_llama_config c = accel_llama_config_default();
    c.vocab_size = 40, c.hidden_size = 16, c.intermediate_size = 24, c.num_hidden_layers = 1;
    c.num_attention_heads = 2, c.num_key_value_heads = 2, c.max_position_embeddings = 16;
    c.torch_dtype = ACCEL_F32;
    accel_module *m = accel_llama_new(&c, ACCEL_CPU_DEVICE);
    CHECK(accel_accelerator_prepare_model(acc, m) == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "the all-to-all strategy splits a rank's 1 query heads (num_attention_heads "
                                           "2 / tp 2) over cp 2 ranks: not a multiple");
    accel_module_free(m);
}

static int body(int rank, int world) {
    accel_accelerator_opts o = accel_accelerator_opts_default();
    o.mixed_precision = "no";
    o.zero_stage = CFG.zero_stage;
    int seq = CFG.cp ? CFG.cp : CFG.sp, dp = world / (2 * seq), dp_rank = rank / (2 * seq);
    o.parallelism = (accel_parallelism_opts){.tp_size = 2, .cp_size = CFG.cp, .sp_size = CFG.sp,
                                             .dp_shard_size = dp,
                                             .cp_comm_strategy = CFG.strategy,
                                             .sequence_parallelism = CFG.seq_par ? ACCEL_TRUE : 0};
    accel_accelerator *acc = accel_accelerator_new(&o);
    if (!acc) {
        fprintf(stderr, "rank %d: %s\n", rank, accel_last_error());
        return 1;
    }
    int64_t ids[SEQS * T];
    sequences(ids);
    accel_tensor *all = accel_tensor_new(ACCEL_I64, 2, (int64_t[]){SEQS, T}, ACCEL_CPU_DEVICE);
    accel_tensor_from_host(all, ids);
    accel_dataset *ds = accel_tensor_dataset_new(1, &all);
    accel_dataloader_opts dlo = accel_dataloader_opts_default();
    dlo.batch_size = BS;
    accel_dataloader *dl = accel_dataloader_new(ds, &dlo);
    accel_module *ref = family_model(11), *m = family_model(11);
    accel_optim_hparams h = {.lr = CFG.lr, .momentum = 0.9};
    accel_optimizer *o_ref = accel_optimizer_new_module(ACCEL_OPTIM_SGD, ref, &h);
    /* made over the whole model, re-targeted to the tp slices by prepare */
    accel_optimizer *opt = accel_optimizer_new_module(ACCEL_OPTIM_SGD, m, &h);
    accel_status st = accel_accelerator_prepare(acc, dl, m, opt);
    CHECK_MSG(st == ACCEL_OK, "rank %d: %s", rank, accel_last_error());
    if (st != ACCEL_OK) goto out;
    /* both plans applied: this rank's heads (2 of 4 query heads, 1 of 2 key/value heads, of head_dim 4:
     * Phi-3's fused q | k | v rows of them; GPT-NeoX's q, k, v rows of its 2 of 4 heads) and its cp group */
    bool fused = !strcmp(CFG.family, "phi3"), neox = !strcmp(CFG.family, "gpt_neox");
    accel_tensor *kw = accel_module_get_tensor(m, fused  ? "model.layers.0.self_attn.qkv_proj.weight"
                                                  : neox ? "gpt_neox.layers.0.attention.query_key_value.weight"
                                                         : "model.layers.0.self_attn.k_proj.weight");
    CHECK(kw && kw->shape[0] == (fused ? 2 + 1 + 1 : neox ? 2 * 3 : 1) * 4 && accel_llama_cp_group(m, NULL) != NULL);
    /* StableLM's per-head norms: one per head, whole on every rank (4 query heads, 2 key/value heads) */
    CHECK(!CFG.qk_layernorm || has_per_head_qk_norms(m));
    accel_tensor **ps;
    int n_ref = accel_module_parameters(ref, &ps);
    for (int s = 0; s < STEPS; s++) {
        accel_batch b;
        CHECK(accel_dataloader_next(dl, &b));
        /* data-parallel rank r's batch is batch s dp + r, the same on the ranks of its tp and cp groups */
        const int64_t *my_rows = ids + (int64_t)(s * dp + dp_rank) * BS * T;
        int64_t got_ids[BS * T] = {0};
        CHECK(accel_numel(b.fields[0]) == BS * T && accel_to_int64s(b.fields[0], got_ids) == ACCEL_OK);
        CHECK(!memcmp(got_ids, my_rows, sizeof got_ids));
        accel_tensor *loss = accel_llama_loss(m, b.fields[0]);
        CHECK_MSG(loss && accel_accelerator_backward(acc, loss) == ACCEL_OK, "rank %d step %d: %s", rank, s,
                  accel_last_error());
        /* one process: the mean of the global batch's dp losses (what DDP's average trains on) */
        accel_tensor *total = NULL;
        double want = NAN;
        for (int r = 0; r < dp; r++) {
            accel_tensor *l = accel_llama_loss(ref, accel_from_data(ACCEL_I64, ACCEL_SHAPE(BS, T),
                                                                    ids + (int64_t)(s * dp + r) * BS * T));
            if (r == dp_rank) want = accel_item(l);
            total = total ? accel_add(total, l) : l;
        }
        CHECK(accel_backward(accel_mul_scalar(total, 1.0 / dp)) == ACCEL_OK);
        double mine = loss ? accel_item(loss) : NAN;
        CHECK_MSG(fabs(mine - want) <= 1e-5 * fmax(1, fabs(want)), "rank %d step %d: loss %.9g, one process %.9g",
                  rank, s, mine, want);
        if (CFG.zero_stage == 0) grads_match(m, ref); /* ZeRO holds a shard of them */
        if (s == 0) { /* the global norm (a limit it does not reach: nothing clipped) */
            double got = accel_accelerator_clip_grad_norm(acc, m, 1e30, 2.0);
            double norm = accel_clip_grad_norm(n_ref, ps, 1e30, 2.0);
            CHECK_MSG(fabs(got - norm) <= 1e-5 * norm, "rank %d: the gradient norm is %.9g, one process's %.9g (%s)",
                      rank, got, norm, isnan(got) ? accel_last_error() : "");
        }
        CHECK_MSG(accel_accelerator_optimizer_step(acc, opt) == ACCEL_OK, "%s", accel_last_error());
        CHECK(accel_optimizer_step(o_ref) == ACCEL_OK);
        CHECK(accel_accelerator_zero_grad(acc, opt) == ACCEL_OK && accel_optimizer_zero_grad(o_ref) == ACCEL_OK);
        accel_step_reset();
    }
    accel_free(ps);
    saves_whole(acc, m, ref, CFG.dir); /* the cp ranks hold the same weights */
    if (CFG.sp || (CFG.strategy && !strcmp(CFG.strategy, "alltoall"))) refuses_odd_heads(acc);
out:
    accel_accelerator_free(acc);
    accel_optimizer_free(opt), accel_optimizer_free(o_ref);
    accel_module_free(ref), accel_module_free(m);
    accel_dataloader_free(dl), accel_dataset_free(ds), accel_tensor_free(all);
    accel_thread_cleanup();
    return check_summary();
}

static void run_on(int world, const char *family, int cp, int sp, const char *strategy, bool seq_par,
                   int zero_stage) {
    CFG.family = family, CFG.cp = cp, CFG.sp = sp, CFG.strategy = strategy, CFG.seq_par = seq_par;
    CFG.lr = strcmp(family, "olmo2") ? 0.05 : 0.02; /* see the top of the file */
    CFG.zero_stage = zero_stage;
    snprintf(CFG.dir, sizeof CFG.dir, "/tmp/accel_cp_tp_XXXXXX");
    CHECK(mkdtemp(CFG.dir) != NULL);
    dist_group g = {.world = world, .one_machine = true, .timeout = "60", .kill_after_s = 240};
    CHECK(dist_group_runs_ok(&g, body, "%s %d processes, tp 2 x %s 2 %s%s, zero %d", family, world, sp ? "sp" : "cp",
                             strategy ? strategy : "", seq_par ? ", sequence parallel" : "", zero_stage));
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", CFG.dir);
    CHECK(system(cmd) == 0);
}

static void run(const char *family, int cp, int sp, const char *strategy, bool seq_par, int zero_stage) {
    run_on(4, family, cp, sp, strategy, seq_par, zero_stage);
}

int main(void) {
    setenv("OMP_NUM_THREADS", "1", 0);
    static const char *const families[] = {"llama", "gemma2", "olmo2"};
    for (int f = 0; f < 3; f++)
        for (int seq_par = 0; seq_par < 2; seq_par++) {
            run(families[f], 2, 0, "allgather", seq_par, 0);
            run(families[f], 2, 0, "alltoall", seq_par, 0);
            run(families[f], 0, 2, NULL, seq_par, 0);
        }
    /* Phi-3's fused projections cut per part */
    run("phi3", 2, 0, "alltoall", true, 0);
    run("phi3", 2, 0, "allgather", false, 0);
    /* Phi's parallel attention and MLP from one LayerNorm, biases (lm_head's cut with the vocabulary), partial RoPE */
    run("phi", 2, 0, "allgather", true, 0);
    run("phi", 0, 2, NULL, false, 0);
    /* GPT-NeoX's per-head query_key_value cut by heads, parallel attention and MLP from two LayerNorms */
    run("gpt_neox", 2, 0, "allgather", true, 0);
    run("gpt_neox", 0, 2, NULL, false, 0);
    /* StableLM's per-head q/k LayerNorms (each tp rank normalizes its heads with their own norms, their
     * gradients summed over tp and cp), q/k/v biases, partial RoPE at the chunks' global positions */
    CFG.qk_layernorm = true;
    run("stablelm", 2, 0, "allgather", false, 0);
    run("stablelm", 2, 0, "alltoall", true, 0);
    CFG.qk_layernorm = false;
    /* experts: each rank routes its sequence chunks' tokens, its tp group the same ones */
    run("mixtral", 2, 0, "allgather", true, 0);
    run("qwen3_moe", 0, 2, NULL, false, 0);
    /* with a data-parallel dimension: dp_shard 2 x cp 2 x tp 2 on 8 processes, DDP over dp_shard x cp */
    run_on(8, "llama", 2, 0, "alltoall", true, 0);
    for (int zero = 1; zero <= 3; zero++) run("llama", 2, 0, zero == 2 ? "alltoall" : "allgather", zero == 3, zero);
    return check_summary();
}
