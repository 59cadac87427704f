/* Copy, fill, accumulate, the pointwise kernels (binary with broadcasting,
 * unary and its gradient, dropout's mask-scale), the metrics kernels
 * (compare, where) and the bias kernels.
 * Grid-stride loops over the output in row-major order; strided and
 * broadcast operands are indexed through their views. f32 math as the CPU
 * kernels (the scalar functions of cpu_kernels.h are shared).
 *
 * Fast paths (kernels.h's promise): a conversion, a unary op, or a binary op
 * without broadcasting, on contiguous float tensors (f32, bf16, f16) whose
 * data are 16-byte aligned, runs a kernel typed by its dtypes: 16-byte
 * vector loads and stores, no index arithmetic per element, no dtype switch
 * or double round trip; the same conversions (core/dtype_elem.h), so the
 * same bits as the general kernels. Same-dtype strided copies move whole
 * elements, not bytes. */
#include <string.h>

#include "backends/cpu/cpu_kernels.h"
#include "cuda_common.cuh"

static bool is_contig(const accel_tensor *t) { return accel_is_contiguous(t); }

/* ---- the typed fast paths' pieces */

/* A float dtype's storage and its conversions to and from f32. */
struct f32_type {
    typedef float S;
    __device__ static float get(S v) { return v; }
    __device__ static S put(float v) { return v; }
};
struct bf16_type {
    typedef uint16_t S;
    __device__ static float get(S v) { return accel__bf16_to_f32(v); }
    __device__ static S put(float v) { return accel__f32_to_bf16(v); }
};
struct f16_type {
    typedef uint16_t S;
    __device__ static float get(S v) { return accel__f16_to_f32(v); }
    __device__ static S put(float v) { return accel__f32_to_f16(v); }
};

/* V elements at p (16-byte aligned, V * sizeof(S) a multiple of 16) in 16-byte loads and stores. */
template <typename S, int V> __device__ inline void load_vec(S (&e)[V], const S *p) {
#pragma unroll
    for (int k = 0; k < V * (int)sizeof(S) / 16; k++) {
        uint4 r = ((const uint4 *)p)[k];
        memcpy(&e[k * 16 / (int)sizeof(S)], &r, 16);
    }
}

template <typename S, int V> __device__ inline void store_vec(S *p, const S (&e)[V]) {
#pragma unroll
    for (int k = 0; k < V * (int)sizeof(S) / 16; k++) {
        uint4 r;
        memcpy(&r, &e[k * 16 / (int)sizeof(S)], 16);
        ((uint4 *)p)[k] = r;
    }
}

/* Elements per thread of a fast path over storages A and B: 16 bytes of the narrower. */
template <typename A, typename B> struct vec_len {
    enum { V = 16 / (sizeof(A) < sizeof(B) ? sizeof(A) : sizeof(B)) };
};

static bool aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

/* Whether t is contiguous, float, 16-byte aligned: a fast path's operand. */
static bool fast_operand(const accel_tensor *t) {
    return (t->dtype == ACCEL_F32 || t->dtype == ACCEL_BF16 || t->dtype == ACCEL_F16) && is_contig(t) &&
           aligned16(t->data);
}

/* Calls f.template operator()<T>() with T the type of float dtype dt. */
template <typename F> static accel_status by_float_type(accel_dtype dt, F &&f) {
    switch (dt) {
    case ACCEL_BF16: return f(bf16_type());
    case ACCEL_F16: return f(f16_type());
    default: return f(f32_type());
    }
}

/* ---- copy / fill / accumulate */

/* E: an unsigned integer of the element's size (whole elements, not bytes). */
template <typename E> __global__ void copy_same_k(E *dst, kview dv, const E *src, kview sv, int64_t n) {
    GRID_STRIDE(i, n) dst[offset_of(dv, i)] = src[offset_of(sv, i)];
}

template <typename E> static void copy_same(cudaStream_t s, accel_k_copy *a, int64_t n) {
    copy_same_k<E><<<blocks_for(n), KTHREADS, 0, s>>>((E *)a->out->data, view_of(a->out), (const E *)a->in->data,
                                                      view_of(a->in), n);
}

