/* src/bigmodel/generate.c — greedy and sampled decoding over
 * accel_llama_forward with the KV cache (transformers' generate for one
 * sequence: temperature, top-k, top-p warpers in that order, then a draw). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "accel/autograd.h"
#include "accel/bigmodel.h"
#include "nn/arch.h"

typedef struct scored {
    float v;
    int64_t i;
} scored;

/* ascending by value, ties by index: a total order, so results never depend
 * on the sort's stability */
static int cmp_asc(const void *a, const void *b) {
    const scored *x = a, *y = b;
    if (x->v != y->v) return x->v < y->v ? -1 : 1;
    return x->i < y->i ? -1 : x->i > y->i;
}

static int64_t argmax(const float *l, int64_t n) {
    int64_t best = 0;
    for (int64_t i = 1; i < n; i++)
        if (l[i] > l[best]) best = i;
    return best;
}

/* transformers' warpers refuse these (TemperatureLogitsWarper, TopKLogitsWarper,
 * TopPLogitsWarper), naming the parameter; only sampling uses them. A zero
 * field means its default (docs/contract.md): temperature 1.0, top_p 1.0. */
static accel_status check_sampling(const accel_generate_opts *o, const char *op) {
    if (!o->do_sample) return ACCEL_OK;
    if (!(o->temperature >= 0))
        return accel_set_error(ACCEL_ERR_INVALID_ARG,
                               "%s: `temperature` (=%g) has to be a strictly positive float when sampling "
                               "(0: the default, 1.0)",
                               op, o->temperature);
    if (o->top_k < 0)
        return accel_set_error(ACCEL_ERR_INVALID_ARG,
                               "%s: `top_k` has to be a non-negative integer (0: off), but is %lld", op,
                               (long long)o->top_k);
    if (!(o->top_p >= 0 && o->top_p <= 1))
        return accel_set_error(ACCEL_ERR_INVALID_ARG,
                               "%s: `top_p` has to be a float in (0, 1] (0: the default, 1: off), but is %g", op,
                               o->top_p);
    return ACCEL_OK;
}

/* What NULL options mean: the zeroed struct (greedy, no new token). */
static const accel_generate_opts NULL_OPTS;

/* accel_generate_opts_check's checks, the errors naming op. */
static accel_status check_opts(const accel_generate_opts *o, int64_t n_prompt, const char *op) {
    if (o->max_new_tokens < 0 || o->max_new_tokens > INT64_MAX / 16 - (n_prompt > 0 ? n_prompt : 0))
        return accel_set_error(ACCEL_ERR_INVALID_ARG,
                               "%s: `max_new_tokens` (=%lld) has to be a non-negative integer whose "
                               "output buffer fits in memory",
                               op, (long long)o->max_new_tokens);
    return check_sampling(o, op);
}

accel_status accel_generate_opts_check(const accel_generate_opts *o, int64_t n_prompt) {
    return check_opts(o ? o : &NULL_OPTS, n_prompt, "accel_generate");
}

