/* Philox draws, RoPE, embedding, RMSNorm and LayerNorm, forward and backward. */
#include "core/philox.h"
#include "cuda_common.cuh"

/* ---- random: Philox-4x32-10 from core/philox.h, the function the CPU
 * draws with (the GPU test compares the draws with the CPU's bit for bit). */

__global__ void rng_k(void *out, accel_dtype dt, int64_t n, accel_k_rng_kind kind, uint64_t seed, uint64_t base,
                      double a, double b) {
    GRID_STRIDE(i, n) {
        uint32_t w[4];
        accel__philox(seed, base + (uint64_t)i, w);
        switch (kind) {
        case ACCEL_K_RNG_NORMAL: {
            double u1 = 1.0 - accel__u32_to_unit(w[0], w[1]), u2 = accel__u32_to_unit(w[2], w[3]);
            accel__elem_set(out, dt, i, a + b * (sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2)));
            break;
        }
        case ACCEL_K_RNG_UNIFORM: accel__elem_set(out, dt, i, a + (b - a) * accel__u32_to_unit(w[0], w[1])); break;
        case ACCEL_K_RNG_BERNOULLI: ((uint8_t *)out)[i] = accel__u32_to_unit(w[0], w[1]) < a; break;
        }
    }
}

extern "C" accel_status accel__cudak_rng(accel_k_rng *k) {
    int index = k->out->device.index;
    int64_t n = accel_numel(k->out);
    if (!n) return ACCEL_OK;
    cudaStream_t s = accel__cuda_enter(index);
    rng_k<<<blocks_for(n), KTHREADS, 0, s>>>(k->out->data, k->out->dtype, n, k->kind, k->seed, k->offset, k->a, k->b);
    return launched(index, "rng");
}

/* ---- RoPE (transformers' rotate_half layout) */

/* angle = f32(pos) * inv_freq, cos/sin times the scale, in f32 as the CPU. */
__global__ void rope_tables_k(float *c, float *sn, const float *inv, int64_t T, int64_t half, int64_t pos0,
                              float scale) {
    GRID_STRIDE(e, T * half) {
        int64_t t = e / half, i = e % half;
        float ang = (float)(pos0 + t) * inv[i];
        c[e] = cosf(ang) * scale;
        sn[e] = sinf(ang) * scale;
    }
}

extern "C" accel_status accel__cudak_rope_tables(accel_k_rope_tables *k) {
    int index = k->cos->device.index;
    if (!k->T || !k->half) return ACCEL_OK;
    cudaStream_t s = accel__cuda_enter(index);
    rope_tables_k<<<blocks_for(k->T * k->half), KTHREADS, 0, s>>>((float *)k->cos->data, (float *)k->sin->data,
                                                                  (const float *)k->inv_freq->data, k->T, k->half,
                                                                  k->pos0, k->scale);
    return launched(index, "rope_tables");
}

/* x [B, H, T, D] at strides xs (any float dtype), y contiguous (any float dtype). */
__global__ void rope_k(void *y, accel_dtype ydt, const void *x, accel_dtype xdt, int64_t H, int64_t xs0, int64_t xs1,
                       int64_t xs2, int64_t xs3, const float *cs, const float *sn, int64_t BH, int64_t T, int64_t half,
                       float sign, float beta) {
    GRID_STRIDE(e, BH * T * half) {
        int64_t r = e / half, i = e % half, t = r % T, bh = r / T;
        int64_t xr = (bh / H) * xs0 + (bh % H) * xs1 + t * xs2, yr = r * 2 * half;
        float c = cs[t * half + i], si = sign * sn[t * half + i];
        float x1 = load_f(x, xdt, xr + i * xs3), x2 = load_f(x, xdt, xr + (i + half) * xs3);
        float a = x1 * c - x2 * si, b = x2 * c + x1 * si;
        if (beta != 0.0f) {
            a += load_f(y, ydt, yr + i);
            b += load_f(y, ydt, yr + i + half);
        }
        accel__elem_set(y, ydt, yr + i, a);
        accel__elem_set(y, ydt, yr + i + half, b);
    }
}

