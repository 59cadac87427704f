/* Embedding lookup (rows of a weight picked by ids) and its scatter-add backward. */
#include <omp.h>
#include <string.h>

#include "cpu_kernels.h"

accel_status accel__cpuk_embedding(accel_k_embedding *k) {
    const int64_t *id = k->ids->data;
    int64_t n = k->n, D = k->D;
    for (int64_t i = 0; i < n; i++)
        if (id[i] < 0 || id[i] >= k->V)
            return accel_set_error(ACCEL_ERR_INVALID_ARG,
                                   "accel_embedding: id %lld at position %lld is out of range for %lld embeddings",
                                   (long long)id[i], (long long)i, (long long)k->V);
    accel_dtype dt = k->w->dtype;
    size_t es = accel_dtype_size(dt), row = (size_t)D * es;
    const char *wp = k->w->data;
    char *op = k->out->data;
    if (accel_reference_kernels()) {
        for (int64_t i = 0; i < n; i++)
            for (int64_t j = 0; j < D; j++)
                accel__store_elem(op, dt, (size_t)(i * D + j), accel__load_elem(wp, dt, (size_t)(id[i] * D + j)));
    } else {
#pragma omp parallel for if (n * D > 65536) schedule(static)
        for (int64_t i = 0; i < n; i++) memcpy(op + (size_t)i * row, wp + (size_t)id[i] * row, row);
    }
    return ACCEL_OK;
}

accel_status accel__cpuk_embedding_backward(accel_k_embedding_backward *k) {
    const int64_t *ids = k->ids->data;
    const float *g = k->g->data;
    float *gw = k->gw->data;
    int64_t n = k->n, D = k->D;
    /* Scatter-add; ids may repeat, so threads split the columns, not the ids. */
#pragma omp parallel if (n * D > 65536)
    {
        int nt = omp_get_num_threads(), me = omp_get_thread_num();
        int64_t c0 = D * me / nt, c1 = D * (me + 1) / nt;
        for (int64_t i = 0; i < n; i++) {
            if (ids[i] == k->pad) continue; /* padding_idx: no gradient */
            float *dst = gw + ids[i] * D;
            const float *src = g + i * D;
            for (int64_t j = c0; j < c1; j++) dst[j] += src[j];
        }
    }
    return ACCEL_OK;
}
