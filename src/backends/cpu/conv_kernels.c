/* The CPU kernels of the window ops (core/kernels.h): conv2d, a whole
 * convolution pass on oneDNN's convolution (ACCEL_CONV, below); im2col and
 * col2im, which turn a convolution into the GEMMs of accel_conv2d
 * (src/ops/conv.c) where that does not run; and the 2-D poolings. Rows of the output are independent: the loops are
 * split over them with OpenMP. One path serves the reference kernels too:
 * each output element is computed one way only (no reordered sums). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/cpu/gemm.h"
#include "cpu_kernels.h"

/* ---- which convolution runs (docs/cpu.md "Convolutions")
 *
 * ACCEL_CONV, read at the first convolution: auto (the default) runs a pass
 * on oneDNN's convolution where its plug-in loads and has a kernel that is
 * no reference loop for the case (f32, bf16), else im2col and the GEMMs;
 * im2col always the latter; dnnl as auto, but a convolution fails (naming
 * why) where the plug-in does not load. The reference kernels
 * (accel_set_reference_kernels) always run im2col. */
static pthread_once_t conv_env_once = PTHREAD_ONCE_INIT;
static int conv_env_mode; /* accel__conv_mode, or -1 when ACCEL_CONV holds none */
static char conv_env_value[48];
static _Atomic int conv_set_mode = -1; /* accel__cpu_conv_set_mode's, or -1 */
static _Atomic int64_t conv_direct_calls, conv_direct_declined;

static void conv_env_read(void) {
    const char *v = getenv("ACCEL_CONV");
    snprintf(conv_env_value, sizeof conv_env_value, "%s", v ? v : "");
    conv_env_mode = !v || !strcmp(v, "auto") ? ACCEL__CONV_AUTO
                    : !strcmp(v, "im2col")   ? ACCEL__CONV_IM2COL
                    : !strcmp(v, "dnnl")     ? ACCEL__CONV_DNNL
                                             : -1;
}

/* The mode in force; -1 with the error set when ACCEL_CONV holds none. */
static int conv_mode_now(void) {
    int m = conv_set_mode;
    if (m >= 0) return m;
    pthread_once(&conv_env_once, conv_env_read);
    if (conv_env_mode < 0)
        accel_set_error(ACCEL_ERR_INVALID_ARG, "ACCEL_CONV=%s: expected auto, im2col or dnnl", conv_env_value);
    return conv_env_mode;
}

accel_status accel__cpu_conv_set_mode(accel__conv_mode mode) {
    if (mode != ACCEL__CONV_AUTO && mode != ACCEL__CONV_IM2COL && mode != ACCEL__CONV_DNNL)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel__cpu_conv_set_mode: %d is not a convolution mode",
                               (int)mode);
    conv_set_mode = mode;
    return ACCEL_OK;
}

int64_t accel__cpu_conv_direct_calls(void) { return conv_direct_calls; }
int64_t accel__cpu_conv_direct_declined(void) { return conv_direct_declined; }

const char *accel__cpu_conv_describe(char *buf, size_t size) {
    int mode = conv_mode_now();
    const char *missing = accel__gemm_have_dnnl() ? accel__dnnl_unavailable() : "";
    const char *pre = missing && *missing ? "the oneDNN plug-in did not load: " : "";
    if (missing && !*missing) missing = "oneDNN not built in";
    if (mode < 0) snprintf(buf, size, "Conv: none (%s)\n", accel_last_error());
    else if (accel_reference_kernels()) snprintf(buf, size, "Conv: im2col + GEMM (accel_set_reference_kernels)\n");
    else if (mode == ACCEL__CONV_IM2COL) snprintf(buf, size, "Conv: im2col + GEMM (ACCEL_CONV=im2col)\n");
    else if (missing)
        snprintf(buf, size, "Conv: %s (%s%s)\n",
                 mode == ACCEL__CONV_DNNL ? "none, every convolution fails: ACCEL_CONV=dnnl" : "im2col + GEMM", pre,
                 missing);
    else
        snprintf(buf, size, "Conv: dnnl (oneDNN's convolution, f32 and bf16 where it has a kernel that is no "
                 "reference loop, im2col + GEMM otherwise%s)\n", mode == ACCEL__CONV_DNNL ? "; ACCEL_CONV=dnnl" : "");
    return buf;
}