/* One token from host logits[n] (modified in place by the warpers). */
static int64_t sample_host(float *logits, int64_t n, const accel_generate_opts *o, accel_rng *rng) {
    if (!o || !o->do_sample) return argmax(logits, n);
    if (!rng) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_sample_logits: sampling needs a generator");
        return -1;
    }
    if (o->temperature > 0 && o->temperature != 1.0)
        for (int64_t i = 0; i < n; i++) logits[i] = (float)(logits[i] / o->temperature);
    /* torch.multinomial raises on such probabilities; every comparison with
     * NaN being false, the draw below returned the last id. (-inf: a token
     * filtered out, as the warpers write it; not all of them.) */
    bool any_finite = false;
    for (int64_t i = 0; i < n; i++) {
        if (isnan(logits[i]) || logits[i] == INFINITY) {
            accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_sample_logits: logit %lld is %g: cannot sample from logits "
                            "holding NaN or +inf (a diverged model, or a temperature that overflows them?)",
                            (long long)i, (double)logits[i]);
            return -1;
        }
        any_finite |= logits[i] > -INFINITY;
    }
    if (!any_finite) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_sample_logits: every logit is -inf: no token to sample");
        return -1;
    }
    bool top_k = o->top_k > 0 && o->top_k < n, top_p = o->top_p > 0 && o->top_p < 1;
    if (top_k || top_p) {
        scored *s = accel_malloc(sizeof *s * (size_t)n);
        if (!s) {
            accel_set_error(ACCEL_ERR_OOM, "accel_sample_logits: out of memory");
            return -1;
        }
        for (int64_t i = 0; i < n; i++) s[i] = (scored){logits[i], i};
        qsort(s, (size_t)n, sizeof *s, cmp_asc);
        int64_t first = 0; /* s[first..n) survive */
        if (top_k) {
            /* TopKLogitsWarper: remove logits < the k-th largest (ties kept) */
            float kth = s[n - o->top_k].v;
            while (first < n && s[first].v < kth) first++;
        }
        if (top_p) {
            /* TopPLogitsWarper: softmax over the survivors, ascending cumulative
             * sum; remove while cum <= 1 - top_p, always keeping the largest. */
            double mx = s[n - 1].v, z = 0;
            for (int64_t i = first; i < n; i++) z += exp((double)s[i].v - mx);
            double cum = 0;
            int64_t cut = first;
            for (int64_t i = first; i < n - 1; i++) {
                cum += exp((double)s[i].v - mx) / z;
                if (cum <= 1.0 - o->top_p) cut = i + 1;
                else break;
            }
            first = cut;
        }
        for (int64_t i = 0; i < first; i++) logits[s[i].i] = -INFINITY;
        accel_free(s);
    }
    int64_t best = argmax(logits, n);
    double mx = logits[best], z = 0;
    for (int64_t i = 0; i < n; i++) z += exp((double)logits[i] - mx);
    double u = accel_rng_next_double(rng) * z, cum = 0;
    int64_t last = best;
    for (int64_t i = 0; i < n; i++) {
        double p = exp((double)logits[i] - mx);
        if (p <= 0) continue;
        cum += p;
        last = i;
        if (u < cum) return i;
    }
    return last; /* rounding at the top end */
}

int64_t accel_sample_logits(const accel_tensor *logits, const accel_generate_opts *o, accel_rng *rng) {
    if (!accel_tensor_check(logits, "accel_sample_logits", "logits")) return -1;
    int64_t n = accel_numel(logits);
    if (logits->ndim != 1 || n <= 0) {
        char b[64];
        accel_set_error(ACCEL_ERR_SHAPE, "accel_sample_logits: logits of shape %s, expected one non-empty row [V]",
                        accel_shape_str(logits, b, sizeof b));
        return -1;
    }
    if (o && check_sampling(o, "accel_sample_logits")) return -1;
    float *host = accel_malloc(sizeof(float) * (size_t)n);
    if (!host) return -1;
    int64_t tok = accel_to_floats(logits, host) == ACCEL_OK ? sample_host(host, n, o, rng) : -1;
    accel_free(host);
    return tok;
}

/* Logits of the last position of y [1, T, V] (T = 1: the head ran on the
 * last position alone) as a [V] view (on y's device). */
static accel_tensor *last_logits(accel_tensor *y, int64_t vocab) {
    if (y->ndim != 3 || y->shape[0] != 1 || y->shape[2] != vocab) {
        char b[64];
        accel_set_error(ACCEL_ERR_SHAPE, "accel_generate: logits of shape %s, expected [1, T, %lld]",
                        accel_shape_str(y, b, sizeof b), (long long)vocab);
        return NULL;
    }
    accel_tensor *row = accel_slice(y, 1, y->shape[1] - 1, y->shape[1], 1);
    return row ? accel_reshape(row, 1, &vocab) : NULL;
}

