/* accel's own packing of a 16-bit weight into oneDNN's pair-interleaved
 * blocked layouts (src/backends/cpu/pair_pack.h; docs/cpu.md "Packing the
 * weights"):
 *   - for every weight shape and both transposes whose layout oneDNN's matmul
 *     picks on this CPU is a pair layout, accel__pair_pack writes exactly the
 *     bytes of oneDNN's reorder, every byte of the layout written, from
 *     a 16-byte aligned destination (streamed stores) and a merely 4-byte
 *     aligned one (word stores);
 *   - on any CPU, synthetic pair layouts (oneDNN's block sizes, small and odd
 *     ones, one larger than the streaming buffer, outer blocks in either
 *     order) against the layout's definition element by element, each path
 *     of the kernel (streamed, element stores) taken;
 *   - shapes that layout would pad get no pair layout (oneDNN reorders them);
 *   - a bf16 weight's form made by the library (accel__gemm_weight) is
 *     packed by accel where the layout allows and by oneDNN where switched
 *     off, and the GEMM on it gives the plain weight's bits either way.
 * Which layout oneDNN picks depends on the CPU (and ACCEL_CPU_ISA, under
 * which tests/gemm.cmake runs this file again): every expectation comes from
 * the layout the library was given, and a CPU (or ISA cap) whose oneDNN has
 * no 16-bit matmul of a pair layout (or a build without it) compares nothing
 * with oneDNN and says so; the synthetic layouts run everywhere. */
#include "accel/accel.h"
#include "backends/cpu/gemm.h"
#include "backends/cpu/pair_pack.h"
#include "check.h"
#include "core/prepared.h"

static int g_compared; /* pair layouts compared with oneDNN's reorder */

static uint16_t elem(int64_t i, uint32_t seed) { return (uint16_t)(((uint64_t)i * 2654435761u + seed) >> 9); }

/* The layout of (dt, trans_b, N, K) into *bytes and *pairs; false where
 * this machine has no oneDNN layout for it. */
static bool layout_of(accel_dtype dt, bool trans_b, int64_t N, int64_t K, size_t *bytes, accel__pair_layout *pairs) {
    if (!accel__gemm_have_dnnl()) return false;
    accel_status st = accel__dnnl_weight_layout(dt, trans_b, N, K, bytes, pairs);
    if (st != ACCEL_OK) { /* a dtype oneDNN has no matmul of on this CPU */
        accel_clear_error();
        return false;
    }
    return *bytes > 0;
}

static void check_shape(accel_dtype dt, bool trans_b, int64_t N, int64_t K) {
    size_t bytes;
    accel__pair_layout l;
    if (!layout_of(dt, trans_b, N, K, &bytes, &l)) return;
    if (!l.k_block) return; /* not a pair layout: oneDNN's reorder packs it */
    CHECK_MSG(bytes == (size_t)(N * K) * 2, "a pair layout of %lld x %lld pads (%zu bytes)", (long long)N,
              (long long)K, bytes);
    CHECK(K % l.k_block == 0 && N % l.n_block == 0 && l.k_block % 2 == 0);
    uint16_t *b = malloc((size_t)(N * K) * 2), *ref = malloc(bytes);
    char *own = malloc(bytes + 16);
    CHECK(b && ref && own);
    for (int64_t i = 0; i < N * K; i++) b[i] = elem(i, 17);
    CHECK_MSG(accel__dnnl_weight_pack(dt, trans_b, N, K, b, ref) == ACCEL_OK, "%s", accel_last_error());
    /* malloc's 16-byte alignment, then 4 bytes past it */
    for (int off = 0; off <= 4; off += 4) {
        uint16_t *dst = (uint16_t *)(void *)(own + off);
        memset(dst, 0xa5, bytes);
        accel__pair_pack(&l, trans_b, N, K, b, dst);
        CHECK_MSG(memcmp(dst, ref, bytes) == 0, "%s %s %lld x %lld (dst + %d): accel's pack differs from oneDNN's reorder",
                  accel_dtype_name(dt), trans_b ? "NT" : "NN", (long long)N, (long long)K, off);
    }
    g_compared++;
    free(b);
    free(ref);
    free(own);
}

