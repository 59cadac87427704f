/* Strided layouts (broadcast strides, dim merging) and the strided copy. */
#include <math.h>
#include <string.h>

#include "cpu_kernels.h"

void accel__broadcast_strides(const accel_tensor *t, int ndim, const int64_t *shape,
                              int64_t *stride) {
    for (int i = 0; i < ndim; i++) {
        int ti = t->ndim - ndim + i;
        stride[i] = (ti >= 0 && t->shape[ti] == shape[i] && shape[i] != 1) ? t->stride[ti] : 0;
    }
}

void accel__layout_init(accel__layout *l, int ndim, const int64_t *shape, int n_ops,
                        const int64_t *const *strides) {
    ACCEL_ASSERT(n_ops >= 1 && n_ops <= 3);
    /* Drop size-1 dims, then merge dim i into the following one when every
     * operand steps over dim i exactly as over the whole following block. */
    int nd = 0;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] == 1) continue;
        bool merge = nd > 0;
        for (int k = 0; k < n_ops && merge; k++)
            merge = l->stride[k][nd - 1] == strides[k][i] * shape[i];
        if (merge) {
            l->shape[nd - 1] *= shape[i];
            for (int k = 0; k < n_ops; k++) l->stride[k][nd - 1] = strides[k][i];
            continue;
        }
        l->shape[nd] = shape[i];
        for (int k = 0; k < n_ops; k++) l->stride[k][nd] = strides[k][i];
        nd++;
    }
    if (nd == 0) { /* a scalar (or all ones) */
        l->shape[0] = 1;
        for (int k = 0; k < n_ops; k++) l->stride[k][0] = 0;
        nd = 1;
    }
    for (int k = n_ops; k < 3; k++)
        for (int i = 0; i < nd; i++) l->stride[k][i] = 0;
    l->ndim = nd;
}

int64_t accel__layout_rows(const accel__layout *l) {
    int64_t r = 1;
    for (int i = 0; i < l->ndim - 1; i++) r *= l->shape[i];
    return r;
}

int64_t accel__layout_row_offset(const accel__layout *l, int k, int64_t r) {
    int64_t off = 0;
    for (int i = l->ndim - 2; i >= 0; i--) {
        int64_t n = l->shape[i];
        off += (r % n) * l->stride[k][i];
        r /= n;
    }
    return off;
}

/* One row of `n` elements of type T: source stride ss, destination stride ds. */
#define COPY_ROW(T)                                                   \
    do {                                                              \
        const T *s_ = (const T *)src->data + so;                      \
        T *d_ = (T *)dst->data + dof;                                 \
        for (int64_t j = 0; j < n; j++) d_[j * ds] = s_[j * ss];      \
    } while (0)

void accel__cpu_copy(accel_tensor *dst, const accel_tensor *src) {
    int64_t numel = accel_numel(dst);
    size_t es = accel_dtype_size(dst->dtype);
    ACCEL_ASSERT(dst->dtype == src->dtype && accel_same_shape(dst, src));
    if (numel == 0) return;
    if (accel_is_contiguous(dst) && accel_is_contiguous(src)) {
        memcpy(dst->data, src->data, (size_t)numel * es);
        return;
    }
    const int64_t *st[2] = {dst->stride, src->stride};
    accel__layout l;
    accel__layout_init(&l, dst->ndim, dst->shape, 2, st);
    int64_t rows = accel__layout_rows(&l), n = l.shape[l.ndim - 1];
    int64_t ds = l.stride[0][l.ndim - 1], ss = l.stride[1][l.ndim - 1];
#pragma omp parallel for if (numel > ACCEL_CPU_PAR_THRESHOLD) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        int64_t dof = accel__layout_row_offset(&l, 0, r), so = accel__layout_row_offset(&l, 1, r);
        if (ds == 1 && ss == 1) {
            memcpy((char *)dst->data + (size_t)dof * es, (const char *)src->data + (size_t)so * es,
                   (size_t)n * es);
            continue;
        }
        switch (es) {
        case 1: COPY_ROW(uint8_t); break;
        case 2: COPY_ROW(uint16_t); break;
        case 4: COPY_ROW(uint32_t); break;
        default: COPY_ROW(uint64_t); break;
        }
    }
}