accel_status accel__cpuk_conv2d(accel_k_conv2d *k) {
    k->ran = false;
    int mode = conv_mode_now();
    if (mode < 0) return accel_last_status();
    if (mode == ACCEL__CONV_IM2COL || accel_reference_kernels()) return ACCEL_OK;
    if (mode == ACCEL__CONV_DNNL && !accel__gemm_have_dnnl())
        return accel_set_error(ACCEL_ERR_UNSUPPORTED,
                               "ACCEL_CONV=dnnl: this build has no oneDNN (install libdnnl-dev and reconfigure)");
    /* auto: only where the plug-in loads (asking loads it) */
    if (mode == ACCEL__CONV_AUTO && (!accel__gemm_have_dnnl() || accel__dnnl_unavailable())) return ACCEL_OK;
    /* no channels or no images: oneDNN refuses the description; im2col gives the bias alone */
    if (accel_numel(k->x) == 0 || accel_numel(k->w) == 0) return ACCEL_OK;
    /* a stride, padding or dilation past INT32_MAX, or a padded plane or dilated kernel reaching past it:
     * oneDNN refuses the description (invalid_arguments); im2col takes it (torch gives the result) */
    const accel_k_window2d *wn = &k->win;
    const int64_t args[6] = {wn->sh, wn->sw, wn->ph, wn->pw, wn->dh, wn->dw};
    for (int i = 0; i < 6; i++)
        if (args[i] > INT32_MAX) return ACCEL_OK;
    if (wn->H + 2 * wn->ph > INT32_MAX || wn->W + 2 * wn->pw > INT32_MAX ||
        (wn->kh > 1 && wn->dh > (INT32_MAX - 1) / (wn->kh - 1)) || (wn->kw > 1 && wn->dw > (INT32_MAX - 1) / (wn->kw - 1)))
        return ACCEL_OK;
    bool fwd = k->pass == ACCEL_K_CONV_FORWARD;
    accel_dtype dt = fwd ? k->x->dtype : k->dy->dtype;
    /* operands of one dtype, f32 or bf16 (the op widens nothing for this) */
    const accel_tensor *ops[] = {k->x, k->w, k->b, k->dy};
    for (int i = 0; i < 4; i++)
        if (ops[i] && ops[i]->dtype != dt) return ACCEL_OK;
    if (dt != ACCEL_F32 && dt != ACCEL_BF16) return ACCEL_OK;
    accel__conv_call c = {
        .pass = k->pass,
        .dt = dt,
        .y_dt = fwd ? k->y->dtype : ACCEL_F32,
        .N = k->x->shape[0],
        .C = k->x->shape[1],
        .O = k->w->shape[0],
        .G = k->G,
        .win = k->win,
        .x = k->x->data,
        .w = k->w->data,
        .b = k->b ? k->b->data : NULL,
        .dy = k->dy ? k->dy->data : NULL,
        .y = k->y ? k->y->data : NULL,
        .dx = k->dx ? k->dx->data : NULL,
        .dw = k->dw ? k->dw->data : NULL,
        .db = k->db ? k->db->data : NULL,
        .dx_beta = k->dx_beta,
        .dw_beta = k->dw_beta,
        .db_beta = k->db_beta,
    };
    accel_status st = accel__dnnl_conv(&c, &k->ran);
    if (k->ran) conv_direct_calls++;
    else if (st == ACCEL_OK) conv_direct_declined++;
    return st;
}

/* The first output index o in [0, n) whose input index o s + off is >= 0,
 * and the first whose index is >= lim: taps inside the input are o in
 * [*lo, *hi). The ceilings as (v - 1) / s + 1: v + s - 1 wraps for a
 * stride near INT64_MAX. */
static void inside_range(int64_t n, int64_t s, int64_t off, int64_t lim, int64_t *lo, int64_t *hi) {
    int64_t a = off >= 0 ? 0 : (-off - 1) / s + 1;
    int64_t b = lim - off <= 0 ? 0 : (lim - off - 1) / s + 1;
    *lo = a < n ? a : n;
    *hi = b < n ? b : n;
    if (*hi < *lo) *hi = *lo;
}

/* One row (c, i, j) of im2col: col_row [Ho * Wo] from plane [H, W], elements
 * of es bytes. */