static void test_pack_matches_reorder(void) {
    static const int64_t SHAPES[][2] = {{512, 512}, {1536, 512}, {512, 1536}, {64, 32}, {128, 96}, {192, 64}, {64, 2048}};
    static const accel_dtype DTS[] = {ACCEL_BF16, ACCEL_F16};
    for (size_t d = 0; d < 2; d++)
        for (size_t s = 0; s < sizeof SHAPES / sizeof SHAPES[0]; s++)
            for (int t = 0; t < 2; t++) check_shape(DTS[d], t == 1, SHAPES[s][0], SHAPES[s][1]);
    printf("  %d pair layouts compared with oneDNN's reorder%s\n", g_compared,
           g_compared ? "" : " (oneDNN picks none here, at this ISA cap, or is not built in)");
}

/* Element (k, n) of op(B) in layout l, by the definition (gemm.h). */
static int64_t offset_of(const accel__pair_layout *l, int64_t k, int64_t n) {
    return k / l->k_block * l->k_stride + n / l->n_block * l->n_stride +
           (k % l->k_block / 2 * l->n_block + n % l->n_block) * 2 + k % 2;
}

/* accel__pair_pack of a K x N op(B) in layout l (outer blocks n-major when
 * n_major, else k-major) against offset_of, from a 16-byte aligned and a
 * 4-byte aligned destination. */
static void check_synthetic(int64_t kb, int64_t nbk, int64_t K, int64_t N, bool n_major, bool trans_b) {
    int64_t kbs = K / kb, nbs = N / nbk, block = kb * nbk;
    accel__pair_layout l = {kb, nbk, n_major ? block : block * nbs, n_major ? block * kbs : block};
    uint16_t *b = malloc((size_t)(K * N) * 2), *want = malloc((size_t)(K * N) * 2);
    char *own = malloc((size_t)(K * N) * 2 + 16);
    CHECK(b && want && own);
    for (int64_t i = 0; i < K * N; i++) b[i] = elem(i, 29);
    for (int64_t k = 0; k < K; k++)
        for (int64_t n = 0; n < N; n++) want[offset_of(&l, k, n)] = trans_b ? b[n * K + k] : b[k * N + n];
    for (int off = 0; off <= 4; off += 4) {
        uint16_t *dst = (uint16_t *)(void *)(own + off);
        memset(dst, 0x5a, (size_t)(K * N) * 2);
        accel__pair_pack(&l, trans_b, N, K, b, dst);
        CHECK_MSG(memcmp(dst, want, (size_t)(K * N) * 2) == 0,
                  "blocks %lld x %lld (%s-major) of a %lld x %lld %s (dst + %d): not the layout's elements",
                  (long long)kb, (long long)nbk, n_major ? "n" : "k", (long long)K, (long long)N,
                  trans_b ? "W^T" : "W", off);
    }
    free(b);
    free(want);
    free(own);
}

static void test_synthetic_layouts(void) {
    static const int64_t L[][4] = {/* k_block, n_block, K, N */
                                   {32, 64, 64, 128}, {2, 4, 6, 12}, {8, 12, 16, 24}, {16, 8, 48, 16}, {128, 128, 128, 256}};
    for (size_t i = 0; i < sizeof L / sizeof L[0]; i++)
        for (int major = 0; major < 2; major++)
            for (int t = 0; t < 2; t++) check_synthetic(L[i][0], L[i][1], L[i][2], L[i][3], major == 1, t == 1);
}

/* Shapes the blocks would pad: a layout larger than the weight is never a
 * pair layout, nor one whose blocks do not divide it. */