void accel__cpu_copy_strided(void *dst, const accel_tensor *src) {
    accel_tensor d = *src;
    d.data = dst;
    accel__contiguous_strides(d.ndim, d.shape, d.stride);
    accel__cpu_copy(&d, src);
}

/* ---- the copy, fill and accumulate kernels */

static int64_t linear_to_offset(const accel_tensor *t, int64_t i) {
    int64_t off = 0;
    for (int d = t->ndim - 1; d >= 0; d--) {
        int64_t n = t->shape[d];
        off += (i % n) * t->stride[d];
        i /= n;
    }
    return off;
}

/* dst = src converting dtypes (same shape, any strides), row by row over the
 * last dim: a row whose elements are adjacent in both is one convert (the
 * transposes of attention heads copy 64-float runs), others go element by
 * element. Rows are independent: large copies run on the OpenMP threads. */
static void convert_strided(accel_tensor *dst, const accel_tensor *src, int64_t n) {
    if (n == 0 || dst->ndim == 0) return;
    int last = dst->ndim - 1;
    int64_t W = dst->shape[last], rows = n / W;
    int64_t ds_ = dst->stride[last], ss = src->stride[last];
    size_t des = accel_dtype_size(dst->dtype), ses = accel_dtype_size(src->dtype);
#pragma omp parallel for if (n > 65536) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        char *d = (char *)dst->data + linear_to_offset(dst, r * W) * (int64_t)des;
        const char *s = (const char *)src->data + linear_to_offset(src, r * W) * (int64_t)ses;
        if (ds_ == 1 && ss == 1) {
            accel__cpu_convert(d, dst->dtype, s, src->dtype, W);
        } else {
            for (int64_t j = 0; j < W; j++)
                accel__store_elem(d + j * ds_ * (int64_t)des, dst->dtype, 0,
                                  accel__load_elem(s + j * ss * (int64_t)ses, src->dtype, 0));
        }
    }
}

accel_status accel__cpuk_copy(accel_k_copy *a) {
    accel_tensor *dst = a->out, *src = a->in;
    int64_t n = accel_numel(dst);
    if (dst->dtype == src->dtype) accel__cpu_copy(dst, src);
    else if (accel_is_contiguous(dst) && accel_is_contiguous(src))
        accel__cpu_convert(dst->data, dst->dtype, src->data, src->dtype, n);
    else convert_strided(dst, src, n);
    return ACCEL_OK;
}

accel_status accel__cpuk_fill(accel_k_fill *a) {
    accel_tensor *t = a->out;
    int64_t n = accel_numel(t);
    if (accel_is_contiguous(t) && a->value == 0.0 && !signbit(a->value)) { /* -0.0 is not all zero bytes */
        memset(t->data, 0, (size_t)n * accel_dtype_size(t->dtype));
    } else if (accel_is_contiguous(t) && t->dtype == ACCEL_F32) {
        float *p = t->data, v = (float)a->value;
        for (int64_t i = 0; i < n; i++) p[i] = v;
    } else {
        size_t es = accel_dtype_size(t->dtype);
        for (int64_t i = 0; i < n; i++)
            accel__store_elem((char *)t->data + linear_to_offset(t, i) * (int64_t)es, t->dtype, 0, a->value);
    }
    return ACCEL_OK;
}

static bool is_float(accel_dtype dt) { return dt == ACCEL_F32 || dt == ACCEL_BF16 || dt == ACCEL_F16; }

/* n elements of dtype dt, `stride` apart from p, as f32 into dense f. */
static void load_f32(float *f, const char *p, accel_dtype dt, int64_t stride, int64_t n) {
    if (stride == 1) {
        accel__cpu_to_f32(f, p, dt, n);
        return;
    }
    size_t es = accel_dtype_size(dt);
    for (int64_t j = 0; j < n; j++) f[j] = (float)accel__load_elem(p + j * stride * (int64_t)es, dt, 0);
}

