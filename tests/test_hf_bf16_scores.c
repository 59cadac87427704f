/* Decoders under a bf16 autocast where their attention takes explicit
 * scores, against transformers under torch.autocast("cpu", bfloat16) with
 * its default attention (tools/gen_hf_bf16_scores_fixtures.py,
 * tests/data/hf_bf16_scores/): Mistral (windows of 8 over 20 positions),
 * Phi (attention dropout while training) and Gemma2 (soft-capping, a
 * window), their query and key projections scaled so that the scores are a
 * few units large, on a left-padded batch whose mask has holes (no fused
 * kernel's key range takes it). transformers' default attention is SDPA
 * (bf16 computed in f32) for Mistral and Phi, eager (scores rounded to
 * bf16) for Gemma2. Errors relative, in 2-norms over a tensor: accel's
 * logits at the mask's ones within LOGITS_TOL of transformers', and the
 * fixture's other rounding (eager for Mistral and Phi, eager in f32 for
 * Gemma2) farther than OTHER_MIN from them, so the check tells the two
 * apart. The loss and gradients of a training model (every dropout off
 * but the attention's, at 1e-30: nothing dropped, the explicit scores
 * taken) within LOSS_TOL and each name's gradient tolerance. Measured
 * (mistral, phi, gemma2): logits 0.62%, 0.86%, 1.00% from transformers',
 * the other rounding 1.93%, 1.48%, 1.39%; losses within 5e-4; the
 * gradients within 0.83%, 3.4%, 7.3% (the worst tensor). Each tolerance
 * sits between the two (gradients: 1.5 times the measured). BERT likewise
 * (test_bert: its encoder's output; its attention is SDPA in transformers). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "accel/bert.h"
#include "accel/bigmodel.h"
#include "nn/arch.h"
#include "hf_load.h"
#include "nn_fixture.h"

typedef struct named {
    const char *name;
    double logits_tol, grad_tol; /* the other rounding's logits farther than logits_tol * OTHER_MARGIN */
} named;

static const named NAMES[] = {{"mistral", 0.010, 0.015}, {"phi", 0.0115, 0.06}, {"gemma2", 0.012, 0.11}};
enum { B = 3, T = 20 };
#define OTHER_MARGIN 1.1
#define LOSS_TOL 1e-3
#define BERT_TOL 0.007
#define ATTN_P 1e-30

/* ||got - want|| / ||want|| (2-norms) over the fixture tensor key (got: its rows when rows, [B T, V] ->
 * [n, V]): one rounding that flips between two implementations moves single elements by an ulp, and
 * elementwise bounds near 0 mean nothing in bf16 (tests/test_llama_autocast.c measures alike). */
static double rel_err(accel_safetensors *st, const char *key, accel_tensor *got, const int64_t *rows) {
    accel_tensor *want = accel_safetensors_tensor(st, key, ACCEL_F32);
    if (!want || !got) {
        accel_tensor_free(want);
        return INFINITY;
    }
    int64_t n = accel_numel(want), all = accel_numel(got), V = rows ? want->shape[1] : 1;
    float *g = malloc(sizeof(float) * (size_t)all);
    accel_to_floats(got, g);
    const float *w = want->data;
    double diff = rows || all == n ? 0 : INFINITY, norm = 0;
    for (int64_t i = 0; i < n; i++) {
        double gi = rows ? g[rows[i / V] * V + i % V] : g[i];
        diff += (gi - w[i]) * (gi - w[i]);
        norm += (double)w[i] * w[i];
    }
    free(g);
    accel_tensor_free(want);
    return isfinite(diff) ? sqrt(diff / fmax(norm, 1e-300)) : INFINITY;
}

static accel_module *load(const char *dir, accel_llama_config *c, bool train) {
    if (accel_llama_config_load(dir, c) != ACCEL_OK) return NULL;
    if (train && accel__arch_find(c->model_type)->dropouts) c->attn_pdrop = ATTN_P, c->resid_pdrop = c->embd_pdrop = 0;
    return hf_load_as(dir, c, train);
}

/* The logits at the mask's ones against transformers' and the other rounding. */
static void check_logits(const named *nm, const char *dir, accel_safetensors *st, accel_llama_inputs *in,
                         const int64_t *rows) {
    const char *name = nm->name;
    accel_llama_config c;
    accel_module *m = load(dir, &c, false);
    CHECK_MSG(m != NULL, "%s: %s", name, accel_last_error());
    if (!m) return;
    accel_dtype prev = accel_autocast_begin(ACCEL_BF16);
    accel_tensor *logits = accel_llama_forward_ex(m, in);
    accel_autocast_end(prev);
    CHECK_MSG(logits != NULL, "%s: %s", name, accel_last_error());
    double d = rel_err(st, "logits", logits, rows), other = rel_err(st, "other", logits, rows);
    printf("%s: logits %.3g from transformers' (the other rounding %.3g)\n", name, d, other);
    CHECK_MSG(d <= nm->logits_tol, "%s: the bf16 logits %.3g from transformers' (tolerance %g)", name, d,
              nm->logits_tol);
    CHECK_MSG(other > OTHER_MARGIN * nm->logits_tol, "%s: the other rounding's logits only %.3g away", name, other);
    accel_step_reset();
    accel_module_free(m);
}