extern "C" accel_status accel__cudak_rope(accel_k_rope *k) {
    int index = k->y->device.index;
    int64_t n = k->BH * k->T * k->half;
    if (!n) return ACCEL_OK;
    cudaStream_t s = accel__cuda_enter(index);
    const accel_tensor *x = k->x;
    rope_k<<<blocks_for(n), KTHREADS, 0, s>>>(k->y->data, k->y->dtype, x->data, x->dtype, x->shape[1], x->stride[0],
                                              x->stride[1], x->stride[2], x->stride[3], (const float *)k->cos->data,
                                              (const float *)k->sin->data, k->BH, k->T, k->half, k->sign, k->beta);
    return launched(index, "rope");
}

/* ---- embedding */

/* First position whose id is outside [0, V) (INT64_MAX when none). */
__global__ void bad_id_k(const int64_t *ids, int64_t n, int64_t V, long long *bad) {
    GRID_STRIDE(i, n) if (ids[i] < 0 || ids[i] >= V) atomicMin(bad, (long long)i);
}

__global__ void init_ll_k(long long *p, long long v) { *p = v; }

/* The ids are checked without a host wait (checks.cu): an id out of range
 * is an error naming it at the device's next synchronisation, never a read
 * outside w (its output row is zeros). */
static accel_status check_ids(int index, cudaStream_t s, const int64_t *ids, int64_t n, int64_t V) {
    long long *bad = (long long *)accel__cuda_step_alloc(index, sizeof *bad, 256);
    if (!bad) return accel_last_status();
    init_ll_k<<<1, 1, 0, s>>>(bad, INT64_MAX);
    bad_id_k<<<blocks_for(n), KTHREADS, 0, s>>>(ids, n, V, bad);
    if (launched(index, "embedding") != ACCEL_OK) return accel_last_status();
    return accel__cuda_check_report(index, s, ACCEL_CUDA_CHECK_EMBEDDING, bad, ids, V);
}

__global__ void embedding_k(char *out, const char *w, const int64_t *ids, int64_t n, int64_t D, int64_t V, int es) {
    GRID_STRIDE(e, n * D * es) {
        int64_t row_bytes = D * es, i = e / row_bytes, b = e % row_bytes, id = ids[i];
        out[e] = id >= 0 && id < V ? w[id * row_bytes + b] : 0;
    }
}

extern "C" accel_status accel__cudak_embedding(accel_k_embedding *k) {
    int index = k->out->device.index;
    if (!k->n) return ACCEL_OK;
    cudaStream_t s = accel__cuda_enter(index);
    const int64_t *ids = (const int64_t *)k->ids->data;
    if (check_ids(index, s, ids, k->n, k->V) != ACCEL_OK) return accel_last_status();
    int es = (int)accel_dtype_size(k->w->dtype);
    embedding_k<<<blocks_for(k->n * k->D * es), KTHREADS, 0, s>>>((char *)k->out->data, (const char *)k->w->data, ids,
                                                                  k->n, k->D, k->V, es);
    return launched(index, "embedding");
}

/* Scatter-add with atomics: ids repeat. An id out of [0, V) adds nothing
 * (the forward reported it; its report may not have been read yet), nor
 * does pad (padding_idx; -1: none). */
__global__ void embedding_backward_k(float *gw, const float *g, const int64_t *ids, int64_t n, int64_t D, int64_t V,
                                     int64_t pad) {
    GRID_STRIDE(e, n * D) {
        int64_t id = ids[e / D];
        if (id >= 0 && id < V && id != pad) atomicAdd(&gw[id * D + e % D], g[e]);
    }
}

extern "C" accel_status accel__cudak_embedding_backward(accel_k_embedding_backward *k) {
    int index = k->gw->device.index;
    if (!k->n || !k->D) return ACCEL_OK;
    cudaStream_t s = accel__cuda_enter(index);
    embedding_backward_k<<<blocks_for(k->n * k->D), KTHREADS, 0, s>>>((float *)k->gw->data, (const float *)k->g->data,
                                                                      (const int64_t *)k->ids->data, k->n, k->D,
                                                                      k->gw->shape[0], k->pad);
    return launched(index, "embedding_backward");
}