/* Float dtypes other than f32 into f32 (a bf16 leaf's gradient, a tied
 * weight's second contribution): row by row over the merged layout, each
 * block of a row widened to f32, added, rounded once into dst (PyTorch's
 * grad accumulation in its opmath type), on the OpenMP threads. */
static void accumulate_float(accel_tensor *dst, const accel_tensor *src, int64_t n) {
    enum { B = 256 };
    const int64_t *st[2] = {dst->stride, src->stride};
    accel__layout l;
    accel__layout_init(&l, dst->ndim, dst->shape, 2, st);
    int64_t rows = accel__layout_rows(&l), w = l.shape[l.ndim - 1];
    int64_t ds = l.stride[0][l.ndim - 1], ss = l.stride[1][l.ndim - 1];
    size_t des = accel_dtype_size(dst->dtype), ses = accel_dtype_size(src->dtype);
#pragma omp parallel for if (n > 65536) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        char *d = (char *)dst->data + accel__layout_row_offset(&l, 0, r) * (int64_t)des;
        const char *s = (const char *)src->data + accel__layout_row_offset(&l, 1, r) * (int64_t)ses;
        for (int64_t j0 = 0; j0 < w; j0 += B) {
            int64_t m = w - j0 < B ? w - j0 : B;
            float fd[B], fs[B];
            char *dj = d + j0 * ds * (int64_t)des;
            load_f32(fd, dj, dst->dtype, ds, m);
            load_f32(fs, s + j0 * ss * (int64_t)ses, src->dtype, ss, m);
            for (int64_t j = 0; j < m; j++) fd[j] += fs[j];
            if (ds == 1) accel__cpu_from_f32(dj, dst->dtype, fd, m);
            else
                for (int64_t j = 0; j < m; j++) accel__store_elem(dj + j * ds * (int64_t)des, dst->dtype, 0, fd[j]);
        }
    }
}

/* dst (any strides: a gradient in its tensor's layout, nn_internal.h) += src. */
accel_status accel__cpuk_accumulate(accel_k_accumulate *a) {
    accel_tensor *dst = a->out, *src = a->in;
    int64_t n = accel_numel(dst);
    if (dst->dtype == ACCEL_F32 && src->dtype == ACCEL_F32 && accel_is_contiguous(src) && accel_is_contiguous(dst)) {
        float *d = dst->data;
        const float *s = src->data;
#pragma omp parallel for if (n > 65536) schedule(static)
        for (int64_t i = 0; i < n; i++) d[i] += s[i];
        return ACCEL_OK;
    }
    if (dst->dtype == ACCEL_F32 && src->dtype == ACCEL_F32) { /* row by row over the merged layout */
        const int64_t *st[2] = {dst->stride, src->stride};
        accel__layout l;
        accel__layout_init(&l, dst->ndim, dst->shape, 2, st);
        int64_t rows = accel__layout_rows(&l), w = l.shape[l.ndim - 1];
        int64_t ds = l.stride[0][l.ndim - 1], ss = l.stride[1][l.ndim - 1];
#pragma omp parallel for if (n > 65536) schedule(static)
        for (int64_t r = 0; r < rows; r++) {
            float *d = (float *)dst->data + accel__layout_row_offset(&l, 0, r);
            const float *s = (const float *)src->data + accel__layout_row_offset(&l, 1, r);
            for (int64_t j = 0; j < w; j++) d[j * ds] += s[j * ss];
        }
        return ACCEL_OK;
    }
    if (is_float(dst->dtype) && is_float(src->dtype)) {
        accumulate_float(dst, src, n);
        return ACCEL_OK;
    }
    size_t es = accel_dtype_size(src->dtype), des = accel_dtype_size(dst->dtype);
    for (int64_t i = 0; i < n; i++) {
        char *d = (char *)dst->data + linear_to_offset(dst, i) * (int64_t)des;
        double v = accel__load_elem(d, dst->dtype, 0) +
                   accel__load_elem((const char *)src->data + linear_to_offset(src, i) * (int64_t)es,
                                    src->dtype, 0);
        accel__store_elem(d, dst->dtype, 0, v);
    }
    return ACCEL_OK;
}
