/* A 16-bit weight packed into oneDNN's pair-interleaved blocked layout by
 * accel itself (accel__pair_layout, gemm.h), in place of oneDNN's reorder
 * primitive: the same bytes (a permutation of the weight's elements), at a
 * fraction of the reorder's cost. An optimizer step repacks every bf16 weight
 * twice (its NT and NN forms, core/prepared.h); oneDNN's generic reorder
 * ran at ~3 GB/s on them (docs/cpu.md "Packing the weights"). */
#ifndef ACCEL_BACKENDS_CPU_PAIR_PACK_H
#define ACCEL_BACKENDS_CPU_PAIR_PACK_H

#include "backends/cpu/gemm.h"

/* Writes op(B) [K, N] of the dense 16-bit B (stored [N, K] when trans_b,
 * else [K, N]) into dst (4-byte aligned) in layout l (l->k_block != 0; K and
 * N multiples of its blocks): every element once, each of the layout's K x N
 * elements written. */
void accel__pair_pack(const accel__pair_layout *l, bool trans_b, int64_t N, int64_t K, const uint16_t *B,
                      uint16_t *dst);

/* Whether the weights' forms are packed by accel__pair_pack where their
 * layout allows (default on), else always by oneDNN's reorder (tests compare
 * the two). Returns the previous setting. */
bool accel__pair_pack_set_enabled(bool on);
bool accel__pair_pack_enabled(void);
/* accel__pair_pack's calls so far, process-wide (the tests' evidence of the
 * path the library took). */
uint64_t accel__pair_pack_calls(void);

#endif
