/* bench_cp_memory: activation memory per rank of one Llama training step
 * (accel_llama_loss + accel_backward) with the sequence split over the ranks
 * of the job (context parallelism, include/accel/cp.h) against the same step
 * unsharded, as the step arena's high-water mark (where a cpu step's
 * activations and their gradients live).
 *
 *     bench_cp_memory [--seq T] [--strategy allgather|alltoall] [--layers L]
 *                     [--model_type llama|mistral|gemma2] [--window W]
 *     accel launch --num_processes 2 bench_cp_memory --seq 4096
 *
 * The model is the bench Llama's width (hidden 512, 8 heads, ffn 1536, vocab
 * 8192; docs/parallelism.md), batch 1; --model_type another family of that
 * width: mistral with a sliding window of W keys on every layer, gemma2 with
 * it on its even layers and Gemma-2's soft-capping (scores at 50, logits at
 * 30). One process: the unsharded step. N processes: cp = N, every rank
 * given the whole batch. Rank 0 prints
 *     cp=N strategy=S model=M window=W seq=T layers=L loss=... peak_bytes_rank0=... peak_bytes_max=... step_s=...
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "accel/accel.h"

int main(int argc, char **argv) {
    int64_t T = 4096;
    int64_t W = 0;
    int layers = 2;
    const char *family = "llama";
    accel_cp_strategy s = ACCEL_CP_ALLGATHER;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--seq")) T = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "--window")) W = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "--model_type")) family = argv[i + 1];
        else if (!strcmp(argv[i], "--layers")) layers = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--strategy")) s = strcmp(argv[i + 1], "alltoall") ? ACCEL_CP_ALLGATHER : ACCEL_CP_ALLTOALL;
        else {
            fprintf(stderr, "bench_cp_memory: unknown flag %s\n", argv[i]);
            return 2;
        }
    }
    if (accel_dist_init() != ACCEL_OK) {
        fprintf(stderr, "bench_cp_memory: %s\n", accel_last_error());
        return 1;
    }
    accel_pg *pg = accel_dist_default_group();
    int cp = accel_pg_size(pg);
    accel_manual_seed(1);
    accel_llama_config c = accel_llama_config_default();
    c.vocab_size = 8192, c.hidden_size = 512, c.intermediate_size = 1536, c.num_hidden_layers = layers;
    c.num_attention_heads = 8, c.num_key_value_heads = 8, c.max_position_embeddings = T;
    c.torch_dtype = ACCEL_F32;
    snprintf(c.model_type, sizeof c.model_type, "%s", family);
    c.sliding_window = W;
    if (!strcmp(family, "gemma2"))
        c.attn_logit_softcapping = 50, c.final_logit_softcapping = 30, c.query_pre_attn_scalar = 64;
    accel_module *m = accel_llama_new(&c, ACCEL_CPU_DEVICE);
    if (!m) {
        fprintf(stderr, "bench_cp_memory: %s\n", accel_last_error());
        return 1;
    }
    int64_t *ids = malloc((size_t)T * sizeof *ids);
    for (int64_t i = 0; i < T; i++) ids[i] = (i * 7919) % c.vocab_size;
    if (cp > 1 && accel_llama_context_parallelize(m, pg, s) != ACCEL_OK) {
        fprintf(stderr, "bench_cp_memory: %s\n", accel_last_error());
        return 1;
    }
    accel_step_reset();
    double t0 = accel_now_seconds();
    accel_tensor *l = accel_llama_loss(m, accel_from_data(ACCEL_I64, ACCEL_SHAPE(1, T), ids));
    if (!l || accel_backward(l) != ACCEL_OK) {
        fprintf(stderr, "bench_cp_memory: %s\n", accel_last_error());
        return 1;
    }
    double dt = accel_now_seconds() - t0;
    int64_t peak[1] = {(int64_t)accel_arena_peak(accel_step_arena())}, mine = peak[0];
    accel_pg_all_reduce(pg, peak, 1, ACCEL_I64, ACCEL_REDUCE_MAX);
    if (accel_pg_rank(pg) == 0)
        printf("cp=%d strategy=%s model=%s window=%lld seq=%lld layers=%d loss=%.6f peak_bytes_rank0=%lld "
               "peak_bytes_max=%lld step_s=%.2f\n", cp, cp == 1 ? "none" : s == ACCEL_CP_ALLGATHER ? "allgather" : "alltoall",
               family, (long long)W, (long long)T, layers, accel_item(l), (long long)mine, (long long)peak[0], dt);
    accel_step_reset();
    free(ids);
    accel_module_free(m);
    accel_dist_finalize();
    return 0;
}
