/* Metrics across processes (run plainly, under `accel launch --num_processes 2`, and on 4
 * processes with tensor parallelism 2: two data-parallel ranks):
 * gather_for_metrics_n of predictions and labels in one call, with the
 * remainder of an uneven last batch dropped as gather_for_metrics does, and
 * accuracy counted with argmax/eq/sum and reduce_scalar. */
#include <math.h>

#include "accel/accel.h"
#include "accel/accelerator.h"
#include "check.h"

static accel_accelerator *A;
static int N, R;

/* Sample i: logits [3] whose argmax is i % 3, label i % 3 except every 4th
 * sample (label (i + 1) % 3); the id i itself as an i64 field. */
static accel_dataset *metrics_dataset(int64_t n, int64_t *n_correct) {
    float *logits = calloc((size_t)n * 3, sizeof *logits);
    int64_t *labels = malloc((size_t)n * sizeof *labels), *ids = malloc((size_t)n * sizeof *ids);
    *n_correct = 0;
    for (int64_t i = 0; i < n; i++) {
        logits[i * 3 + i % 3] = 1.0f + (float)i;
        labels[i] = i % 4 == 0 ? (i + 1) % 3 : i % 3;
        ids[i] = i;
        *n_correct += i % 4 != 0;
    }
    accel_tensor *t[3] = {accel_from_floats(ACCEL_SHAPE(n, 3), logits), accel_from_data(ACCEL_I64, ACCEL_SHAPE(n), labels),
                          accel_from_data(ACCEL_I64, ACCEL_SHAPE(n), ids)};
    accel_dataset *ds = accel_tensor_dataset_new(3, t);
    free(logits);
    free(labels);
    free(ids);
    accel_step_reset();
    return ds;
}

/* One epoch of n samples in batches of bs: every sample gathered exactly
 * once, its logits and label rows kept together, the same rows as
 * gather_for_metrics of each tensor alone; the accuracy count agrees. */
static void metrics_epoch(int64_t n, int64_t bs) {
    int64_t want_correct;
    accel_dataset *ds = metrics_dataset(n, &want_correct);
    accel_dataloader_opts o = accel_dataloader_opts_default();
    o.batch_size = bs;
    accel_dataloader *dl = accel_dataloader_new(ds, &o);
    CHECK(accel_accelerator_prepare_dataloader(A, dl) == ACCEL_OK);
    int *seen = calloc((size_t)n, sizeof *seen);
    int64_t total = 0, correct_gathered = 0;
    double correct_local = 0;
    accel_batch b;
    while (accel_dataloader_next(dl, &b)) {
        accel_tensor *preds = accel_argmax(b.fields[0], -1, false);
        accel_tensor *out[3];
        CHECK(accel_accelerator_gather_for_metrics_n(A, 3, (accel_tensor *[]){preds, b.fields[1], b.fields[2]}, out) ==
              ACCEL_OK);
        if (!out[0]) break;
        accel_tensor *one = accel_accelerator_gather_for_metrics(A, b.fields[2]);
        CHECK(one && one->shape[0] == out[2]->shape[0]);
        CHECK(out[0]->dtype == ACCEL_I64 && out[1]->shape[0] == out[2]->shape[0] &&
              out[0]->shape[0] == out[2]->shape[0]);
        for (int64_t i = 0; i < out[2]->shape[0]; i++) {
            int64_t id = (int64_t)accel_get(out[2], &i);
            CHECK(one && accel_get(one, &i) == (double)id);
            CHECK(id >= 0 && id < n);
            if (id < 0 || id >= n) continue;
            seen[id]++;
            CHECK(accel_get(out[0], &i) == (double)(id % 3));
            CHECK(accel_get(out[1], &i) == (double)(id % 4 == 0 ? (id + 1) % 3 : id % 3));
        }
        total += out[2]->shape[0];
        correct_gathered += (int64_t)accel_item(accel_sum_all(accel_eq(out[0], out[1])));
        /* every rank's own count, before the gather (padding samples included) */
        correct_local += accel_item(accel_sum_all(accel_eq(preds, b.fields[1])));
        accel_step_reset();
    }
    CHECK_MSG(total == n, "n=%lld bs=%lld N=%d: gathered %lld", (long long)n, (long long)bs, N, (long long)total);
    int once = 1;
    for (int64_t i = 0; i < n; i++) once &= seen[i] == 1;
    CHECK(once);
    CHECK_MSG(correct_gathered == want_correct, "correct %lld, want %lld", (long long)correct_gathered,
              (long long)want_correct);
    /* reduce_scalar sums the ranks' counts: at least every real sample's (even_batches pads) */
    double all = accel_accelerator_reduce_scalar(A, correct_local, "sum");
    CHECK(all >= (double)want_correct && all == floor(all));
    CHECK_MSG(accel_accelerator_clear(A) == ACCEL_OK, "%s", accel_last_error());
    accel_dataloader_free(dl);
    accel_dataset_free(ds);
    free(seen);
    accel_step_reset();
}

