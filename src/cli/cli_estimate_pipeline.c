/* src/cli/cli_estimate_pipeline.c — `accel estimate-memory --pp_size P
 * --batch_size B --seq_len T`: each pipeline stage's memory as the runtime
 * lays it out (accelerator/pipeline.c; docs/bigmodel.md "Per mesh").
 *
 * A stage's parameters are those the runtime keeps on it: the model cut into
 * P x V chunks (the balanced split, or under interleaved 1F1B equal chunks),
 * chunk c on stage c mod P, each state-dict entry on the stage of the family's
 * owner of it, and a tied lm_head on the last stage too. Its gradients and
 * Adam state follow from the strategy over its dp_shard ranks
 * (accel_rank_memory_estimate). What its schedule holds between a
 * micro-batch's forward and backward is the micro-batch's input hidden
 * states [B / M, T, C] (the runtime recomputes the forward in the backward):
 * 1F1B min(P - s, M) of them, GPipe M (stage 0 none: its input is the ids),
 * interleaved 1F1B the slots of the plan the runtime runs
 * (accelerator/pipeline_schedule.h: (P - s - 1) 2 + (V - 1) P + 1 chunk inputs
 * in flight, and the gradients that arrived for them) - what
 * accel_pipeline_report.peak_held_bytes measures. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "accel/bigmodel.h"
#include "accelerator/pipeline_schedule.h"
#include "bigmodel/mesh_memory.h"
#include "cli/cli.h"
#include "nn/family.h"

#define WHO "accel estimate-memory"

/* The stages' bytes of parameters, into bytes[0..pp); chunk layer ranges into first[0..pp v]. */
static accel_status stage_params(accel_module *m, const accel__family_stages *h, const cli_pipeline_request *q,
                                 int *first, int64_t *bytes) {
    int chunks = q->pp * q->virt, layers = h->n_layers(m, WHO);
    if (layers < 0) return accel_last_status();
    accel_status st;
    if (q->virt > 1) { /* equal chunks, as the runtime cuts them */
        if (layers % chunks)
            return accel_set_error(ACCEL_ERR_INVALID_ARG, "interleaved 1F1B cuts the model's %d layers into pp_size "
                                   "%d x pp_virtual_stages %d = %d chunks of as many layers: %d is not a multiple of "
                                   "%d", layers, q->pp, q->virt, chunks, layers, chunks);
        int counts[1024];
        if (chunks > 1024) return accel_set_error(ACCEL_ERR_INVALID_ARG, "%d chunks (at most 1024)", chunks);
        for (int c = 0; c < chunks; c++) counts[c] = layers / chunks;
        st = h->split(m, chunks, counts, first, "--pp_virtual_stages");
    } else {
        st = h->split(m, chunks, NULL, first, "--pp_size");
    }
    accel_state_dict *sd = st ? NULL : accel_module_state_dict(m);
    if (!sd) return accel_last_status();
    accel_tensor *tied = h->tied_embedding(m);
    for (int i = 0; i < sd->n; i++) {
        const accel_state_entry *e = &sd->entries[i];
        if (e->is_buffer || e->is_tied_alias) continue;
        int64_t b = accel__mesh_entry_bytes(e, q->cfg, q->tp); /* this tp rank's slice */
        if (b < 0) {
            accel_state_dict_free(sd);
            return accel_last_status();
        }
        bytes[h->owner(e->name, first, chunks) % q->pp] += b;
        if (e->t == tied) bytes[q->pp - 1] += b; /* the last stage's lm_head */
    }
    accel_state_dict_free(sd);
    return ACCEL_OK;
}

/* Stage s's micro-batch inputs in flight and the ones it holds (slots). */
static accel_status stage_inputs(const cli_pipeline_request *q, int s, int *in_flight, int *held) {
    if (q->virt > 1) {
        accel__pp_plan plan;
        if (accel__pp_interleaved_plan(q->pp, q->virt, q->micro, s, &plan)) return accel_last_status();
        *in_flight = plan.peak_in_flight;
        *held = plan.slots;
        accel_step_reset(); /* the plan's arrays */
        return ACCEL_OK;
    }
    *in_flight = q->gpipe || q->pp - s > q->micro ? q->micro : q->pp - s;
    *held = s ? *in_flight : 0;
    return ACCEL_OK;
}

/* "0-1, 4-5": the stage's chunks' layers. */
static void layers_str(const int *first, const cli_pipeline_request *q, int s, char *out, size_t n) {
    size_t at = 0;
    out[0] = 0;
    for (int c = s; c < q->pp * q->virt && at < n; c += q->pp)
        at += first[c + 1] - first[c] == 1
                  ? (size_t)snprintf(out + at, n - at, "%s%d", c == s ? "" : ", ", first[c])
                  : (size_t)snprintf(out + at, n - at, "%s%d-%d", c == s ? "" : ", ", first[c], first[c + 1] - 1);
    if (at >= n) snprintf(out, n, "%d chunks", q->virt);
}

/* The bytes of one micro-batch's hidden states [b, t, c], or -1 past 2^62:
 * the product of an absurd batch and sequence wrapped (to 0 bytes held, a
 * table of the weights alone). A stage holds at most 2^20 of them (the
 * micro-batches' cap): the caller checks their product (2^20 x 2^62 passes
 * 2^63), and accel_rank_memory_estimate bounds it with the rest. */