static void test_padded_shapes_have_none(void) {
    static const int64_t SHAPES[][2] = {{96, 80}, {100, 36}, {64, 48}, {3, 7}};
    for (size_t s = 0; s < sizeof SHAPES / sizeof SHAPES[0]; s++)
        for (int t = 0; t < 2; t++) {
            size_t bytes;
            accel__pair_layout l;
            if (!layout_of(ACCEL_BF16, t == 1, SHAPES[s][0], SHAPES[s][1], &bytes, &l)) continue;
            bool exact = bytes == (size_t)(SHAPES[s][0] * SHAPES[s][1]) * 2;
            CHECK_MSG(l.k_block == 0 || (exact && SHAPES[s][1] % l.k_block == 0 && SHAPES[s][0] % l.n_block == 0),
                      "%lld x %lld (%zu bytes): a pair layout that pads the weight", (long long)SHAPES[s][0],
                      (long long)SHAPES[s][1], bytes);
        }
}

/* Y = X W^T and Y = X W on a bf16 weight's form (accel__gemm_weight) equal
 * the plain weight's bits, packed by accel or (switched off) by oneDNN; the
 * pack's calls follow the layout the library was given. */
static void check_form_gemm(bool trans_b, bool own) {
    enum { M = 64, N = 128, K = 96 };
    int64_t rows = trans_b ? N : K, cols = trans_b ? K : N;
    bool was = accel__pair_pack_set_enabled(own);
    accel_tensor *w = accel_tensor_new(ACCEL_BF16, 2, (int64_t[]){rows, cols}, ACCEL_CPU_DEVICE);
    uint16_t *a = malloc(sizeof(uint16_t) * M * K);
    float *c_plain = malloc(sizeof(float) * M * N), *c_form = malloc(sizeof(float) * M * N);
    CHECK(w && a && c_plain && c_form);
    uint16_t *wv = w->data;
    for (int64_t i = 0; i < rows * cols; i++) wv[i] = (uint16_t)(0x3c00 + elem(i, 5) % 0x0400); /* 0.0078 .. 0.0156 */
    for (int64_t i = 0; i < M * K; i++) a[i] = (uint16_t)(0x3f00 + elem(i, 9) % 0x0100);
    size_t bytes;
    accel__pair_layout l;
    bool form = accel__gemm_weight_has_form(ACCEL_BF16, false, trans_b, M, N, K) && accel__prepared_enabled();
    bool pairs = form && layout_of(ACCEL_BF16, trans_b, N, K, &bytes, &l) && l.k_block;
    uint64_t c0 = accel__pair_pack_calls();
    accel_status sp = accel__gemm(false, trans_b, M, N, K, 1.0f, a, ACCEL_BF16, K, w->data, ACCEL_BF16, cols, 0.0f,
                                  c_plain, N);
    accel_status sw = accel__gemm_weight(false, trans_b, M, N, K, 1.0f, a, ACCEL_BF16, K, w, 0, cols, 0.0f, c_form, N);
    CHECK_MSG(sp == ACCEL_OK && sw == ACCEL_OK, "%s", accel_last_error());
    CHECK_MSG(memcmp(c_plain, c_form, sizeof(float) * M * N) == 0, "%s, pack by %s: the form's GEMM gave other bits",
              trans_b ? "NT" : "NN", own ? "accel" : "oneDNN");
    CHECK_MSG(accel__pair_pack_calls() == c0 + (pairs && own), "%s: %llu packs by accel, the layout says %d",
              trans_b ? "NT" : "NN", (unsigned long long)(accel__pair_pack_calls() - c0), pairs && own);
    accel_step_reset();
    accel_tensor_free(w);
    free(a);
    free(c_plain);
    free(c_form);
    accel__pair_pack_set_enabled(was);
}

static void test_form_gemm_matches_plain(void) {
    for (int t = 0; t < 2; t++)
        for (int own = 0; own < 2; own++) check_form_gemm(t == 1, own == 1);
}

int main(void) {
    RUN(test_synthetic_layouts);
    RUN(test_pack_matches_reorder);
    RUN(test_padded_shapes_have_none);
    RUN(test_form_gemm_matches_plain);
    accel_thread_cleanup();
    return check_summary();
}