static void im2col_row(char *col_row, const char *plane, size_t es, const accel_k_window2d *w, int64_t i,
                       int64_t j) {
    int64_t ow_lo, ow_hi, off_w = j * w->dw - w->pw;
    inside_range(w->Wo, w->sw, off_w, w->W, &ow_lo, &ow_hi);
    for (int64_t oh = 0; oh < w->Ho; oh++) {
        char *dst = col_row + (size_t)(oh * w->Wo) * es;
        int64_t ih = oh * w->sh - w->ph + i * w->dh;
        if (ih < 0 || ih >= w->H) {
            memset(dst, 0, (size_t)w->Wo * es);
            continue;
        }
        const char *src = plane + (size_t)(ih * w->W) * es;
        memset(dst, 0, (size_t)ow_lo * es);
        if (w->sw == 1) {
            memcpy(dst + (size_t)ow_lo * es, src + (size_t)(ow_lo + off_w) * es, (size_t)(ow_hi - ow_lo) * es);
        } else if (es == 4) {
            for (int64_t ow = ow_lo; ow < ow_hi; ow++)
                ((uint32_t *)dst)[ow] = ((const uint32_t *)src)[ow * w->sw + off_w];
        } else {
            for (int64_t ow = ow_lo; ow < ow_hi; ow++)
                ((uint16_t *)dst)[ow] = ((const uint16_t *)src)[ow * w->sw + off_w];
        }
        memset(dst + (size_t)ow_hi * es, 0, (size_t)(w->Wo - ow_hi) * es);
    }
}

accel_status accel__cpuk_im2col(accel_k_im2col *k) {
    const accel_k_window2d *w = &k->win;
    size_t es = accel_dtype_size(k->x->dtype);
    if (es != 4 && es != 2)
        return accel_set_error(ACCEL_ERR_DTYPE, "im2col: dtype %s is not a float dtype of 2 or 4 bytes",
                               accel_dtype_name(k->x->dtype));
    const char *x = (const char *)k->x->data + (size_t)k->x_off * es;
    char *col = k->col->data;
    int64_t taps = w->kh * w->kw, rows = k->C * taps, L = w->Ho * w->Wo;
#pragma omp parallel for if (rows * L > ACCEL_CPU_PAR_THRESHOLD) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        int64_t c = r / taps, t = r % taps;
        im2col_row(col + (size_t)(r * L) * es, x + (size_t)(c * w->H * w->W) * es, es, w, t / w->kw, t % w->kw);
    }
    return ACCEL_OK;
}

accel_status accel__cpuk_col2im(accel_k_col2im *k) {
    const accel_k_window2d *w = &k->win;
    float *dx = (float *)k->dx->data + k->x_off;
    const float *col = k->col->data;
    int64_t taps = w->kh * w->kw, L = w->Ho * w->Wo;
    /* one channel per iteration: its taps' rows all land in its own plane */
#pragma omp parallel for if (k->C * taps * L > ACCEL_CPU_PAR_THRESHOLD) schedule(static)
    for (int64_t c = 0; c < k->C; c++) {
        float *plane = dx + c * w->H * w->W;
        for (int64_t t = 0; t < taps; t++) {
            int64_t i = t / w->kw, j = t % w->kw, ow_lo, ow_hi, off_w = j * w->dw - w->pw;
            inside_range(w->Wo, w->sw, off_w, w->W, &ow_lo, &ow_hi);
            const float *row = col + (c * taps + t) * L;
            for (int64_t oh = 0; oh < w->Ho; oh++) {
                int64_t ih = oh * w->sh - w->ph + i * w->dh;
                if (ih < 0 || ih >= w->H) continue;
                float *restrict dst = plane + ih * w->W + off_w;
                const float *restrict src = row + oh * w->Wo;
                if (w->sw == 1) { /* contiguous: vectorised (dx and col never overlap) */
#pragma omp simd
                    for (int64_t ow = ow_lo; ow < ow_hi; ow++) dst[ow] += src[ow];
                } else {
                    for (int64_t ow = ow_lo; ow < ow_hi; ow++) dst[ow * w->sw] += src[ow];
                }
            }
        }
    }
    return ACCEL_OK;
}

/* ---- pooling */

/* The window of output (oh, ow): rows [h0, h1) and columns [w0, w1) of the
 * input, cut to it, and the divisor of an average. */
typedef struct pool_win {
    int64_t h0, h1, w0, w1;
    float div;
} pool_win;