/* The device the prompt's ids go to: the model's first parameter's (the
 * embedding), or the cpu when it is offloaded (the dispatch hooks then move
 * the ids to where the embedding runs). */
static accel_device ids_device(accel_module *llama) {
    accel_tensor **ps;
    int n = accel_module_parameters(llama, &ps);
    accel_device dev = n > 0 && ps[0]->device.type != ACCEL_DEV_META ? ps[0]->device : ACCEL_CPU_DEVICE;
    if (n >= 0) accel_free(ps);
    return dev;
}

/* ids [1, n] on dev. */
static accel_tensor *ids_tensor(const int64_t *ids, int64_t n, accel_device dev) {
    accel_tensor *t = accel_empty_on(ACCEL_I64, ACCEL_SHAPE(1, n), dev);
    return t && accel_tensor_from_host(t, ids) == ACCEL_OK ? t : NULL;
}

/* One forward step: the last position's logits into buf[vocab] (and into
 * opts->prompt_logits on the first step). */
static accel_status step_logits(accel_module *llama, accel_tensor *ids, accel_kv_cache *cache, int64_t vocab,
                                const accel_generate_opts *opts, bool first, float *buf) {
    accel_tensor *y = ids ? accel__llama_forward_last(llama, &(accel_llama_inputs){.ids = ids, .cache = cache}, NULL)
                          : NULL;
    accel_tensor *row = y ? last_logits(y, vocab) : NULL;
    if (!row) return accel_last_status();
    /* [V] into the caller's tensor of V elements, any shape (checked contiguous: a view of it) */
    if (first && opts->prompt_logits && accel_copy_(accel_reshape(opts->prompt_logits, 1, &vocab), row) != ACCEL_OK)
        return accel_last_status();
    return accel_to_floats(row, buf);
}

/* Whether the next step, which brings the sequence to n tokens, re-runs it
 * whole: the family's generation does when the sequence first runs past
 * longrope's original_max_position_embeddings (arch.h: longrope_regenerate). */
static bool regenerate_past(const accel_llama_config *c, const accel__arch *a, const accel_kv_cache *cache,
                            int64_t n) {
    int64_t orig = c->rope_scaling.original_max_position_embeddings;
    if (!orig) orig = c->max_position_embeddings;
    return a && a->longrope_regenerate && c->rope_scaling.type == ACCEL_ROPE_LONGROPE && n > orig &&
           accel_kv_cache_len(cache) <= orig;
}