/* Same-dtype copy of views whose rows (last dim) are dense and 16-byte
 * aligned on both sides, the heads transposes of attention ([B, T, H, D] <->
 * [B, H, T, D]): 16 bytes a thread, one index computation per 16 bytes
 * instead of one per element. dv, sv: the views without their last dim
 * (offsets of rows, in elements of es bytes); chunks: 16-byte pieces a row. */
__global__ void copy_rows_k(char *dst, kview dv, const char *src, kview sv, int64_t rows, int64_t chunks,
                            int64_t es) {
    GRID_STRIDE(c, rows * chunks) {
        const int64_t r = c / chunks, k = c % chunks;
        ((uint4 *)(dst + offset_of(dv, r) * es))[k] = ((const uint4 *)(src + offset_of(sv, r) * es))[k];
    }
}

/* Whether out <- in (one dtype of es bytes, one shape) can copy whole rows
 * (copy_rows_k): dense last dims of a multiple of 16 bytes, every row start
 * 16-byte aligned. */
static bool rows_copyable(const accel_tensor *out, const accel_tensor *in, int64_t es) {
    const int nd = out->ndim;
    if (nd < 2 || in->ndim != nd || out->stride[nd - 1] != 1 || in->stride[nd - 1] != 1 ||
        (out->shape[nd - 1] * es) % 16 || !aligned16(out->data) || !aligned16(in->data))
        return false;
    for (int d = 0; d < nd; d++)
        if (out->shape[d] != in->shape[d] ||
            (d < nd - 1 && ((out->stride[d] * es) % 16 || (in->stride[d] * es) % 16)))
            return false;
    return true;
}

static void copy_rows(cudaStream_t s, accel_k_copy *a, int64_t n, int64_t es) {
    kview dv = view_of(a->out), sv = view_of(a->in);
    const int64_t row = dv.shape[dv.ndim - 1], chunks = row * es / 16;
    dv.ndim--, sv.ndim--;
    copy_rows_k<<<blocks_for(n / row * chunks), KTHREADS, 0, s>>>((char *)a->out->data, dv, (const char *)a->in->data,
                                                                 sv, n / row, chunks, es);
}

__global__ void convert_k(void *dst, accel_dtype ddt, kview dv, const void *src, accel_dtype sdt, kview sv,
                          int64_t n) {
    GRID_STRIDE(i, n) accel__elem_set(dst, ddt, offset_of(dv, i), accel__elem_get(src, sdt, offset_of(sv, i)));
}

/* The fast conversion: contiguous float dst (type TO) from src (TI). */
template <typename TI, typename TO>
__global__ void convert_fast_k(typename TO::S *dst, const typename TI::S *src, int64_t n) {
    enum { V = vec_len<typename TI::S, typename TO::S>::V };
    int64_t nv = n / V;
    GRID_STRIDE(v, nv) {
        typename TI::S x[V];
        typename TO::S y[V];
        load_vec(x, src + v * V);
#pragma unroll
        for (int j = 0; j < V; j++) y[j] = TO::put(TI::get(x[j]));
        store_vec(dst + v * V, y);
    }
    GRID_STRIDE(i, n - nv * V) dst[nv * V + i] = TO::put(TI::get(src[nv * V + i]));
}

static accel_status convert_fast(cudaStream_t s, accel_k_copy *a, int64_t n) {
    return by_float_type(a->in->dtype, [&](auto ti) {
        return by_float_type(a->out->dtype, [&](auto to) {
            typedef decltype(ti) TI;
            typedef decltype(to) TO;
            int64_t threads = n / vec_len<typename TI::S, typename TO::S>::V + 1;
            convert_fast_k<TI, TO><<<blocks_for(threads), KTHREADS, 0, s>>>((typename TO::S *)a->out->data,
                                                                           (const typename TI::S *)a->in->data, n);
            return ACCEL_OK;
        });
    });
}