static pool_win window_of(const accel_k_window2d *w, accel_k_pool_kind kind, bool include_pad, int64_t oh,
                          int64_t ow) {
    pool_win p;
    if (kind == ACCEL_K_POOL_ADAPTIVE_AVG) {
        p.h0 = oh * w->H / w->Ho;
        p.h1 = ((oh + 1) * w->H + w->Ho - 1) / w->Ho;
        p.w0 = ow * w->W / w->Wo;
        p.w1 = ((ow + 1) * w->W + w->Wo - 1) / w->Wo;
        p.div = (float)((p.h1 - p.h0) * (p.w1 - p.w0));
        return p;
    }
    /* MAX: the dilated taps' span; AVG (no dilation) the window cut at the
     * padded input's end (ceil_mode's last window), which is its size */
    int64_t h0 = oh * w->sh - w->ph, w0 = ow * w->sw - w->pw;
    int64_t h1 = h0 + (w->kh - 1) * w->dh + 1, w1 = w0 + (w->kw - 1) * w->dw + 1;
    if (h1 > w->H + w->ph) h1 = w->H + w->ph;
    if (w1 > w->W + w->pw) w1 = w->W + w->pw;
    float padded = (float)((h1 - h0) * (w1 - w0));
    p.h0 = h0 < 0 ? 0 : h0;
    p.w0 = w0 < 0 ? 0 : w0;
    p.h1 = h1 > w->H ? w->H : h1;
    p.w1 = w1 > w->W ? w->W : w1;
    if (kind == ACCEL_K_POOL_MAX) {
        /* the first tap inside: taps sit at h0 + i dh */
        if (h0 < 0) p.h0 = h0 + (-h0 + w->dh - 1) / w->dh * w->dh;
        if (w0 < 0) p.w0 = w0 + (-w0 + w->dw - 1) / w->dw * w->dw;
    }
    p.div = include_pad ? padded : (float)((p.h1 - p.h0) * (p.w1 - p.w0));
    return p;
}

accel_status accel__cpuk_pool2d(accel_k_pool2d *k) {
    const accel_k_window2d *w = &k->win;
    const float *x = k->x->data;
    float *y = k->y->data;
    int64_t *idx = k->idx ? k->idx->data : NULL;
    int64_t HW = w->H * w->W, L = w->Ho * w->Wo;
#pragma omp parallel for if (k->P * L * w->kh * w->kw > ACCEL_CPU_PAR_THRESHOLD) schedule(static)
    for (int64_t p = 0; p < k->P; p++) {
        const float *plane = x + p * HW;
        for (int64_t oh = 0; oh < w->Ho; oh++)
            for (int64_t ow = 0; ow < w->Wo; ow++) {
                pool_win q = window_of(w, k->kind, k->count_include_pad, oh, ow);
                int64_t o = p * L + oh * w->Wo + ow;
                if (k->kind == ACCEL_K_POOL_MAX) {
                    float m = -INFINITY;
                    int64_t at = q.h0 * w->W + q.w0;
                    for (int64_t h = q.h0; h < q.h1; h += w->dh)
                        for (int64_t c = q.w0; c < q.w1; c += w->dw) {
                            float v = plane[h * w->W + c];
                            if (v > m || isnan(v)) { /* torch's rule: the last NaN */
                                m = v;
                                at = h * w->W + c;
                            }
                        }
                    y[o] = m;
                    idx[o] = at;
                } else {
                    float s = 0.0f;
                    for (int64_t h = q.h0; h < q.h1; h++)
                        for (int64_t c = q.w0; c < q.w1; c++) s += plane[h * w->W + c];
                    y[o] = s / q.div;
                }
            }
    }
    return ACCEL_OK;
}

accel_status accel__cpuk_pool2d_backward(accel_k_pool2d_backward *k) {
    const accel_k_window2d *w = &k->win;
    const float *g = k->g->data;
    const int64_t *idx = k->idx ? k->idx->data : NULL;
    float *dx = k->dx->data;
    int64_t HW = w->H * w->W, L = w->Ho * w->Wo;
    /* one plane per iteration: windows overlap only within their plane */
#pragma omp parallel for if (k->P * L > ACCEL_CPU_PAR_THRESHOLD) schedule(static)
    for (int64_t p = 0; p < k->P; p++) {
        float *plane = dx + p * HW;
        for (int64_t oh = 0; oh < w->Ho; oh++)
            for (int64_t ow = 0; ow < w->Wo; ow++) {
                int64_t o = p * L + oh * w->Wo + ow;
                if (k->kind == ACCEL_K_POOL_MAX) {
                    /* a window with no tap inside (only a dilated one can
                     * have none) is -inf at index h0 W + w0 of its first
                     * taps past the padding, as torch's: that index falls
                     * past the plane (no gradient) or, for columns past W,
                     * on the next row's first element, which gets this
                     * gradient as in torch's max_pool2d backward */
                    if (idx[o] >= 0 && idx[o] < HW) plane[idx[o]] += g[o];
                    continue;
                }
                pool_win q = window_of(w, k->kind, k->count_include_pad, oh, ow);
                float v = g[o] / q.div;
                for (int64_t h = q.h0; h < q.h1; h++)
                    for (int64_t c = q.w0; c < q.w1; c++) plane[h * w->W + c] += v;
            }
    }
    return ACCEL_OK;
}
