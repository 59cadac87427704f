/* Reduction kernels: sum over a set of dims, max over one dim. */
#include <string.h>

#include "cpu_kernels.h"

/* Splits x's dims into kept (outer, in order) and reduced ones. */
typedef struct split_dims {
    int nk, nr;
    int64_t kshape[ACCEL_MAX_DIMS], kstride[ACCEL_MAX_DIMS];
    int64_t rshape[ACCEL_MAX_DIMS], rstride[ACCEL_MAX_DIMS];
    int64_t kn, rn; /* element counts */
} split_dims;

static void split(const accel_tensor *x, unsigned mask, split_dims *s) {
    s->nk = s->nr = 0;
    s->kn = s->rn = 1;
    for (int d = 0; d < x->ndim; d++) {
        if ((mask >> d) & 1u) {
            s->rshape[s->nr] = x->shape[d];
            s->rstride[s->nr++] = x->stride[d];
            s->rn *= x->shape[d];
        } else {
            s->kshape[s->nk] = x->shape[d];
            s->kstride[s->nk++] = x->stride[d];
            s->kn *= x->shape[d];
        }
    }
}

static int64_t offset_of(int nd, const int64_t *shape, const int64_t *stride, int64_t i) {
    int64_t off = 0;
    for (int d = nd - 1; d >= 0; d--) {
        off += (i % shape[d]) * stride[d];
        i /= shape[d];
    }
    return off;
}

void accel__cpu_sum_f32(const accel_tensor *x, unsigned mask, double scale, float *out) {
    split_dims s;
    split(x, mask, &s);
    const float *p = x->data;
    /* Merge the reduced dims into one run where they are contiguous with each other. */
    const int64_t *rs[1] = {s.rstride};
    accel__layout rl;
    accel__layout_init(&rl, s.nr, s.rshape, 1, rs);
    int64_t rrows = accel__layout_rows(&rl), rlen = rl.shape[rl.ndim - 1], rst = rl.stride[0][rl.ndim - 1];
    if (s.rn == 0) rrows = 0;
    if (s.kn == 1) {
        /* Everything into one value: threads share the reduced elements. */
        double acc = 0.0;
#pragma omp parallel for if (s.rn > ACCEL_CPU_PAR_THRESHOLD) reduction(+ : acc) schedule(static)
        for (int64_t r = 0; r < rrows; r++) {
            const float *q = p + accel__layout_row_offset(&rl, 0, r);
            double a = 0.0;
            for (int64_t j = 0; j < rlen; j++) a += q[j * rst];
            acc += a;
        }
        out[0] = (float)(acc * scale);
        return;
    }
    if (accel_is_contiguous(x) && s.nr > 0 && mask == (1u << s.nr) - 1u) {
        /* Leading dims reduced (a bias gradient): add whole rows, a block of
         * columns per thread, so memory is read in order. */
        int64_t rows = s.rn, cols = s.kn;
#pragma omp parallel for if (rows * cols > ACCEL_CPU_PAR_THRESHOLD) schedule(static)
        for (int64_t c0 = 0; c0 < cols; c0 += 256) {
            double acc[256] = {0};
            int64_t w = cols - c0 < 256 ? cols - c0 : 256;
            for (int64_t r = 0; r < rows; r++) {
                const float *q = p + r * cols + c0;
                for (int64_t j = 0; j < w; j++) acc[j] += q[j];
            }
            for (int64_t j = 0; j < w; j++) out[c0 + j] = (float)(acc[j] * scale);
        }
        return;
    }
#pragma omp parallel for if (s.kn * s.rn > ACCEL_CPU_PAR_THRESHOLD) schedule(static)
    for (int64_t o = 0; o < s.kn; o++) {
        const float *base = p + offset_of(s.nk, s.kshape, s.kstride, o);
        double acc = 0.0;
        for (int64_t r = 0; r < rrows; r++) {
            const float *q = base + accel__layout_row_offset(&rl, 0, r);
            if (rst == 1)
                for (int64_t j = 0; j < rlen; j++) acc += q[j];
            else
                for (int64_t j = 0; j < rlen; j++) acc += q[j * rst];
        }
        out[o] = (float)(acc * scale);
    }
}

void accel__cpu_sum_ref(const accel_tensor *x, unsigned mask, double scale, accel_tensor *out) {
    split_dims s;
    split(x, mask, &s);
    for (int64_t o = 0; o < s.kn; o++) {
        int64_t base = offset_of(s.nk, s.kshape, s.kstride, o);
        double acc = 0.0;
        for (int64_t r = 0; r < s.rn; r++)
            acc += accel__load_elem(x->data, x->dtype, (size_t)(base + offset_of(s.nr, s.rshape, s.rstride, r)));
        accel__store_elem(out->data, out->dtype, (size_t)o, acc * scale);
    }
}

void accel__cpu_max(const accel_tensor *x, int d, accel_tensor *values, int64_t *indices) {
    split_dims s;
    split(x, 1u << d, &s);
    int64_t len = x->shape[d], st = x->stride[d];
#pragma omp parallel for if (s.kn * len > ACCEL_CPU_PAR_THRESHOLD) schedule(static)
    for (int64_t o = 0; o < s.kn; o++) {
        int64_t base = offset_of(s.nk, s.kshape, s.kstride, o);
        double best = accel__load_elem(x->data, x->dtype, (size_t)base);
        int64_t bi = 0;
        for (int64_t j = 1; j < len && !isnan(best); j++) {
            double v = accel__load_elem(x->data, x->dtype, (size_t)(base + j * st));
            if (v > best || isnan(v)) {
                best = v;
                bi = j;
            }
        }
        accel__store_elem(values->data, values->dtype, (size_t)o, best);
        indices[o] = bi;
    }
}

/* ---- the table's reduction kernels */

accel_status accel__cpuk_sum(accel_k_sum *k) {
    if (accel_reference_kernels() || k->x->dtype != ACCEL_F32 || k->out->dtype != ACCEL_F32)
        accel__cpu_sum_ref(k->x, k->mask, k->scale, k->out);
    else accel__cpu_sum_f32(k->x, k->mask, k->scale, k->out->data);
    return ACCEL_OK;
}

accel_status accel__cpuk_max(accel_k_max *k) {
    accel__cpu_max(k->x, k->dim, k->values, k->indices->data);
    return ACCEL_OK;
}

accel_status accel__cpuk_max_backward(accel_k_max_backward *k) {
    const accel_tensor *x = k->gx;
    int d = k->dim;
    int64_t outer = 1, inner = 1, len = x->shape[d];
    for (int i = 0; i < d; i++) outer *= x->shape[i];
    for (int i = d + 1; i < x->ndim; i++) inner *= x->shape[i];
    float *px = k->gx->data;
    const float *pg = k->g->data;
    const int64_t *idx = k->indices->data;
    memset(px, 0, (size_t)accel_numel(x) * sizeof(float));
    for (int64_t o = 0; o < outer; o++)
        for (int64_t i = 0; i < inner; i++)
            px[(o * len + idx[o * inner + i]) * inner + i] = pg[o * inner + i];
    return ACCEL_OK;
}