extern "C" accel_status accel__cudak_copy(accel_k_copy *a) {
    int index = a->out->device.index;
    int64_t n = accel_numel(a->out);
    if (!n) return ACCEL_OK;
    cudaStream_t s = accel__cuda_enter(index);
    size_t es = accel_dtype_size(a->out->dtype);
    if (a->out->dtype == a->in->dtype && is_contig(a->out) && is_contig(a->in))
        return accel__cuda_check(cudaMemcpyAsync(a->out->data, a->in->data, (size_t)n * es, cudaMemcpyDeviceToDevice, s),
                                 index, "copy");
    if (a->out->dtype == a->in->dtype && rows_copyable(a->out, a->in, (int64_t)es)) {
        copy_rows(s, a, n, (int64_t)es);
    } else if (a->out->dtype == a->in->dtype) {
        switch (es) {
        case 1: copy_same<uint8_t>(s, a, n); break;
        case 2: copy_same<uint16_t>(s, a, n); break;
        case 4: copy_same<uint32_t>(s, a, n); break;
        default: copy_same<uint64_t>(s, a, n); break;
        }
    } else if (fast_operand(a->out) && fast_operand(a->in)) {
        convert_fast(s, a, n);
    } else {
        convert_k<<<blocks_for(n), KTHREADS, 0, s>>>(a->out->data, a->out->dtype, view_of(a->out), a->in->data,
                                                     a->in->dtype, view_of(a->in), n);
    }
    return launched(index, "copy");
}

__global__ void fill_k(void *dst, accel_dtype dt, kview v, int64_t n, double value) {
    GRID_STRIDE(i, n) accel__elem_set(dst, dt, offset_of(v, i), value);
}

extern "C" accel_status accel__cudak_fill(accel_k_fill *a) {
    int index = a->out->device.index;
    int64_t n = accel_numel(a->out);
    if (!n) return ACCEL_OK;
    cudaStream_t s = accel__cuda_enter(index);
    if (a->value == 0.0 && is_contig(a->out))
        return accel__cuda_check(cudaMemsetAsync(a->out->data, 0, (size_t)n * accel_dtype_size(a->out->dtype), s), index,
                                 "fill");
    fill_k<<<blocks_for(n), KTHREADS, 0, s>>>(a->out->data, a->out->dtype, view_of(a->out), n, a->value);
    return launched(index, "fill");
}

__global__ void accumulate_k(void *dst, accel_dtype ddt, const void *src, accel_dtype sdt, kview sv, int64_t n) {
    GRID_STRIDE(i, n) accel__elem_set(dst, ddt, i, accel__elem_get(dst, ddt, i) + accel__elem_get(src, sdt, offset_of(sv, i)));
}

extern "C" accel_status accel__cudak_accumulate(accel_k_accumulate *a) {
    int index = a->out->device.index;
    int64_t n = accel_numel(a->out);
    if (!n) return ACCEL_OK;
    cudaStream_t s = accel__cuda_enter(index);
    accumulate_k<<<blocks_for(n), KTHREADS, 0, s>>>(a->out->data, a->out->dtype, a->in->data, a->in->dtype,
                                                    view_of(a->in), n);
    return launched(index, "accumulate");
}

/* ---- binary */

__device__ inline float float_op(accel__binop op, float x, float y) {
    switch (op) {
    case ACCEL_B_ADD: return x + y;
    case ACCEL_B_SUB: return x - y;
    case ACCEL_B_MUL: return x * y;
    case ACCEL_B_DIV: return x / y;
    }
    return 0.0f;
}

/* Integer arithmetic wraps (two's complement), as the CPU's. */
__device__ inline int64_t int_op(accel__binop op, int64_t x, int64_t y) {
    uint64_t ux = (uint64_t)x, uy = (uint64_t)y;
    switch (op) {
    case ACCEL_B_ADD: return (int64_t)(ux + uy);
    case ACCEL_B_SUB: return (int64_t)(ux - uy);
    case ACCEL_B_MUL: return (int64_t)(ux * uy);
    case ACCEL_B_DIV: return y ? x / y : 0;
    }
    return 0;
}

__global__ void binary_k(accel__binop op, void *out, accel_dtype odt, const void *a, accel_dtype adt, kview av,
                         const void *b, accel_dtype bdt, kview bv, int64_t n, bool is_float) {
    GRID_STRIDE(i, n) {
        int64_t oa = offset_of(av, i), ob = offset_of(bv, i);
        if (is_float) accel__elem_set(out, odt, i, float_op(op, load_f(a, adt, oa), load_f(b, bdt, ob)));
        else accel__store_i64(out, odt, i, int_op(op, accel__load_i64(a, adt, oa), accel__load_i64(b, bdt, ob)));
    }
}