accel_status accel_generate(accel_module *llama, const int64_t *prompt, int64_t n_prompt,
                            const accel_generate_opts *opts, int64_t *out, int64_t *n_out) {
    if (!opts) opts = &NULL_OPTS;
    if (!llama) /* a failed load's NULL: its error is the cause */
        return accel_propagate_error(ACCEL_ERR_INVALID_ARG, "accel_generate: the model is NULL");
    if (!prompt || n_prompt <= 0 || !out || !n_out)
        return accel_set_error(ACCEL_ERR_INVALID_ARG,
                               "accel_generate: needs a model, a non-empty prompt, out and n_out");
    if (accel_generate_opts_check(opts, n_prompt)) return accel_last_status();
    const accel_llama_config *cfg = accel_llama_config_of(llama);
    if (!cfg) return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_generate: the model is not a Llama model");
    int64_t vocab = cfg->vocab_size;
    for (int64_t i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= vocab)
            return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_generate: prompt id %lld at %lld is outside [0, %lld)",
                                   (long long)prompt[i], (long long)i, (long long)vocab);
    memcpy(out, prompt, sizeof *out * (size_t)n_prompt);
    *n_out = n_prompt;
    const accel_tensor *pl = opts->prompt_logits;
    if (pl && !accel_tensor_check(pl, "accel_generate", "prompt_logits")) return accel_last_status();
    /* an integer one took the logits truncated, silently; [8, 8] for 64 failed in accel_copy_ after the forward */
    if (pl && (accel_numel(pl) != vocab || !accel_dtype_is_float(pl->dtype) || !accel_is_contiguous(pl))) {
        char b[64];
        return accel_set_error(ACCEL_ERR_SHAPE, "accel_generate: prompt_logits %s %s%s: expected a contiguous float "
                               "tensor of %lld elements", accel_dtype_name(pl->dtype), accel_shape_str(pl, b, sizeof b),
                               accel_is_contiguous(pl) ? "" : " (not contiguous)", (long long)vocab);
    }
    accel_device dev = ids_device(llama);
    accel_kv_cache *cache = accel_llama_kv_cache_new(llama, 1, n_prompt + opts->max_new_tokens, dev);
    float *buf = accel_malloc(sizeof(float) * (size_t)vocab);
    if (!cache || !buf) {
        accel_kv_cache_free(cache);
        accel_free(buf);
        return accel_last_status();
    }
    accel_rng rng;
    accel_rng_init(&rng, opts->seed);
    accel_status st = ACCEL_OK;
    bool grad = accel_set_grad_enabled(false); /* inference: no tape */
    accel_tensor *ids = ids_tensor(prompt, n_prompt, dev);
    for (int64_t step = 0; st == ACCEL_OK; step++) {
        st = step_logits(llama, ids, cache, vocab, opts, step == 0, buf);
        accel_step_reset();
        if (st != ACCEL_OK || step == opts->max_new_tokens) break;
        int64_t tok = sample_host(buf, vocab, opts, &rng);
        if (tok < 0) {
            st = accel_last_status();
            break;
        }
        out[(*n_out)++] = tok;
        if ((opts->has_eos && tok == opts->eos_token_id) || step + 1 == opts->max_new_tokens) break;
        if (regenerate_past(cfg, accel__arch_of_module(llama), cache, *n_out)) {
            accel_kv_cache_reset(cache); /* every key again, with the long factors */
            ids = ids_tensor(out, *n_out, dev);
        } else
            ids = ids_tensor(&tok, 1, dev);
    }
    accel_set_grad_enabled(grad);
    accel_kv_cache_free(cache);
    accel_free(buf);
    return st;
}

/* ---- batches (transformers' generate on a left-padded batch) */

/* The state of a batch's generation: host buffers of row stride W = T +
 * max_new_tokens, the sequence so far [0, len) in each row. */
typedef struct batch_run {
    int64_t B, W, len;
    int64_t *ids, *mask, *pos; /* [B, W] each: tokens, attention_mask, position ids */
} batch_run;

/* Columns [c0, len) of `from` [B, W] as host [B, len - c0] (step arena). */
static int64_t *columns(const batch_run *r, const int64_t *from, int64_t c0) {
    int64_t n = r->len - c0;
    int64_t *h = accel_arena_alloc(accel_step_arena(), (size_t)(r->B * n) * sizeof *h, 64);
    for (int64_t b = 0; h && b < r->B; b++) memcpy(h + b * n, from + b * r->W + c0, (size_t)n * sizeof *h);
    return h;
}

/* One forward of the columns [c0, len) (the whole mask), the last
 * position's logits of every row into buf [B, vocab]. The ids go to dev;
 * the mask and positions stay on the host (accel__pad_host), where the
 * forward reads them. */
