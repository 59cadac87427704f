/* RoPE inverse frequencies and attention scaling of each rope_scaling type,
 * as transformers' modeling_rope_utils computes them (the same f32 steps
 * where it works on f32 tensors), and the check of a config's fields. */
#include <math.h>

#include "arch.h"

/* 1 / base^(2i / dim) for i < dim / 2, rounded to f32 (transformers'
 * default inv_freq). */
static void default_freqs(double base, int64_t dim, float *inv) {
    for (int64_t i = 0; i < dim / 2; i++) inv[i] = (float)(1.0 / pow(base, (double)(2 * i) / (double)dim));
}

/* The pretraining length the scaled types correct from (transformers:
 * rope_parameters' original_max_position_embeddings, else max_position_embeddings). */
static double original_max(const accel_llama_config *c) {
    int64_t o = c->rope_scaling.original_max_position_embeddings;
    return (double)(o ? o : c->max_position_embeddings);
}

static double yarn_mscale(double scale, double m) { return scale <= 1 ? 1.0 : 0.1 * m * log(scale) + 1.0; }

/* transformers' find_correction_dim */
static double correction_dim(double rot, int64_t dim, double base, double max_pos) {
    return ((double)dim * log(max_pos / (rot * 2 * M_PI))) / (2 * log(base));
}

static double yarn(const accel_llama_config *c, int64_t dim, float *inv) {
    const accel_rope_scaling *r = &c->rope_scaling;
    double base = c->rope_theta, factor = r->factor, orig = original_max(c);
    double att = r->attention_factor;
    if (att == 0)
        att = r->mscale != 0 && r->mscale_all_dim != 0
                  ? yarn_mscale(factor, r->mscale) / yarn_mscale(factor, r->mscale_all_dim)
                  : yarn_mscale(factor, 1.0);
    double beta_fast = r->beta_fast != 0 ? r->beta_fast : 32, beta_slow = r->beta_slow != 0 ? r->beta_slow : 1;
    double low = correction_dim(beta_fast, dim, base, orig), high = correction_dim(beta_slow, dim, base, orig);
    if (!r->truncate_set || r->truncate) {
        low = floor(low);
        high = ceil(high);
    }
    if (low < 0) low = 0;
    if (high > (double)(dim - 1)) high = (double)(dim - 1);
    if (low == high) high += 0.001;
    float ff = (float)factor;
    for (int64_t i = 0; i < dim / 2; i++) {
        float pos_freq = powf((float)base, (float)(2 * i) / (float)dim);
        float extra = 1.0f / pos_freq, inter = 1.0f / (ff * pos_freq);
        float ramp = ((float)i - (float)low) / (float)(high - low);
        ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
        float ef = 1.0f - ramp;
        inv[i] = inter * (1.0f - ef) + extra * ef;
    }
    return att;
}

static void llama3(const accel_llama_config *c, int64_t dim, float *inv) {
    const accel_rope_scaling *r = &c->rope_scaling;
    default_freqs(c->rope_theta, dim, inv);
    /* f32 tensor steps, the Python scalars rounded to f32 where they meet them */
    float factor = (float)r->factor, lo = (float)r->low_freq_factor;
    float span = (float)(r->high_freq_factor - r->low_freq_factor), old = (float)original_max(c);
    float low_wavelen = (float)(original_max(c) / r->low_freq_factor);
    float high_wavelen = (float)(original_max(c) / r->high_freq_factor);
    for (int64_t i = 0; i < dim / 2; i++) {
        float wavelen = (float)(2 * M_PI) / inv[i];
        float f = wavelen > low_wavelen ? inv[i] / factor : inv[i];
        float smooth = (old / wavelen - lo) / span;
        float smoothed = (1 - smooth) * f / factor + smooth * f;
        bool medium = !(wavelen < high_wavelen) && !(wavelen > low_wavelen);
        inv[i] = medium ? smoothed : f;
    }
}

int64_t accel__rotary_dim(const accel_llama_config *c) {
    double f = c->partial_rotary_factor;
    return f == 0 || f == 1 ? c->head_dim : (int64_t)((double)c->head_dim * f);
}

/* seq_len: one past the largest position of the forward (dynamic and
 * longrope choose their frequencies by it, as transformers' dynamic_rope_update). */
