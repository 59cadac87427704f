/* accel__pair_pack: a 16-bit op(B) [K, N] into blocks of k_block x n_block
 * elements, each laid out [k_block / 2][n_block][2]. Seen as 32-bit words,
 * a block is [k_block / 2][n_block] words, word (j, n) holding op(B)'s rows
 * 2j and 2j + 1 at column n (low half row 2j):
 *   - trans_b (B stored [N, K], op(B) = B^T): that word is B's row n's
 *     32-bit word j, so a block is the transpose of an n_block x k_block/2
 *     tile of B's words;
 *   - else (B stored [K, N]): it interleaves B's rows 2j and 2j + 1.
 *
 * The packed weight is read at the next forward, long after the optimizer's
 * step wrote it, so its stores bypass the caches (SSE2's streaming stores,
 * x86-64's baseline): a store that allocates its line first reads it from
 * memory, which doubled the pass's traffic (docs/cpu.md "Packing the
 * weights"). The transposed blocks are made in a buffer first (in order,
 * then streamed whole); the interleaved ones are streamed as made. Where a
 * block's rows are not 16-byte aligned, its sizes not multiples of 8 or
 * (transposed) it exceeds the buffer, and off x86, the elements are stored
 * one by one. One thread: on 2 cores two threads were no faster (cold
 * sources), nor once the refresh packed from the cache right after the
 * update (the optimizer's phase 51 -> 60 ms with two); not measured on more. */
#include "backends/cpu/pair_pack.h"

#include <stdatomic.h>
#include <string.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

/* The largest block made in a buffer and streamed, in words (16 KiB;
 * oneDNN's blocks are 32 x 64 elements: 1024 words). */
enum { STREAM_TILE_WORDS = 4096 };

static atomic_bool g_enabled = true;
static atomic_uint_fast64_t g_calls;

bool accel__pair_pack_set_enabled(bool on) { return atomic_exchange(&g_enabled, on); }
bool accel__pair_pack_enabled(void) { return atomic_load(&g_enabled); }
uint64_t accel__pair_pack_calls(void) { return atomic_load(&g_calls); }

/* Words of 2 x 16 bits, moved whole (memcpy: no aliasing or alignment
 * assumption; compilers make it one load). */
static inline uint32_t word_at(const uint16_t *p) {
    uint32_t w;
    memcpy(&w, p, sizeof w);
    return w;
}

/* Block (kb, nb) of op(B) = B^T, B [N, K]: out[j][n] = B's word (n0 + n, k0/2 + j). */
static void block_transposed(const accel__pair_layout *l, int64_t K, const uint16_t *B, int64_t kb, int64_t nb,
                             uint32_t *out) {
    int64_t jn = l->k_block / 2, bn = l->n_block;
    for (int64_t n = 0; n < bn; n++) {
        const uint16_t *row = B + (nb * bn + n) * K + kb * l->k_block;
        for (int64_t j = 0; j < jn; j++) out[j * bn + n] = word_at(row + 2 * j);
    }
}

/* Block (kb, nb) of op(B) = B, B [K, N]: element pair (j, n) = B[k0 + 2j][n0 + n], B[k0 + 2j + 1][n0 + n]. */
static void block_plain(const accel__pair_layout *l, int64_t N, const uint16_t *B, int64_t kb, int64_t nb,
                        uint32_t *out) {
    int64_t jn = l->k_block / 2, bn = l->n_block;
    for (int64_t j = 0; j < jn; j++) {
        const uint16_t *r0 = B + (kb * l->k_block + 2 * j) * N + nb * bn, *r1 = r0 + N;
        uint16_t *o = (uint16_t *)(void *)(out + j * bn);
        for (int64_t n = 0; n < bn; n++) o[2 * n] = r0[n], o[2 * n + 1] = r1[n];
    }
}

#ifdef __SSE2__
/* n words from the 16-byte aligned src streamed to the 16-byte aligned dst (n a multiple of 4). */
static void stream_words(uint32_t *dst, const uint32_t *src, int64_t n) {
    for (int64_t i = 0; i < n; i += 4) _mm_stream_si128((__m128i *)(dst + i), _mm_load_si128((const __m128i *)(src + i)));
}

/* block_transposed into the 16-byte aligned out, 4 x 4 words at a time:
 * four rows' 4 words loaded, transposed in registers (two rounds of
 * unpacks), stored as four 4-word pieces of out's rows j .. j + 3. The
 * scalar loop's load and store per word took ~2/3 of the NT forms' packing
 * time. jn and bn multiples of 4 (the streamed path's blocks). */