static accel_status batch_step(accel_module *llama, const batch_run *r, int64_t c0, accel_kv_cache *cache,
                               int64_t vocab, accel_device dev, float *buf) {
    /* the forward reads B x (cache length + columns) mask entries from the host, unchecked: they are
     * r->mask's [0, len) only where the cache holds exactly the columns before c0 */
    if ((cache ? accel_kv_cache_len(cache) : 0) != c0)
        return accel_set_error(ACCEL_ERR_STATE, "accel_generate_batch: the cache holds %lld positions, the step "
                               "starts at %lld", (long long)(cache ? accel_kv_cache_len(cache) : 0), (long long)c0);
    const int64_t *ids = columns(r, r->ids, c0);
    accel__pad_host hp = {.mask = columns(r, r->mask, 0), .positions = columns(r, r->pos, c0)};
    accel_llama_inputs in = {.ids = ids ? accel_empty_on(ACCEL_I64, ACCEL_SHAPE(r->B, r->len - c0), dev) : NULL,
                             .cache = cache};
    if (!in.ids || !hp.mask || !hp.positions || accel_tensor_from_host(in.ids, ids) != ACCEL_OK)
        return accel_last_status();
    accel_tensor *y = accel__llama_forward_last(llama, &in, &hp);
    if (!y) return accel_last_status();
    if (y->ndim != 3 || y->shape[0] != r->B || y->shape[1] != 1 || y->shape[2] != vocab) {
        char b[64];
        return accel_set_error(ACCEL_ERR_SHAPE, "accel_generate_batch: logits of shape %s, expected [%lld, 1, %lld]",
                               accel_shape_str(y, b, sizeof b), (long long)r->B, (long long)vocab);
    }
    return accel_to_floats(y, buf);
}

/* ids and attention_mask [B, T] checked: ids in the vocabulary, the mask 0/1,
 * every row with a token, and left-padded (its last column 1). */
static accel_status check_batch(const int64_t *ids, const int64_t *mask, int64_t B, int64_t T, int64_t vocab) {
    for (int64_t b = 0; b < B; b++) {
        int64_t ones = 0;
        for (int64_t t = 0; t < T; t++) {
            int64_t id = ids[b * T + t], m = mask[b * T + t];
            if (m != 0 && m != 1)
                return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_generate_batch: attention_mask[%lld][%lld] is "
                                       "%lld: it must hold 0 (a pad) or 1", (long long)b, (long long)t, (long long)m);
            if (id < 0 || id >= vocab) /* a pad's too: every column goes through the embedding */
                return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_generate_batch: ids[%lld][%lld] is %lld, "
                                       "outside [0, %lld)%s", (long long)b, (long long)t, (long long)id,
                                       (long long)vocab, m ? "" : " (a pad's id is embedded too: give the pad's)");
            ones += m;
        }
        if (!ones)
            return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_generate_batch: row %lld of attention_mask has no 1: "
                                   "an empty prompt", (long long)b);
        /* right padding: the new token would follow a pad, in a position the
         * prompt's tokens never reached (transformers only warns) */
        if (!mask[b * T + T - 1])
            return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_generate_batch: row %lld ends in a pad: decoder-only "
                                   "generation needs left padding (tokenizer padding_side=\"left\")", (long long)b);
    }
    return ACCEL_OK;
}