double accel__rope_inv_freq(const accel_llama_config *c, bool local, int64_t seq_len, float *inv) {
    const accel_rope_scaling *r = &c->rope_scaling;
    int64_t dim = accel__rotary_dim(c);
    if (local) {
        default_freqs(c->rope_local_base_freq, dim, inv);
        return 1.0;
    }
    switch (r->type) {
    case ACCEL_ROPE_DEFAULT: default_freqs(c->rope_theta, dim, inv); return 1.0;
    case ACCEL_ROPE_LINEAR:
        default_freqs(c->rope_theta, dim, inv);
        for (int64_t i = 0; i < dim / 2; i++) inv[i] /= (float)r->factor;
        return 1.0;
    case ACCEL_ROPE_DYNAMIC: {
        /* Stateless: transformers keeps the frequencies of the longest sequence
         * seen until one shorter than max_position_embeddings resets them;
         * equal while lengths only grow (generation) or start afresh. */
        int64_t max_pos = c->max_position_embeddings;
        if (seq_len <= max_pos) {
            default_freqs(c->rope_theta, dim, inv);
            return 1.0;
        }
        /* transformers computes the grown base on f32 tensors */
        float f = (float)r->factor;
        float grow = powf(f * (float)seq_len / (float)max_pos - (float)(r->factor - 1),
                          (float)((double)dim / (double)(dim - 2)));
        float base = (float)c->rope_theta * grow;
        for (int64_t i = 0; i < dim / 2; i++) inv[i] = 1.0f / powf(base, (float)(2 * i) / (float)dim);
        return 1.0;
    }
    case ACCEL_ROPE_YARN: return yarn(c, dim, inv);
    case ACCEL_ROPE_LONGROPE: {
        double orig = original_max(c);
        double factor = r->factor != 0 ? r->factor : (double)c->max_position_embeddings / orig;
        double att = r->attention_factor;
        if (att == 0) att = factor <= 1.0 ? 1.0 : sqrt(1 + log(factor) / log(orig));
        const float *ext = (double)seq_len > orig ? r->long_factor : r->short_factor;
        for (int64_t i = 0; i < dim / 2; i++)
            inv[i] = 1.0f / (ext[i] * powf((float)c->rope_theta, (float)(2 * i) / (float)dim));
        return att;
    }
    case ACCEL_ROPE_LLAMA3: llama3(c, dim, inv); return 1.0;
    }
    return 1.0;
}

static bool positive(double v) { return isfinite(v) && v > 0; }

accel_status accel__rope_check(const accel_llama_config *c, const char *who) {
    const accel_rope_scaling *r = &c->rope_scaling;
    const char *bad = NULL;
    if ((unsigned)r->type > ACCEL_ROPE_LLAMA3) bad = "rope_scaling.type is not an accel_rope_type";
    else if (r->type != ACCEL_ROPE_DEFAULT && r->type != ACCEL_ROPE_LONGROPE && !positive(r->factor))
        bad = "rope_scaling.factor must be a finite number > 0";
    else if (r->type == ACCEL_ROPE_LONGROPE && r->factor != 0 && !positive(r->factor))
        bad = "rope_scaling.factor must be a finite number > 0";
    else if (r->original_max_position_embeddings < 0)
        bad = "rope_scaling.original_max_position_embeddings must be > 0";
    else if (r->attention_factor != 0 && !positive(r->attention_factor))
        bad = "rope_scaling.attention_factor must be a finite number > 0";
    else if (r->type == ACCEL_ROPE_YARN && (!isfinite(r->beta_fast) || !isfinite(r->beta_slow) || r->beta_fast < 0 ||
                                            r->beta_slow < 0 || !isfinite(r->mscale) || !isfinite(r->mscale_all_dim) ||
                                            r->mscale < 0 || r->mscale_all_dim < 0))
        bad = "rope_scaling.beta_fast, beta_slow, mscale and mscale_all_dim must be finite and >= 0";
    else if (r->type == ACCEL_ROPE_LLAMA3 && (!positive(r->low_freq_factor) || !positive(r->high_freq_factor) ||
                                              r->low_freq_factor == r->high_freq_factor))
        bad = "llama3 rope_scaling needs low_freq_factor != high_freq_factor, both finite and > 0";
    else if (r->type == ACCEL_ROPE_LLAMA3 && r->original_max_position_embeddings == 0)
        bad = "llama3 rope_scaling needs original_max_position_embeddings (the pretraining length)";
    else if (r->type == ACCEL_ROPE_DYNAMIC && accel__rotary_dim(c) <= 2)
        bad = "dynamic rope_scaling needs rotary dims (head_dim * partial_rotary_factor) > 2";
    else if (r->type == ACCEL_ROPE_LONGROPE && (r->n_factors < 1 || r->n_factors > ACCEL_ROPE_MAX_FACTORS))
        bad = "longrope rope_scaling.n_factors must be in [1, ACCEL_ROPE_MAX_FACTORS]";
    else if (r->type == ACCEL_ROPE_LONGROPE && r->n_factors != accel__rotary_dim(c) / 2)
        bad = "longrope rope_scaling needs short_factor and long_factor of head_dim / 2 numbers each (rotary dims / 2 "
              "with a partial_rotary_factor)";
    for (int i = 0; !bad && r->type == ACCEL_ROPE_LONGROPE && i < r->n_factors; i++)
        if (!positive(r->short_factor[i]) || !positive(r->long_factor[i]))
            bad = "rope_scaling.short_factor and long_factor must be finite numbers > 0";
    if (bad)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: %s (head_dim %lld, rotary dims %lld)", who, bad,
                               (long long)c->head_dim, (long long)accel__rotary_dim(c));
    return ACCEL_OK;
}