/* ---- RMSNorm (transformers' LlamaRMSNorm): one block per row */

__global__ void rms_norm_k(float *y, float *rstd, const float *x, const float *w, int64_t R, int64_t D, float eps,
                           accel_dtype xdt) {
    ROW_LOOP(r, R) {
        const float *xr = x + r * D;
        float acc = 0.0f;
        for (int64_t j = threadIdx.x; j < D; j += blockDim.x) acc += xr[j] * xr[j];
        float s = 1.0f / sqrtf(block_sum(acc) / (float)D + eps);
        if (threadIdx.x == 0) rstd[r] = s;
        for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
            float v = (float)accel__round_to(xr[j] * s, xdt);
            y[r * D + j] = w ? w[j] * v : v;
        }
    }
}

extern "C" accel_status accel__cudak_rms_norm(accel_k_rms_norm *k) {
    int index = k->y->device.index;
    if (k->y16) /* the CPU kernel's fusion (kernels.h): the op asks no device for it */
        return accel_set_error(ACCEL_ERR_UNSUPPORTED, "rms_norm: the rounded copy y16 is the CPU kernel's");
    if (!k->R) return ACCEL_OK;
    cudaStream_t s = accel__cuda_enter(index);
    rms_norm_k<<<row_blocks(k->R), KTHREADS, 0, s>>>((float *)k->y->data, (float *)k->rstd->data,
                                                    (const float *)k->x->data, k->w ? (const float *)k->w->data : NULL,
                                                    k->R, k->D, k->eps, k->x_dt);
    return launched(index, "rms_norm");
}

/* dx[r] (+)= s (gw - x s mean(gw x s)), gw = g * w. */
__global__ void rms_dx_k(float *dx, const float *g, const float *x, const float *w, const float *rstd, int64_t R,
                         int64_t D, float beta) {
    ROW_LOOP(r, R) {
        const float *xr = x + r * D, *gr = g + r * D;
        float s = rstd[r], acc = 0.0f;
        for (int64_t j = threadIdx.x; j < D; j += blockDim.x) acc += (w ? gr[j] * w[j] : gr[j]) * xr[j];
        float c = s * s * block_sum(acc) / (float)D;
        for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
            float v = s * (w ? gr[j] * w[j] : gr[j]) - xr[j] * (s * c);
            dx[r * D + j] = beta == 0.0f ? v : dx[r * D + j] + v;
        }
    }
}

/* ---- norm weight gradients: column sums over the rows in two steps, each
 * in a fixed order (the same bits every run; no atomics). Blocks of 32
 * columns x 8 row lanes each sum one chunk of rows into step memory
 * (part[chunk][column]), then one thread per column adds the chunks up in
 * order. */

enum { NORM_COLS = 32, NORM_LANES = KTHREADS / NORM_COLS, NORM_CHUNK_ROWS = 64, NORM_MAX_CHUNKS = 256 };

/* Chunks of rows: n of `rows` rows each (the last ones shorter or empty). */
struct row_chunks {
    int64_t n, rows;
};

static row_chunks chunks_of(int64_t R) {
    int64_t n = (R + NORM_CHUNK_ROWS - 1) / NORM_CHUNK_ROWS;
    if (n > NORM_MAX_CHUNKS) n = NORM_MAX_CHUNKS;
    return row_chunks{n, (R + n - 1) / n};
}

/* part_w[c][j] = sum over chunk c (blockIdx.y) of RMSNorm's g * round(x *
 * rstd, xdt), or (layer) LayerNorm's g * (x - mean) * rstd and part_b[c][j]
 * = sum of g. */