accel_status accel_generate_batch(accel_module *llama, const int64_t *ids, const int64_t *attention_mask, int64_t B,
                                  int64_t T, const accel_generate_opts *opts, int64_t *out, int64_t *n_cols) {
    if (!opts) opts = &NULL_OPTS;
    if (!llama) /* a failed load's NULL: its error is the cause */
        return accel_propagate_error(ACCEL_ERR_INVALID_ARG, "accel_generate_batch: the model is NULL");
    if (!ids || !attention_mask || B <= 0 || T <= 0 || !out || !n_cols)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_generate_batch: needs a model, ids and attention_mask "
                               "[B > 0, T > 0], out and n_cols");
    /* the options' own errors name the option (a NaN temperature is no size) */
    bool fits = B <= INT64_MAX / 16 / T;
    if (fits && check_opts(opts, B * T, "accel_generate_batch")) return accel_last_status();
    if (!fits || opts->max_new_tokens > (INT64_MAX / 16 - B * T) / B)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_generate_batch: %lld rows of %lld ids and "
                               "`max_new_tokens` (=%lld): out would not fit in memory", (long long)B, (long long)T,
                               (long long)opts->max_new_tokens);
    if (opts->prompt_logits) /* one prompt's row: the option would be ignored for a batch */
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_generate_batch: prompt_logits takes one prompt's logits "
                               "(accel_generate); a batch has no such option");
    const accel_llama_config *cfg = accel_llama_config_of(llama);
    if (!cfg) return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_generate_batch: the model is not a Llama model");
    int64_t vocab = cfg->vocab_size;
    if (check_batch(ids, attention_mask, B, T, vocab)) return accel_last_status();
    /* transformers: a finished row's next tokens are pad_token_id, eos's first id where it has none */
    int64_t pad = opts->has_pad ? opts->pad_token_id : opts->eos_token_id;
    if (opts->has_eos && (pad < 0 || pad >= vocab)) /* fed back as a finished row's next id */
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel_generate_batch: %s %lld is outside the vocabulary [0, %lld)",
                               opts->has_pad ? "pad_token_id" : "eos_token_id (the pad: no pad_token_id)",
                               (long long)pad, (long long)vocab);
    batch_run r = {.B = B, .W = T + opts->max_new_tokens, .len = T};
    size_t cells = (size_t)(B * r.W);
    r.ids = accel_malloc(cells * sizeof *r.ids);
    r.mask = accel_malloc(cells * sizeof *r.mask);
    r.pos = accel_malloc(cells * sizeof *r.pos);
    bool *done = accel_calloc((size_t)B, sizeof *done);
    float *buf = accel_malloc(sizeof(float) * (size_t)(B * vocab));
    accel_device dev = ids_device(llama);
    accel_kv_cache *cache = r.ids && r.mask && r.pos && done && buf ? accel_llama_kv_cache_new(llama, B, r.W, dev)
                                                                    : NULL;
    accel_status st = cache ? ACCEL_OK : accel_last_status();
    /* transformers' generate: position ids = attention_mask.cumsum(-1) - 1, 0 at the pads */
    for (int64_t b = 0; st == ACCEL_OK && b < B; b++)
        for (int64_t t = 0, seen = 0; t < T; t++) {
            int64_t i = b * r.W + t, m = attention_mask[b * T + t];
            r.ids[i] = ids[b * T + t];
            r.mask[i] = m;
            seen += m;
            r.pos[i] = m ? seen - 1 : 0;
        }
    accel_rng rng;
    accel_rng_init(&rng, opts->seed);
    bool grad = accel_set_grad_enabled(false); /* inference: no tape */
    int64_t c0 = 0; /* the first column the next forward runs: 0, or the last one's */
    for (int64_t step = 0; st == ACCEL_OK && step < opts->max_new_tokens; step++) {
        st = batch_step(llama, &r, c0, cache, vocab, dev, buf);
        accel_step_reset();
        /* one draw a row, in row order, finished rows too (their token is
         * then the pad): a row's draws never depend on when the others end */
        bool all_done = true;
        for (int64_t b = 0; st == ACCEL_OK && b < B; b++) {
            int64_t tok = sample_host(buf + b * vocab, vocab, opts, &rng), i = b * r.W + r.len;
            if (tok < 0) {
                st = accel_last_status();
                break;
            }
            if (done[b]) tok = pad;
            r.ids[i] = tok;
            r.mask[i] = 1;
            r.pos[i] = r.pos[i - 1] + 1;
            done[b] |= opts->has_eos && tok == opts->eos_token_id;
            all_done &= done[b];
        }
        if (st != ACCEL_OK) break;
        c0 = r.len++;
        if (all_done) break;
        if (regenerate_past(cfg, accel__arch_of_module(llama), cache, r.len)) {
            accel_kv_cache_reset(cache); /* every key again, with the long factors */
            c0 = 0;
        }
    }
    accel_set_grad_enabled(grad);
    if (st == ACCEL_OK) {
        *n_cols = r.len;
        for (int64_t b = 0; b < B; b++) memcpy(out + b * r.len, r.ids + b * r.W, (size_t)r.len * sizeof *out);
    }
    accel_kv_cache_free(cache);
    accel_free(r.ids);
    accel_free(r.mask);
    accel_free(r.pos);
    accel_free(done);
    accel_free(buf);
    return st;
}