static void block_transposed_4x4(const accel__pair_layout *l, int64_t K, const uint16_t *B, int64_t kb, int64_t nb,
                                 uint32_t *out) {
    int64_t jn = l->k_block / 2, bn = l->n_block;
    for (int64_t n = 0; n < bn; n += 4) {
        const uint16_t *r = B + (nb * bn + n) * K + kb * l->k_block;
        for (int64_t j = 0; j < jn; j += 4) {
            __m128i a = _mm_loadu_si128((const __m128i *)(r + 2 * j)),
                    b = _mm_loadu_si128((const __m128i *)(r + K + 2 * j)),
                    c = _mm_loadu_si128((const __m128i *)(r + 2 * K + 2 * j)),
                    d = _mm_loadu_si128((const __m128i *)(r + 3 * K + 2 * j));
            __m128i ab0 = _mm_unpacklo_epi32(a, b), ab1 = _mm_unpackhi_epi32(a, b); /* a0 b0 a1 b1, a2 b2 a3 b3 */
            __m128i cd0 = _mm_unpacklo_epi32(c, d), cd1 = _mm_unpackhi_epi32(c, d);
            uint32_t *o = out + j * bn + n;
            _mm_store_si128((__m128i *)o, _mm_unpacklo_epi64(ab0, cd0));            /* word j:     a0 b0 c0 d0 */
            _mm_store_si128((__m128i *)(o + bn), _mm_unpackhi_epi64(ab0, cd0));     /* word j + 1: a1 b1 c1 d1 */
            _mm_store_si128((__m128i *)(o + 2 * bn), _mm_unpacklo_epi64(ab1, cd1)); /* word j + 2 */
            _mm_store_si128((__m128i *)(o + 3 * bn), _mm_unpackhi_epi64(ab1, cd1)); /* word j + 3 */
        }
    }
}

/* block_transposed made in a buffer of the calling thread's L1 (B's rows
 * read in order, each of their lines once; a transposing store straight to
 * memory would fill 16 partial lines at a time), then streamed out whole. */
static void block_transposed_stream(const accel__pair_layout *l, int64_t K, const uint16_t *B, int64_t kb,
                                    int64_t nb, uint32_t *out) {
    _Alignas(64) uint32_t tile[STREAM_TILE_WORDS];
    block_transposed_4x4(l, K, B, kb, nb, tile);
    stream_words(out, tile, l->k_block / 2 * l->n_block);
}

/* block_plain 8 columns at a time, streamed. */
static void block_plain_stream(const accel__pair_layout *l, int64_t N, const uint16_t *B, int64_t kb, int64_t nb,
                               uint32_t *out) {
    int64_t jn = l->k_block / 2, bn = l->n_block;
    for (int64_t j = 0; j < jn; j++) {
        const uint16_t *r0 = B + (kb * l->k_block + 2 * j) * N + nb * bn, *r1 = r0 + N;
        uint32_t *o = out + j * bn;
        for (int64_t n = 0; n < bn; n += 8) {
            __m128i a = _mm_loadu_si128((const __m128i *)(r0 + n)), b = _mm_loadu_si128((const __m128i *)(r1 + n));
            _mm_stream_si128((__m128i *)(o + n), _mm_unpacklo_epi16(a, b));
            _mm_stream_si128((__m128i *)(o + n + 4), _mm_unpackhi_epi16(a, b));
        }
    }
}
#endif

void accel__pair_pack(const accel__pair_layout *l, bool trans_b, int64_t N, int64_t K, const uint16_t *B,
                      uint16_t *dst) {
    int64_t kbs = K / l->k_block, nbs = N / l->n_block;
    atomic_fetch_add(&g_calls, 1);
#ifdef __SSE2__
    /* every block's rows start 16-byte aligned when dst does and the strides are multiples of 8 elements */
    bool stream = (uintptr_t)dst % 16 == 0 && l->k_block % 8 == 0 && l->n_block % 8 == 0 && l->k_stride % 8 == 0 &&
                  l->n_stride % 8 == 0 && l->k_block / 2 * l->n_block <= STREAM_TILE_WORDS;
#endif
    for (int64_t nb = 0; nb < nbs; nb++)
        for (int64_t kb = 0; kb < kbs; kb++) {
            uint32_t *out = (uint32_t *)(void *)(dst + kb * l->k_stride + nb * l->n_stride);
#ifdef __SSE2__
            if (stream) {
                if (trans_b) block_transposed_stream(l, K, B, kb, nb, out);
                else block_plain_stream(l, N, B, kb, nb, out);
                continue;
            }
#endif
            if (trans_b) block_transposed(l, K, B, kb, nb, out);
            else block_plain(l, N, B, kb, nb, out);
        }
#ifdef __SSE2__
    if (stream) _mm_sfence(); /* the streamed stores are visible to other threads' loads after this */
#endif
}