template <bool layer>
__global__ void __launch_bounds__(KTHREADS)
    norm_dw_part_k(float *part_w, float *part_b, const float *g, const float *x, const float *mean,
                   const float *rstd, int64_t R, int64_t D, int64_t rows, accel_dtype xdt) {
    __shared__ float lw[NORM_LANES][NORM_COLS], lb[NORM_LANES][NORM_COLS];
    const int tx = threadIdx.x % NORM_COLS, ty = threadIdx.x / NORM_COLS;
    const int64_t j = (int64_t)blockIdx.x * NORM_COLS + tx, r0 = (int64_t)blockIdx.y * rows;
    const int64_t r1 = r0 + rows < R ? r0 + rows : R;
    float aw = 0.0f, ab = 0.0f;
    for (int64_t r = r0 + ty; j < D && r < r1; r += NORM_LANES) {
        const float gv = g[r * D + j];
        if (layer) {
            aw += gv * (x[r * D + j] - mean[r]) * rstd[r];
            ab += gv;
        } else {
            aw += gv * (float)accel__round_to(x[r * D + j] * rstd[r], xdt);
        }
    }
    lw[ty][tx] = aw;
    lb[ty][tx] = ab;
    __syncthreads();
    if (ty != 0 || j >= D) return;
    for (int t = 1; t < NORM_LANES; t++) {
        aw += lw[t][tx];
        ab += lb[t][tx];
    }
    part_w[(int64_t)blockIdx.y * D + j] = aw;
    if (part_b) part_b[(int64_t)blockIdx.y * D + j] = ab;
}

/* dst[j] += sum over the n chunks of part[c][j], in chunk order. */
__global__ void add_chunks_k(float *dst, const float *part, int64_t n, int64_t D) {
    GRID_STRIDE(j, D) {
        float acc = 0.0f;
        for (int64_t c = 0; c < n; c++) acc += part[c * D + j];
        dst[j] += acc;
    }
}

/* dw (and db, each optional) += the column sums of a norm's weight (bias)
 * gradient terms over R rows of D: norm_dw_part_k's partials in step memory,
 * then add_chunks_k. */
template <bool layer>
static accel_status norm_dw(int index, cudaStream_t s, float *dw, float *db, const float *g, const float *x,
                            const float *mean, const float *rstd, int64_t R, int64_t D, accel_dtype xdt,
                            const char *op) {
    const row_chunks c = chunks_of(R);
    float *part = (float *)accel__cuda_step_alloc(index, (size_t)(c.n * D * (layer ? 2 : 1)) * sizeof(float), 256);
    if (!part) return accel_last_status();
    float *part_w = part, *part_b = layer ? part + c.n * D : NULL;
    dim3 grid((unsigned)((D + NORM_COLS - 1) / NORM_COLS), (unsigned)c.n);
    norm_dw_part_k<layer><<<grid, KTHREADS, 0, s>>>(part_w, part_b, g, x, mean, rstd, R, D, c.rows, xdt);
    if (dw) add_chunks_k<<<blocks_for(D), KTHREADS, 0, s>>>(dw, part_w, c.n, D);
    if (db) add_chunks_k<<<blocks_for(D), KTHREADS, 0, s>>>(db, part_b, c.n, D);
    return launched(index, op);
}

extern "C" accel_status accel__cudak_rms_norm_backward(accel_k_rms_norm_backward *k) {
    if (k->dx16) /* the CPU kernel's fusion (kernels.h): the op asks no device for it */
        return accel_set_error(ACCEL_ERR_UNSUPPORTED, "rms_norm_backward: the rounded copy dx16 is the CPU kernel's");
    int index = k->g->device.index;
    if (!k->R || !k->D) return ACCEL_OK;
    cudaStream_t s = accel__cuda_enter(index);
    const float *g = (const float *)k->g->data, *x = (const float *)k->x->data, *rstd = (const float *)k->rstd->data;
    const float *w = k->w ? (const float *)k->w->data : NULL;
    if (k->dx) rms_dx_k<<<row_blocks(k->R), KTHREADS, 0, s>>>((float *)k->dx->data, g, x, w, rstd, k->R, k->D, k->dx_beta);
    accel_status st = launched(index, "rms_norm_backward");
    if (st != ACCEL_OK || !k->dw) return st;
    return norm_dw<false>(index, s, (float *)k->dw->data, NULL, g, x, NULL, rstd, k->R, k->D, k->x_dt,
                          "rms_norm_backward");
}

