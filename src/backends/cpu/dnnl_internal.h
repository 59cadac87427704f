/* What the oneDNN plug-in's files share (not the core's: dnnl_hooks.h is
 * that): gemm_dnnl.c's table of primitives, which conv_dnnl.c's
 * convolutions are kept in beside the GEMMs' matmuls, its engine and its
 * execution with a per-call scratchpad. */
#ifndef ACCEL_BACKENDS_CPU_DNNL_INTERNAL_H
#define ACCEL_BACKENDS_CPU_DNNL_INTERNAL_H

#include <dnnl.h>

#include "backends/cpu/dnnl_hooks.h"

/* What a table entry holds. */
typedef enum entry_kind {
    KIND_MATMUL,        /* a matmul primitive, B plain */
    KIND_MATMUL_PACKED, /* a matmul primitive reading B in the weight layout of its (dtype, trans_b, N, K) */
    KIND_LAYOUT,        /* the weight layout of (dtype, trans_b, N, K); no primitive */
    KIND_PACK,          /* the reorder of a plain B into that layout */
    KIND_CONV,          /* a convolution pass's primitive (conv_dnnl.c) */
    KIND_CONV_REORDER,  /* the reorder of one of its arguments between plain memory and its layout */
} entry_kind;

/* A convolution's part of a key (conv_dnnl.c): accel__conv_call's shape,
 * pass and dtypes, and for a reorder which argument and whether it adds to
 * its destination. */
typedef struct dnnl_conv_key {
    int64_t N, C, H, W, O, G, kh, kw, sh, sw, ph, pw, dh, dw;
    int32_t pass, y_dtype, bias;
    int32_t arg, accumulate; /* KIND_CONV_REORDER's: DNNL_ARG_*, 1 for a sum into the destination */
} dnnl_conv_key;

/* Everything an entry depends on. Compared with memcmp: always built
 * from a zeroed struct. */
typedef struct dnnl_key {
    union {
        struct { /* a GEMM's, a weight layout's */
            int64_t M, N, K, lda, ldb, ldc;
            uint32_t alpha_bits, beta_bits;
            int32_t c_dtype; /* C's: f32, or (a linear's bf16/f16 output) dtype's */
            int32_t trans_a, trans_b;
        };
        dnnl_conv_key conv;
    };
    int32_t threads;
    int32_t dtype;
    int32_t kind; /* entry_kind */
} dnnl_key;

/* A table entry. A GEMM's a_md, b_md, c_md are op(A), op(B) as stored and
 * C; a convolution's (KIND_CONV) the source side (src, diff_src), the
 * weights side (weights, diff_weights) and the destination side (dst,
 * diff_dst) in the layouts its primitive reads and writes, w_md its bias
 * (plain [O]); a reorder (KIND_PACK, KIND_CONV_REORDER) goes from b_md to
 * w_md. */
typedef struct dnnl_entry {
    dnnl_key key;
    /* NULL for a layout, and for a packed matmul or a convolution that
     * oneDNN would only run as its reference loop (the caller then runs its
     * own) */
    dnnl_primitive_t prim;
    dnnl_memory_desc_t a_md, b_md, c_md;
    dnnl_memory_desc_t w_md;  /* op(B) in the weight layout (a GEMM's kinds but KIND_MATMUL) */
    size_t layout_bytes;      /* KIND_LAYOUT: w_md's size; 0 when w_md is b_md's layout */
    accel__pair_layout pairs; /* KIND_LAYOUT: w_md as a pair layout (gemm.h), or k_block 0 */
    size_t scratch_bytes;
    char impl[64]; /* oneDNN's implementation name, e.g. "brg:avx512_core_amx" */
} dnnl_entry;

/* The engine, made at the first call; NULL with the error set (naming op)
 * when oneDNN could not make one. */
dnnl_engine_t accel__onednn_engine(const char *op);
/* An error "<op>: oneDNN <what> failed (<status>)" (OOM for
 * dnnl_out_of_memory); returns its status. */
accel_status accel__onednn_error(const char *op, const char *what, dnnl_status_t s);
/* The op an entry of key k serves, for its errors: accel_conv2d or accel_gemm. */
const char *accel__onednn_op(const dnnl_key *k);
dnnl_data_type_t accel__onednn_dtype(accel_dtype dt);
/* The thread count a primitive made now plans for: 1 inside a parallel
 * region, else OpenMP's. */
int32_t accel__onednn_threads(void);
/* Attributes: alpha as the output scale, beta as a sum post-op, a
 * scratchpad the caller passes in. */
dnnl_status_t accel__onednn_attributes(float alpha, float beta, dnnl_primitive_attr_t *out);
/* The primitive of pd into e (with its implementation's name and
 * scratchpad size). */
dnnl_status_t accel__onednn_primitive_from(dnnl_primitive_desc_t pd, dnnl_entry *e);
/* Whether impl is oneDNN's reference loop ("ref:..."). */
bool accel__onednn_reference_impl(const char *impl);
/* The reorder of e->b_md into e->w_md, adding to the destination (a sum
 * post-op) when beta is 1; *what names the step that failed. */
dnnl_status_t accel__onednn_reorder_create(dnnl_entry *e, float beta, const char **what);

/* Fills e (zeroed, e->key set) with what its key names; ACCEL_OK or the
 * error set (e->prim NULL then). */
typedef accel_status (*accel__onednn_create_fn)(const void *ctx, dnnl_entry *e);
/* The entry of k: the cached one, or one made by create(ctx) at k's first
 * use and kept for the process; *local with a primitive of its own when the
 * table is full (the caller destroys local->prim after the call). NULL with
 * the error set. */
const dnnl_entry *accel__onednn_entry_get(const dnnl_key *k, accel__onednn_create_fn create, const void *ctx,
                                          dnnl_entry *local);

/* One argument of a primitive: its oneDNN argument index, descriptor (one
 * of a table entry's, which lives as long as the process) and memory. */
typedef struct accel__onednn_arg {
    int arg;
    const dnnl_memory_desc_t *md;
    const void *p;
} accel__onednn_arg;

/* Runs e's primitive on n (at most 4) arguments with a scratchpad of its
 * own from the step arena for the call; what names it in an error. */
accel_status accel__onednn_execute(const dnnl_entry *e, int n, const accel__onednn_arg *in, const char *what);

#endif