/* The fast path: a, b and out contiguous, of one float type T and one shape. */
template <typename T> __global__ void binary_fast_k(accel__binop op, typename T::S *out, const typename T::S *a,
                                                   const typename T::S *b, int64_t n) {
    enum { V = 16 / sizeof(typename T::S) };
    int64_t nv = n / V;
    GRID_STRIDE(v, nv) {
        typename T::S x[V], y[V], z[V];
        load_vec(x, a + v * V);
        load_vec(y, b + v * V);
#pragma unroll
        for (int j = 0; j < V; j++) z[j] = T::put(float_op(op, T::get(x[j]), T::get(y[j])));
        store_vec(out + v * V, z);
    }
    GRID_STRIDE(i, n - nv * V) {
        int64_t k = nv * V + i;
        out[k] = T::put(float_op(op, T::get(a[k]), T::get(b[k])));
    }
}

static bool same_shape(const accel_tensor *a, const accel_tensor *b) {
    if (a->ndim != b->ndim) return false;
    for (int d = 0; d < a->ndim; d++)
        if (a->shape[d] != b->shape[d]) return false;
    return true;
}

extern "C" accel_status accel__cudak_binary(accel_k_binary *k) {
    int index = k->out->device.index;
    int64_t n = accel_numel(k->out);
    if (!n) return ACCEL_OK;
    cudaStream_t s = accel__cuda_enter(index);
    const accel_tensor *o = k->out;
    if (fast_operand(o) && fast_operand(k->a) && fast_operand(k->b) && k->a->dtype == o->dtype &&
        k->b->dtype == o->dtype && same_shape(k->a, o) && same_shape(k->b, o)) {
        by_float_type(o->dtype, [&](auto t) {
            typedef decltype(t) T;
            typedef typename T::S S;
            binary_fast_k<T><<<blocks_for(n / (16 / sizeof(S)) + 1), KTHREADS, 0, s>>>(
                k->op, (S *)o->data, (const S *)k->a->data, (const S *)k->b->data, n);
            return ACCEL_OK;
        });
        return launched(index, "binary");
    }
    binary_k<<<blocks_for(n), KTHREADS, 0, s>>>(k->op, o->data, o->dtype, k->a->data, k->a->dtype,
                                                broadcast_view(k->a, o->ndim, o->shape), k->b->data, k->b->dtype,
                                                broadcast_view(k->b, o->ndim, o->shape), n,
                                                accel_dtype_is_float(o->dtype));
    return launched(index, "binary");
}

/* ---- unary */

__global__ void unary_k(accel__unop op, float p, void *y, accel_dtype ydt, const void *x, accel_dtype xdt, kview xv,
                        int64_t n) {
    GRID_STRIDE(i, n) accel__elem_set(y, ydt, i, accel__unary_f(op, load_f(x, xdt, offset_of(xv, i)), p));
}

/* The fast path: x (type TX) and y (TY) contiguous. */
template <typename TX, typename TY>
__global__ void unary_fast_k(accel__unop op, float p, typename TY::S *y, const typename TX::S *x, int64_t n) {
    enum { V = vec_len<typename TX::S, typename TY::S>::V };
    int64_t nv = n / V;
    GRID_STRIDE(v, nv) {
        typename TX::S a[V];
        typename TY::S b[V];
        load_vec(a, x + v * V);
#pragma unroll
        for (int j = 0; j < V; j++) b[j] = TY::put(accel__unary_f(op, TX::get(a[j]), p));
        store_vec(y + v * V, b);
    }
    GRID_STRIDE(i, n - nv * V) y[nv * V + i] = TY::put(accel__unary_f(op, TX::get(x[nv * V + i]), p));
}