static int64_t micro_input_bytes(int64_t b, int64_t t, int64_t c, accel_dtype dt) {
    int64_t n;
    if (__builtin_mul_overflow(b, t, &n) || __builtin_mul_overflow(n, c, &n) ||
        __builtin_mul_overflow(n, (int64_t)accel_dtype_size(dt), &n) || n > (INT64_C(1) << 62))
        return -1;
    return n;
}

int cli_pipeline_table(FILE *out, accel_module *m, const cli_pipeline_request *q) {
    const accel__family *f = accel__family_of(m);
    if (!f || !f->stages) {
        fprintf(stderr, WHO ": error: pipeline stages cut the decoder families' models; this model is %s%s\n",
                f ? "of the family " : "of no family", f ? f->name : "");
        return 1;
    }
    if (q->batch % q->micro) {
        fprintf(stderr, WHO ": error: a batch of %lld rows does not split into %d micro-batches "
                        "(--num_micro_batches): make --batch_size a multiple of it\n", (long long)q->batch, q->micro);
        return 1;
    }
    int first[1025];
    int64_t bytes[1024] = {0}, C;
    accel_dtype dt;
    f->stages->hidden(m, &C, &dt);
    /* the hidden states between stages: a cp rank's T / cp positions (accelerator/pipeline.c: its chunks of
     * the ids), whole on every tp rank, or their 1 / tp under sequence parallelism */
    int64_t T = q->seq / q->cp / (q->sp ? q->tp : 1);
    int64_t micro_bytes = micro_input_bytes(q->batch / q->micro, T, C, dt);
    if (micro_bytes < 0) {
        fprintf(stderr, WHO ": error: a micro-batch's inputs [%lld, %lld, %lld] %s between the stages would take more "
                        "than 2^62 bytes (--batch_size %lld, --seq_len %lld)\n", (long long)(q->batch / q->micro),
                (long long)T, (long long)C, accel_dtype_name(dt), (long long)q->batch, (long long)q->seq);
        return 1;
    }
    if (q->pp * q->virt > 1024 || stage_params(m, f->stages, q, first, bytes)) {
        fprintf(stderr, WHO ": error: %s\n", q->pp * q->virt > 1024 ? "more than 1024 pipeline chunks"
                                                                    : accel_last_error());
        return 1;
    }
    enum { COLS = 8 };
    char (*rows)[CLI_TABLE_MAX_COLS][32] = malloc((size_t)q->pp * sizeof *rows); /* a row per stage, every one */
    if (!rows) {
        fprintf(stderr, WHO ": error: the table of %d stages: out of memory\n", q->pp);
        return 1;
    }
    int nr = 0;
    for (int s = 0; s < q->pp; s++) {
        accel_rank_memory r;
        int in_flight = 0, held = 0;
        int64_t held_bytes = 0;
        if (stage_inputs(q, s, &in_flight, &held) ||
            (__builtin_mul_overflow((int64_t)held, micro_bytes, &held_bytes) &&
             accel_set_error(ACCEL_ERR_INVALID_ARG, "stage %d's %d held micro-batch inputs of %lld bytes: more than "
                             "2^63 bytes", s, held, (long long)micro_bytes)) ||
            accel_rank_memory_estimate((accel_shard_strategy)q->strategy, bytes[s], 0, q->dp_shard, q->autocast,
                                       held_bytes, &r)) {
            fprintf(stderr, WHO ": error: %s\n", accel_last_error());
            free(rows);
            return 1;
        }
        char (*row)[32] = rows[nr++];
        snprintf(row[0], 32, "%d", s);
        layers_str(first, q, s, row[1], 32);
        cli_convert_bytes((double)r.weights, true, row[2], 32);
        cli_convert_bytes((double)r.grads, true, row[3], 32);
        cli_convert_bytes((double)r.optimizer, true, row[4], 32);
        snprintf(row[5], 32, "%d", in_flight);
        cli_convert_bytes((double)r.activations, true, row[6], 32);
        cli_convert_bytes((double)r.total, true, row[7], 32);
    }
    char title[256], virt[96] = "";
    int at = q->virt > 1 ? snprintf(virt, sizeof virt, " x %d virtual", q->virt) : 0;
    if (q->tp > 1)
        at += snprintf(virt + at, sizeof virt - (size_t)at, ", tp %d%s", q->tp, q->sp ? " sequence parallel" : "");
    if (q->cp > 1) snprintf(virt + at, sizeof virt - (size_t)at, ", cp %d", q->cp);
    snprintf(title, sizeof title, "Pipeline stages: pp %d%s, %d micro-batches of %lld x %lld (%s), %s over dp_shard%s "
             "%d, per rank", q->pp, virt, q->micro, (long long)(q->batch / q->micro), (long long)q->seq,
             q->virt > 1 ? "interleaved 1F1B" : q->gpipe ? "GPipe" : "1F1B",
             accel_shard_strategy_name((accel_shard_strategy)q->strategy), q->cp > 1 ? " x cp" : "", q->dp_shard);
    const char *head[COLS] = {"Stage", "Layers", "Weights", "Gradients", "Optimizer", "In flight", "Held inputs",
                              "Total"};
    cli_print_table(out, title, head, COLS, rows, nr);
    free(rows);
    fprintf(out, "Held inputs: each stage's saved micro-batch inputs [%lld, %lld, %lld] %s (%lld bytes each); the "
           "recompute of one micro-batch's chunk comes on top (docs/bigmodel.md \"Per mesh\")\n",
           (long long)(q->batch / q->micro), (long long)T, (long long)C,
           accel_dtype_name(dt), (long long)micro_bytes);
    return 0;
}