/* The training loss and every gradient under the bf16 autocast. */
static void check_training(const char *name, const char *dir, accel_safetensors *st, accel_llama_inputs *in,
                           double grad_tol) {
    accel_llama_config c;
    accel_module *m = load(dir, &c, true);
    CHECK_MSG(m != NULL, "%s: %s", name, accel_last_error());
    if (!m) return;
    accel_dtype prev = accel_autocast_begin(ACCEL_BF16);
    accel_tensor *loss = accel_llama_loss_ex(m, in);
    accel_status st_bwd = loss ? accel_backward(loss) : accel_last_status();
    accel_autocast_end(prev);
    CHECK_MSG(loss && st_bwd == ACCEL_OK, "%s: %s", name, accel_last_error());
    double dl = rel_err(st, "loss", loss, NULL), worst = 0;
    CHECK_MSG(dl <= LOSS_TOL, "%s: the loss %.3g from transformers'", name, dl);
    accel_state_dict *sd = accel_module_state_dict(m);
    char key[200];
    for (int i = 0; loss && i < sd->n; i++) {
        if (sd->entries[i].is_tied_alias) continue;
        snprintf(key, sizeof key, "g.%s", sd->entries[i].name);
        double d = rel_err(st, key, sd->entries[i].t->grad, NULL);
        worst = fmax(worst, d);
        CHECK_MSG(d <= grad_tol, "%s: %s %.3g from transformers'", name, key, d);
    }
    printf("%s: training loss %.3g from transformers', gradients within %.3g\n", name, dl, worst);
    accel_state_dict_free(sd);
    accel_step_reset();
    accel_module_free(m);
}

static void test_against_transformers(void) {
    for (size_t i = 0; i < sizeof NAMES / sizeof *NAMES; i++) {
        char dir[256], path[300];
        const char *name = NAMES[i].name;
        snprintf(dir, sizeof dir, "data/hf_bf16_scores/%s", name);
        snprintf(path, sizeof path, "%s.safetensors", dir);
        accel_safetensors *st = accel_safetensors_open(path);
        CHECK_MSG(st != NULL, "%s: %s", path, accel_last_error());
        if (!st) continue;
        accel_tensor *ids = accel_safetensors_tensor(st, "ids", -1), *mask = accel_safetensors_tensor(st, "mask", -1),
                     *rows = accel_safetensors_tensor(st, "rows", -1);
        CHECK(ids && mask && rows && ids->shape[0] == B && ids->shape[1] == T);
        if (ids && mask && rows) {
            accel_llama_inputs in = {.ids = ids, .attention_mask = mask};
            check_logits(&NAMES[i], dir, st, &in, rows->data);
            check_training(name, dir, st, &in, NAMES[i].grad_tol);
        }
        accel_tensor_free(ids), accel_tensor_free(mask), accel_tensor_free(rows);
        accel_safetensors_close(st);
    }
}

/* BERT (its attention always explicit scores; SDPA in transformers): the
 * last hidden state at the mask's ones under the bf16 autocast within
 * BERT_TOL of transformers' (measured 0.34%), its eager attention's 1.15%
 * away. */
static void test_bert(void) {
    accel_safetensors *st = accel_safetensors_open("data/hf_bf16_scores/bert.safetensors");
    accel_module *m = accel_bert_from_pretrained("data/hf_bf16_scores/bert", ACCEL_CPU_DEVICE);
    CHECK_MSG(st && m, "%s", accel_last_error());
    if (!st || !m) {
        accel_safetensors_close(st);
        accel_module_free(m);
        return;
    }
    accel_module_train(m, false);
    accel_tensor *ids = accel_safetensors_tensor(st, "ids", -1), *mask = accel_safetensors_tensor(st, "mask", -1),
                 *rows = accel_safetensors_tensor(st, "rows", -1);
    CHECK(ids && mask && rows);
    accel_dtype prev = accel_autocast_begin(ACCEL_BF16);
    accel_tensor *h = ids && mask && rows ? accel_bert_encode(m, ids, NULL, mask, NULL) : NULL;
    accel_autocast_end(prev);
    CHECK_MSG(h != NULL, "bert: %s", accel_last_error());
    const int64_t *r = rows ? rows->data : NULL;
    double d = rel_err(st, "hidden", h, r), other = rel_err(st, "other", h, r);
    printf("bert: hidden state %.3g from transformers' (eager's %.3g)\n", d, other);
    CHECK_MSG(d <= BERT_TOL, "bert: the bf16 hidden state %.3g from transformers' (tolerance %g)", d, BERT_TOL);
    CHECK_MSG(other > OTHER_MARGIN * BERT_TOL, "bert: eager's hidden state only %.3g away", other);
    accel_step_reset();
    accel_tensor_free(ids), accel_tensor_free(mask), accel_tensor_free(rows);
    accel_module_free(m);
    accel_safetensors_close(st);
}

int main(void) {
    RUN(test_against_transformers);
    RUN(test_bert);
    return check_summary();
}