extern "C" accel_status accel__cudak_unary(accel_k_unary *k) {
    int index = k->out->device.index;
    int64_t n = accel_numel(k->x);
    if (!n) return ACCEL_OK;
    cudaStream_t s = accel__cuda_enter(index);
    if (fast_operand(k->out) && fast_operand(k->x)) {
        by_float_type(k->x->dtype, [&](auto tx) {
            return by_float_type(k->out->dtype, [&](auto ty) {
                typedef decltype(tx) TX;
                typedef decltype(ty) TY;
                int64_t threads = n / vec_len<typename TX::S, typename TY::S>::V + 1;
                unary_fast_k<TX, TY><<<blocks_for(threads), KTHREADS, 0, s>>>(
                    k->op, (float)k->p, (typename TY::S *)k->out->data, (const typename TX::S *)k->x->data, n);
                return ACCEL_OK;
            });
        });
        return launched(index, "unary");
    }
    unary_k<<<blocks_for(n), KTHREADS, 0, s>>>(k->op, (float)k->p, k->out->data, k->out->dtype, k->x->data,
                                               k->x->dtype, view_of(k->x), n);
    return launched(index, "unary");
}

__global__ void unary_grad_k(accel__unop op, float p, void *dx, accel_dtype dxdt, const void *g, accel_dtype gdt,
                             kview gv, const void *x, accel_dtype xdt, kview xv, const void *y, accel_dtype ydt,
                             kview yv, int64_t n) {
    GRID_STRIDE(i, n) {
        float d = accel__unary_df(op, load_f(x, xdt, offset_of(xv, i)), load_f(y, ydt, offset_of(yv, i)), p);
        accel__elem_set(dx, dxdt, i, load_f(g, gdt, offset_of(gv, i)) * d);
    }
}

extern "C" accel_status accel__cudak_unary_grad(accel_k_unary_grad *k) {
    int index = k->dx->device.index;
    int64_t n = accel_numel(k->x);
    if (!n) return ACCEL_OK;
    cudaStream_t s = accel__cuda_enter(index);
    unary_grad_k<<<blocks_for(n), KTHREADS, 0, s>>>(k->op, (float)k->p, k->dx->data, k->dx->dtype, k->g->data,
                                                    k->g->dtype, view_of(k->g), k->x->data, k->x->dtype,
                                                    view_of(k->x), k->y->data, k->y->dtype, view_of(k->y), n);
    return launched(index, "unary_grad");
}

__global__ void mask_scale_k(float *out, const float *x, const uint8_t *m, float scale, int64_t n) {
    GRID_STRIDE(i, n) out[i] = m[i] ? x[i] * scale : 0.0f;
}

extern "C" accel_status accel__cudak_mask_scale(accel_k_mask_scale *k) {
    int index = k->out->device.index;
    int64_t n = accel_numel(k->x);
    if (!n) return ACCEL_OK;
    cudaStream_t s = accel__cuda_enter(index);
    mask_scale_k<<<blocks_for(n), KTHREADS, 0, s>>>((float *)k->out->data, (const float *)k->x->data,
                                                    (const uint8_t *)k->mask->data, k->scale, n);
    return launched(index, "mask_scale");
}

/* ---- SwiGLU (kernels.h's rules: silu(gate) and g * up rounded to gate's
 * dtype, as the unfused ops round them; each tensor in its own dtype) */

__device__ inline float rounded_to(float v, accel_dtype dt) { return (float)accel__round_to(v, dt); }

/* d[i] (+)= v in d's dtype (beta 0 overwrites, 1 adds). */
__device__ inline void store_beta(void *d, accel_dtype dt, int64_t i, float v, float beta) {
    accel__elem_set(d, dt, i, beta != 0.0f ? load_f(d, dt, i) + v : v);
}

__global__ void swiglu_k(void *out, accel_dtype odt, const void *gate, accel_dtype gdt, const void *up,
                         accel_dtype udt, int64_t n) {
    GRID_STRIDE(i, n) {
        float x = load_f(gate, gdt, i);
        accel__elem_set(out, odt, i, rounded_to(x * accel__sigmoidf(x), gdt) * load_f(up, udt, i));
    }
}