static void test_gather_n_epochs(void) {
    metrics_epoch(8 * N, 4);      /* even: no remainder */
    metrics_epoch(10 * N + 1, 4); /* the last batch has a remainder to drop */
    metrics_epoch(3, 4);          /* smaller than one batch per rank */
}

static void test_gather_n_shapes(void) {
    /* 0-d tensors become 1-d; dtypes of every size travel in one buffer */
    accel_tensor *s = accel_full(ACCEL_F64, 0, NULL, R + 0.5);
    accel_tensor *m = accel_from_data(ACCEL_BF16, ACCEL_SHAPE(1, 2),
                                      (uint16_t[]){accel_f32_to_bf16((float)R), accel_f32_to_bf16(-1.0f)});
    accel_tensor *flag = accel_eq_scalar(accel_full(ACCEL_I32, ACCEL_SHAPE(3), R), 0);
    accel_tensor *out[3];
    CHECK(accel_accelerator_gather_for_metrics_n(A, 3, (accel_tensor *[]){s, m, flag}, out) == ACCEL_OK);
    CHECK(out[0] && out[0]->ndim == 1 && out[0]->shape[0] == N && out[0]->dtype == ACCEL_F64);
    CHECK(out[1] && out[1]->ndim == 2 && out[1]->shape[0] == N && out[1]->shape[1] == 2);
    CHECK(out[2] && out[2]->dtype == ACCEL_BOOL && out[2]->shape[0] == 3 * N);
    for (int64_t r = 0; out[2] && r < N; r++) {
        CHECK(accel_get(out[0], &r) == r + 0.5);
        CHECK(accel_get(out[1], (int64_t[]){r, 0}) == (double)r && accel_get(out[1], (int64_t[]){r, 1}) == -1.0);
        CHECK(accel_get(out[2], (int64_t[]){3 * r + 2}) == (r == 0));
    }
    CHECK(accel_accelerator_reduce_scalar(A, R + 1.0, "max") == N);
    CHECK(fabs(accel_accelerator_reduce_scalar(A, R + 1.0, "mean") - (N + 1) / 2.0) < 1e-12);
    accel_step_reset();
}

static void test_errors(void) {
    accel_tensor *t = accel_ones(ACCEL_F32, ACCEL_SHAPE(2));
    accel_tensor *out[2] = {t, t};
    CHECK(accel_accelerator_gather_for_metrics_n(A, 0, &t, out) == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "accel_accelerator_gather_for_metrics_n: needs n >= 1");
    CHECK(accel_accelerator_gather_for_metrics_n(A, 2, (accel_tensor *[]){t, NULL}, out) != ACCEL_OK);
    CHECK(out[0] == NULL && out[1] == NULL);
    CHECK(accel_accelerator_gather_for_metrics_n(NULL, 1, &t, out) == ACCEL_ERR_INVALID_ARG);
    CHECK(isnan(accel_accelerator_reduce_scalar(A, 1.0, "avg")));
    CHECK_STR_CONTAINS(accel_last_error(), "reduction must be \"sum\", \"mean\" or \"max\", got \"avg\"");
    CHECK(isnan(accel_accelerator_reduce_scalar(A, 1.0, NULL)));
    accel_clear_error();
    accel_step_reset();
}

int main(int argc, char **argv) {
    A = accel_accelerator_new(NULL);
    if (!A) {
        fprintf(stderr, "%s\n", accel_last_error());
        return 1;
    }
    /* under tensor parallelism (`accel launch --parallelism_config_tp_size`) the data-parallel
     * ranks: the tp ranks of one (innermost in the mesh) hold the same batch, gathered once */
    accel_pg *tp = accel_accelerator_tp_group(A);
    int tp_size = tp ? accel_pg_size(tp) : 1;
    CHECK_MSG(tp_size == (argc > 1 ? atoi(argv[1]) : 1), "tp_size %d, the command line says %s", tp_size,
              argc > 1 ? argv[1] : "1");
    N = accel_accelerator_num_processes(A) / tp_size;
    R = accel_accelerator_process_index(A) / tp_size;
    RUN(test_gather_n_epochs);
    RUN(test_gather_n_shapes);
    RUN(test_errors);
    accel_accelerator_free(A);
    accel_thread_cleanup();
    return check_summary();
}
