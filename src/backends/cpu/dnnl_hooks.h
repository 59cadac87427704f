/* The oneDNN GEMM provider as a plug-in (backends/plugin.h): gemm_dnnl.c is
 * libaccel-dnnl.so, so that oneDNN (a C++ library whose loading costs ~15 ms
 * of relocations and static constructors) is mapped by the first GEMM that
 * asks about it, never by `accel --help` or `accel launch`. The core's
 * accel__dnnl_* (dnnl_client.c) forward to this table, which the plug-in's
 * init hands over; their contracts are gemm.h's. */
#ifndef ACCEL_BACKENDS_CPU_DNNL_HOOKS_H
#define ACCEL_BACKENDS_CPU_DNNL_HOOKS_H

#include "backends/cpu/gemm.h"

typedef struct accel__dnnl_hooks {
    __typeof__(accel__dnnl_gemm) *gemm;
    __typeof__(accel__dnnl_weight_layout) *weight_layout;
    __typeof__(accel__dnnl_weight_pack) *weight_pack;
    __typeof__(accel__dnnl_gemm_packed) *gemm_packed;
    __typeof__(accel__dnnl_impl) *impl;
    __typeof__(accel__dnnl_scratchpad) *scratchpad;
    __typeof__(accel__dnnl_supports) *supports;
    __typeof__(accel__dnnl_version) *version;
    __typeof__(accel__dnnl_conv) *conv;
} accel__dnnl_hooks;

/* The provider's functions (gemm_dnnl.c), the table's entries: named apart
 * from the core's forwarders, so that with ACCEL_BACKENDS_STATIC both live
 * in libaccel.a and the table does not point back at the forwarders. */
extern __typeof__(accel__dnnl_gemm) accel__onednn_gemm;
extern __typeof__(accel__dnnl_weight_layout) accel__onednn_weight_layout;
extern __typeof__(accel__dnnl_weight_pack) accel__onednn_weight_pack;
extern __typeof__(accel__dnnl_gemm_packed) accel__onednn_gemm_packed;
extern __typeof__(accel__dnnl_impl) accel__onednn_impl;
extern __typeof__(accel__dnnl_scratchpad) accel__onednn_scratchpad;
extern __typeof__(accel__dnnl_supports) accel__onednn_supports;
extern __typeof__(accel__dnnl_version) accel__onednn_version;
extern __typeof__(accel__dnnl_conv) accel__onednn_conv; /* conv_dnnl.c */

#endif