/* ---- LayerNorm: one block per row, two passes (mean, then variance) as the CPU */

__global__ void layer_norm_k(float *y, float *mean, float *rstd, const float *x, const float *w, const float *b,
                             int64_t R, int64_t D, float eps) {
    ROW_LOOP(r, R) {
        const float *xr = x + r * D;
        float acc = 0.0f;
        for (int64_t j = threadIdx.x; j < D; j += blockDim.x) acc += xr[j];
        float mu = block_sum(acc) / (float)D;
        acc = 0.0f;
        for (int64_t j = threadIdx.x; j < D; j += blockDim.x) acc += (xr[j] - mu) * (xr[j] - mu);
        float s = 1.0f / sqrtf(block_sum(acc) / (float)D + eps);
        if (threadIdx.x == 0) {
            mean[r] = mu;
            rstd[r] = s;
        }
        for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
            float v = (xr[j] - mu) * s;
            if (w) v *= w[j];
            if (b) v += b[j];
            y[r * D + j] = v;
        }
    }
}

extern "C" accel_status accel__cudak_layer_norm(accel_k_layer_norm *k) {
    int index = k->y->device.index;
    if (!k->R) return ACCEL_OK;
    cudaStream_t s = accel__cuda_enter(index);
    layer_norm_k<<<row_blocks(k->R), KTHREADS, 0, s>>>((float *)k->y->data, (float *)k->mean->data,
                                                      (float *)k->rstd->data, (const float *)k->x->data,
                                                      k->w ? (const float *)k->w->data : NULL,
                                                      k->b ? (const float *)k->b->data : NULL, k->R, k->D, k->eps);
    return launched(index, "layer_norm");
}

/* dx (+)= s (g w - mean(g w) - xhat mean(g w xhat)), xhat = (x - mu) s. */
__global__ void ln_dx_k(float *dx, const float *g, const float *x, const float *w, const float *mean,
                        const float *rstd, int64_t R, int64_t D, float beta) {
    ROW_LOOP(r, R) {
        const float *xr = x + r * D, *gr = g + r * D;
        float mu = mean[r], s = rstd[r], sg = 0.0f, sgx = 0.0f;
        for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
            float dxn = gr[j] * (w ? w[j] : 1.0f);
            sg += dxn;
            sgx += dxn * (xr[j] - mu) * s;
        }
        sg = block_sum(sg) / (float)D;
        sgx = block_sum(sgx) / (float)D;
        for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
            float v = s * (gr[j] * (w ? w[j] : 1.0f) - sg - (xr[j] - mu) * s * sgx);
            dx[r * D + j] = beta == 0.0f ? v : dx[r * D + j] + v;
        }
    }
}

extern "C" accel_status accel__cudak_layer_norm_backward(accel_k_layer_norm_backward *k) {
    int index = k->g->device.index;
    if (!k->R || !k->D) return ACCEL_OK;
    cudaStream_t s = accel__cuda_enter(index);
    const float *g = (const float *)k->g->data, *x = (const float *)k->x->data;
    const float *mean = (const float *)k->mean->data, *rstd = (const float *)k->rstd->data;
    if (k->dx)
        ln_dx_k<<<row_blocks(k->R), KTHREADS, 0, s>>>((float *)k->dx->data, g, x,
                                                     k->w ? (const float *)k->w->data : NULL, mean, rstd, k->R, k->D,
                                                     k->dx_beta);
    accel_status st = launched(index, "layer_norm_backward");
    if (st != ACCEL_OK || (!k->dw && !k->db)) return st;
    return norm_dw<true>(index, s, k->dw ? (float *)k->dw->data : NULL, k->db ? (float *)k->db->data : NULL, g, x,
                         mean, rstd, k->R, k->D, ACCEL_F32, "layer_norm_backward");
}