extern "C" accel_status accel__cudak_swiglu(accel_k_swiglu *k) {
    int index = k->out->device.index;
    int64_t n = accel_numel(k->out);
    if (!n) return ACCEL_OK;
    cudaStream_t s = accel__cuda_enter(index);
    swiglu_k<<<blocks_for(n), KTHREADS, 0, s>>>(k->out->data, k->out->dtype, k->gate->data, k->gate->dtype,
                                                k->up->data, k->up->dtype, n);
    return launched(index, "swiglu");
}

/* dgate, dup optional (NULL: not computed); their dtypes are read only when present. */
__global__ void swiglu_backward_k(void *dgate, accel_dtype dgdt, float dgate_beta, void *dup, accel_dtype dudt,
                                  float dup_beta, const void *g, accel_dtype gdt, const void *gate,
                                  accel_dtype xdt, const void *up, accel_dtype udt, int64_t n) {
    GRID_STRIDE(i, n) {
        float x = load_f(gate, xdt, i), gi = load_f(g, gdt, i), s = accel__sigmoidf(x);
        if (dgate)
            store_beta(dgate, dgdt, i, rounded_to(gi * load_f(up, udt, i), xdt) * (s * (1.0f + x * (1.0f - s))),
                       dgate_beta);
        if (dup) store_beta(dup, dudt, i, gi * rounded_to(x * s, xdt), dup_beta);
    }
}

extern "C" accel_status accel__cudak_swiglu_backward(accel_k_swiglu_backward *k) {
    int index = k->gate->device.index;
    int64_t n = accel_numel(k->gate);
    if (!n || (!k->dgate && !k->dup)) return ACCEL_OK;
    cudaStream_t s = accel__cuda_enter(index);
    const accel_tensor *dg = k->dgate, *du = k->dup;
    swiglu_backward_k<<<blocks_for(n), KTHREADS, 0, s>>>(
        dg ? dg->data : NULL, dg ? dg->dtype : ACCEL_F32, k->dgate_beta, du ? du->data : NULL,
        du ? du->dtype : ACCEL_F32, k->dup_beta, k->g->data, k->g->dtype, k->gate->data, k->gate->dtype,
        k->up->data, k->up->dtype, n);
    return launched(index, "swiglu_backward");
}

/* ---- metrics: compare and where (the CPU's rules: core/dtype_elem.h's
 * accel__round_to and cpu_kernels.h's accel__cmp_f/i) */

__global__ void compare_k(accel__cmpop op, uint8_t *out, const void *a, accel_dtype adt, kview av, const void *b,
                          accel_dtype bdt, kview bv, int64_t n, bool is_float, accel_dtype dt, double sf, int64_t si) {
    GRID_STRIDE(i, n) {
        int64_t oa = offset_of(av, i), ob = b ? offset_of(bv, i) : 0;
        bool r;
        if (is_float) {
            double x = accel__round_to(accel__elem_get(a, adt, oa), dt);
            r = accel__cmp_f(op, x, b ? accel__round_to(accel__elem_get(b, bdt, ob), dt) : sf);
        } else {
            r = accel__cmp_i(op, accel__load_i64(a, adt, oa), b ? accel__load_i64(b, bdt, ob) : si);
        }
        out[i] = r;
    }
}

extern "C" accel_status accel__cudak_compare(accel_k_compare *k) {
    int index = k->out->device.index;
    int64_t n = accel_numel(k->out);
    if (!n) return ACCEL_OK;
    cudaStream_t s = accel__cuda_enter(index);
    const accel_tensor *o = k->out;
    bool is_float = accel_dtype_is_float(k->dt);
    kview bv = k->b ? broadcast_view(k->b, o->ndim, o->shape) : kview{};
    compare_k<<<blocks_for(n), KTHREADS, 0, s>>>(k->op, (uint8_t *)o->data, k->a->data, k->a->dtype,
                                                 broadcast_view(k->a, o->ndim, o->shape), k->b ? k->b->data : NULL,
                                                 k->b ? k->b->dtype : ACCEL_F32, bv, n, is_float, k->dt,
                                                 accel__round_to(k->scalar, k->dt),
                                                 is_float ? 0 : (int64_t)k->scalar);
    return launched(index, "compare");
}

__global__ void where_k(void *out, accel_dtype odt, const void *c, accel_dtype cdt, kview cv, const void *a,
                        accel_dtype adt, kview av, const void *b, accel_dtype bdt, kview bv, int64_t n, bool is_float) {
    GRID_STRIDE(i, n) {
        bool pick_a = accel__load_i64(c, cdt, offset_of(cv, i)) != 0;
        const void *src = pick_a ? a : b;
        accel_dtype sdt = pick_a ? adt : bdt;
        int64_t off = offset_of(pick_a ? av : bv, i);
        if (is_float) accel__elem_set(out, odt, i, accel__elem_get(src, sdt, off));
        else accel__store_i64(out, odt, i, accel__load_i64(src, sdt, off));
    }
}

extern "C" accel_status accel__cudak_where(accel_k_where *k) {
    int index = k->out->device.index;
    int64_t n = accel_numel(k->out);
    if (!n) return ACCEL_OK;
    cudaStream_t s = accel__cuda_enter(index);
    const accel_tensor *o = k->out;
    where_k<<<blocks_for(n), KTHREADS, 0, s>>>(o->data, o->dtype, k->cond->data, k->cond->dtype,
                                               broadcast_view(k->cond, o->ndim, o->shape), k->a->data, k->a->dtype,
                                               broadcast_view(k->a, o->ndim, o->shape), k->b->data, k->b->dtype,
                                               broadcast_view(k->b, o->ndim, o->shape), n,
                                               accel_dtype_is_float(o->dtype));
    return launched(index, "where");
}

/* ---- bias */

__global__ void bias_rows_k(float *out, const float *bias, int64_t R, int64_t O) {
    GRID_STRIDE(i, R * O) out[i] = bias[i % O];
}

extern "C" accel_status accel__cudak_bias_rows(accel_k_bias_rows *k) {
    int index = k->out->device.index;
    if (!k->R || !k->O) return ACCEL_OK;
    cudaStream_t s = accel__cuda_enter(index);
    bias_rows_k<<<blocks_for(k->R * k->O), KTHREADS, 0, s>>>((float *)k->out->data, (const float *)k->bias->data,
                                                             k->R, k->O);
    return launched(index, "bias_rows");
}

/* One thread per column, walking the rows: coalesced across the warp. */
__global__ void col_sum_k(float *out, const float *g, int64_t R, int64_t O, float beta) {
    GRID_STRIDE(j, O) {
        float acc = 0.0f;
        for (int64_t r = 0; r < R; r++) acc += g[r * O + j];
        out[j] = (beta == 0.0f ? 0.0f : beta * out[j]) + acc;
    }
}

extern "C" accel_status accel__cudak_col_sum(accel_k_col_sum *k) {
    int index = k->out->device.index;
    if (!k->O) return ACCEL_OK;
    cudaStream_t s = accel__cuda_enter(index);
    col_sum_k<<<blocks_for(k->O), KTHREADS, 0, s>>>((float *)k->out->data, (const float *)k->g->data, k->R, k->O,
                                                    k->beta);
    return launched(index, "col_sum");
}

/* C[M, N] (leading dim ldc, of T's dtype) = beta C (+ bias[N] in every
 * row), summed in f32 and rounded once into C: a GEMM with K = 0, a bias
 * put first, a bias rounded to C's dtype (gemm.c). With beta 0 and a bias,
 * C is the bias itself. */
template <typename T>
__global__ void scale_rows_k(typename T::S *c, int64_t M, int64_t N, int64_t ldc, float beta, const float *bias) {
    GRID_STRIDE(i, M * N) {
        typename T::S *p = c + (i / N) * ldc + i % N;
        float v = bias ? bias[i % N] : 0.0f;
        if (beta != 0.0f) v += beta * T::get(*p);
        *p = T::put(v);
    }
}

extern "C" accel_status accel__cuda_scale_rows(int index, void *c, accel_dtype dt, int64_t M, int64_t N, int64_t ldc,
                                               float beta, const float *bias) {
    cudaStream_t s = accel__cuda_enter(index);
    by_float_type(dt, [&](auto t) {
        typedef decltype(t) T;
        scale_rows_k<T><<<blocks_for(M * N), KTHREADS, 0, s>>>((typename T::S *)c, M, N, ldc, beta, bias);
        return ACCEL_OK;
    });
    return launched(index, "gemm");
}
