/* CPU detection and the per-ISA kernel variants: what is reported matches
 * the kernel's view (/proc/cpuinfo), the variant in use is the best one the
 * CPU runs, every runnable variant computes what the baseline computes (its
 * vectorised tanh within 2 ulp of libm's tanhf on a sweep of the floats; its
 * conversions of rows apart element for element as accel_convert's), and
 * a variant the CPU cannot run is refused with an error naming it. */
#include "accel/accel.h"
#include "accel/accelerator.h"
#include "accel/cpu.h"
#include "backends/cpu/cpu_kernels.h"
#include "check.h"
#include <float.h>
#include <stdlib.h>
#include "core/cpuinfo.h"

#define N 4099 /* not a multiple of any vector width: the loops' tails run too */

static const char *const NAMES[] = {"avx2",     "fma",      "avx512f",  "avx512bw", "avx512vl", "avx512_bf16",
                                    "avx512_fp16", "amx_tile", "amx_bf16", "amx_fp16", "f16c"};
#define N_NAMES (int)(sizeof NAMES / sizeof NAMES[0])

/* The "flags" line of /proc/cpuinfo, or "" off Linux/x86. */
static void proc_flags(char *out, size_t n) {
    out[0] = 0;
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    static char line[8192];
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "flags", 5) && strchr(line, ':')) {
            snprintf(out, n, " %s", strchr(line, ':') + 1);
            out[strcspn(out, "\n")] = ' ';
            break;
        }
    fclose(f);
}

static bool has_word(const char *flags, const char *w) {
    char pat[64];
    snprintf(pat, sizeof pat, " %s ", w);
    return strstr(flags, pat) != NULL;
}

/* The features ACCEL_CPU_ISA (core/cpuinfo.h) leaves of the CPU's: all
 * without a cap (or a refused one). */
static uint32_t cap_keeps(void) {
    const uint32_t avx2 = ACCEL_CPU_AVX2 | ACCEL_CPU_FMA | ACCEL_CPU_F16C;
    const uint32_t avx512 = avx2 | ACCEL_CPU_AVX512F | ACCEL_CPU_AVX512BW | ACCEL_CPU_AVX512VL |
                            ACCEL_CPU_AVX512_BF16 | ACCEL_CPU_AVX512_FP16;
    switch (accel__cpu_isa_cap()) {
    case ACCEL__CPU_ISA_BASELINE: return 0;
    case ACCEL__CPU_ISA_AVX2: return avx2;
    case ACCEL__CPU_ISA_AVX512: return avx512;
    default: return ~0u;
    }
}

static void test_features_match_the_kernel(void) {
    static char flags[8192];
    proc_flags(flags, sizeof flags);
    const accel_cpu_info *ci = accel_cpu_info_get();
    CHECK(ci != NULL && ci->model[0] != 0);
    CHECK(accel_cpu_info_get() == ci);
    if (!flags[0]) return;
    uint32_t keeps = cap_keeps();
    for (int i = 0; i < N_NAMES; i++) {
        bool ours = ci->features & (1u << i), linux_says = has_word(flags, NAMES[i]) && (keeps & (1u << i));
        /* Linux lists a feature only when it enabled its state; AMX needs the
         * permission request too, which may be refused (valgrind does), so
         * for AMX only "reported => listed" must hold. */
        if (!strncmp(NAMES[i], "amx", 3)) CHECK_MSG(!ours || linux_says, "%s reported but not in /proc/cpuinfo", NAMES[i]);
        else CHECK_MSG(ours == linux_says, "%s: accel says %d, /proc/cpuinfo says %d", NAMES[i], ours, linux_says);
    }
}

/* The value of /proc/cpuinfo's first line named key (up to the colon, blanks
 * trimmed), or -1 where there is none. */
static long proc_number(const char *key) {
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return -1;
    char line[512];
    long v = -1;
    while (v < 0 && fgets(line, sizeof line, f)) {
        char *colon = strchr(line, ':');
        if (!colon) continue;
        size_t len = (size_t)(colon - line);
        while (len > 0 && (line[len - 1] == ' ' || line[len - 1] == '\t')) len--;
        if (len == strlen(key) && !strncmp(line, key, len)) v = strtol(colon + 1, NULL, 10);
    }
    fclose(f);
    return v;
}

/* Virtual machines show brand strings such as "AMD EPYC" for several CPU
 * generations: the signature is what tells them apart (and keys the GEMM
 * choices' cache), so it must be the one Linux reports. */
static void test_signature_matches_the_kernel(void) {
    const accel_cpu_info *ci = accel_cpu_info_get();
    long family = proc_number("cpu family"), model = proc_number("model"), stepping = proc_number("stepping");
    if (family < 0) return; /* no /proc/cpuinfo, or no x86 signature in it */
    CHECK_MSG(ci->family == (unsigned)family && ci->model_number == (unsigned)model &&
                  ci->stepping == (unsigned)stepping,
              "accel: family %u model %u stepping %u; /proc/cpuinfo: %ld %ld %ld", ci->family, ci->model_number,
              ci->stepping, family, model, stepping);
}

static void test_strings(void) {
    char isa[256], small[6], desc[512];
    const char *s = accel_cpu_isa_string(isa, sizeof isa);
    CHECK(s == isa);
    uint32_t f = accel_cpu_info_get()->features;
    if (f == 0) CHECK(strcmp(isa, "none") == 0);
    for (int i = 0; i < N_NAMES; i++) {
        char w[64];
        snprintf(w, sizeof w, " %s ", NAMES[i]);
        char padded[300];
        snprintf(padded, sizeof padded, " %s ", isa);
        CHECK_MSG(((f >> i) & 1u) == (strstr(padded, w) != NULL), "%s in \"%s\"", NAMES[i], isa);
    }
    CHECK(accel_cpu_isa_string(small, sizeof small) == small && strlen(small) < sizeof small);
    CHECK(strncmp(small, isa, strlen(small)) == 0);
    CHECK(accel_cpu_describe(desc, sizeof desc) == desc);
    char want[512], cpu[160];
    const accel_cpu_info *ci = accel_cpu_info_get();
    if (ci->family) snprintf(cpu, sizeof cpu, "%s (family %u model %u stepping %u)", ci->model, ci->family,
                             ci->model_number, ci->stepping);
    else snprintf(cpu, sizeof cpu, "%s", ci->model);
    snprintf(want, sizeof want, "CPU: %s\nISA: %s\nCPU kernels: %s\n", cpu, isa, accel_cpu_kernels());
    CHECK_MSG(strcmp(desc, want) == 0, "%s", desc);
    accel_clear_error();
    CHECK(accel_cpu_describe(NULL, 10) == NULL && accel_last_status() == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "accel_cpu_describe");
    accel_clear_error();
    CHECK(accel_cpu_isa_string(isa, 0) == NULL && accel_last_status() == ACCEL_ERR_INVALID_ARG);
    accel_clear_error();
    /* The accelerator's description ends with the same three lines. */
    accel_accelerator *acc = accel_accelerator_new(NULL);
    CHECK(acc != NULL);
    char adesc[2048];
    const char *a = accel_accelerator_describe(acc, adesc, sizeof adesc);
    CHECK(a && strlen(a) >= strlen(want) && strcmp(a + strlen(a) - strlen(want), want) == 0);
    accel_accelerator_free(acc);
}

static void test_best_variant_is_chosen(void) {
    uint32_t f = accel_cpu_info_get()->features;
    const uint32_t avx2 = ACCEL_CPU_AVX2 | ACCEL_CPU_FMA | ACCEL_CPU_F16C;
    const uint32_t avx512 = avx2 | ACCEL_CPU_AVX512F | ACCEL_CPU_AVX512BW | ACCEL_CPU_AVX512VL;
    const char *want = (f & avx512) == avx512 ? "avx512" : (f & avx2) == avx2 ? "avx2" : "baseline";
#if !defined(__x86_64__)
    want = "baseline"; /* the variants are x86-64 ones */
#endif
    /* An ACCEL_NATIVE build has one variant, compiled for the build machine. */
    if (strcmp(accel__cpu_variant_name(ACCEL__CPU_BASELINE), "native") == 0) want = "native";
    CHECK_MSG(strcmp(accel_cpu_kernels(), want) == 0, "in use %s, expected %s", accel_cpu_kernels(), want);
    CHECK(accel__cpu_variant_runnable(ACCEL__CPU_BASELINE));
}

/* Every kernel of cpu_variants.h on f32 data; the results go to out[]. */
typedef struct results {
    float unary[ACCEL_U_GELU_TANH + 1][N], grad[ACCEL_U_GELU_TANH + 1][N];
    float binary[4][N], unary_ref[ACCEL_U_GELU_TANH + 1][N], binary_ref[N];
} results;

static void run_kernels(const float *x, const float *g, results *r) {
    for (int op = 0; op <= ACCEL_U_GELU_TANH; op++) {
        float p = op == ACCEL_U_POW ? 2.0f : 0.5f;
        const float *in = x;
        static float pos[N]; /* log/sqrt/rsqrt/pow on positive inputs */
        if (op == ACCEL_U_LOG || op == ACCEL_U_SQRT || op == ACCEL_U_RSQRT || op == ACCEL_U_POW) {
            for (int i = 0; i < N; i++) pos[i] = fabsf(x[i]) + 0.1f;
            in = pos;
        }
        accel__cpu_unary_f32((accel__unop)op, p, in, r->unary[op], N);
        accel__cpu_unary_grad_f32((accel__unop)op, p, g, in, r->unary[op], r->grad[op], N);
    }
    /* a [N] op b [1] (broadcast) and a op b, same shape. */
    int64_t shape[1] = {N}, s1[1] = {1}, s0[1] = {0};
    const int64_t *bc[2] = {s1, s0}, *same[2] = {s1, s1};
    accel__layout lb, ls;
    accel__layout_init(&lb, 1, shape, 2, bc);
    accel__layout_init(&ls, 1, shape, 2, same);
    accel__cpu_binary_f32(ACCEL_B_ADD, &lb, x, g, r->binary[0]);
    accel__cpu_binary_f32(ACCEL_B_SUB, &ls, x, g, r->binary[1]);
    accel__cpu_binary_f32(ACCEL_B_MUL, &ls, x, g, r->binary[2]);
    accel__cpu_binary_f32(ACCEL_B_DIV, &ls, x, g, r->binary[3]);
    /* The reference kernels (compiled per variant too, as in the same file). */
    accel_tensor *tx = accel_from_floats(ACCEL_SHAPE(N), x), *tg = accel_from_floats(ACCEL_SHAPE(N), g);
    accel_tensor *ty = accel_empty(ACCEL_F32, ACCEL_SHAPE(N)), *tdx = accel_empty(ACCEL_F32, ACCEL_SHAPE(N));
    for (int op = 0; op <= ACCEL_U_GELU_TANH; op++) {
        accel__cpu_unary_ref((accel__unop)op, 0.5, ty, tx);
        accel__cpu_unary_grad_ref((accel__unop)op, 0.5, tdx, tg, tx, ty);
        memcpy(r->unary_ref[op], tdx->data, sizeof r->unary_ref[op]);
    }
    accel__cpu_binary_ref(ACCEL_B_MUL, ty, tx, tg);
    memcpy(r->binary_ref, ty->data, sizeof r->binary_ref);
    accel_step_reset();
}

/* Bitwise equality would be too strict (a compiler may contract a*b+c into
 * an FMA in one variant only); a wrong table entry or a miscompiled loop is
 * far off. */
static bool close_all(const float *a, const float *b, int n, const char *what, const char *variant) {
    for (int i = 0; i < n; i++) {
        float d = fabsf(a[i] - b[i]), tol = 1e-6f + 1e-6f * fabsf(b[i]);
        if (!(d <= tol) && !(isnan(a[i]) && isnan(b[i])) && !(isinf(a[i]) && a[i] == b[i])) {
            fprintf(stderr, "%s (%s) [%d]: %.9g vs baseline %.9g\n", what, variant, i, a[i], b[i]);
            return false;
        }
    }
    return true;
}

static void test_variants_agree(void) {
    static float x[N], g[N];
    for (int i = 0; i < N; i++) {
        x[i] = -12.0f + 24.0f * (float)((i * 7919) % N) / N;
        g[i] = 0.5f + (float)(i % 17) / 8.0f;
    }
    static results base, other;
    accel__cpu_variant start = accel__cpu_variant_current();
    CHECK(accel__cpu_variant_use(ACCEL__CPU_BASELINE) == ACCEL_OK);
    run_kernels(x, g, &base);
    int compared = 0;
    for (int v = ACCEL__CPU_BASELINE + 1; v < ACCEL__CPU_N_VARIANTS; v++) {
        if (!accel__cpu_variant_runnable((accel__cpu_variant)v)) continue;
        CHECK(accel__cpu_variant_use((accel__cpu_variant)v) == ACCEL_OK);
        CHECK(strcmp(accel_cpu_kernels(), accel__cpu_variant_name((accel__cpu_variant)v)) == 0);
        const char *name = accel__cpu_variant_name((accel__cpu_variant)v);
        memset(&other, 0, sizeof other);
        run_kernels(x, g, &other);
        for (int op = 0; op <= ACCEL_U_GELU_TANH; op++) {
            CHECK_MSG(close_all(other.unary[op], base.unary[op], N, "unary", name), "unary op %d", op);
            CHECK_MSG(close_all(other.grad[op], base.grad[op], N, "grad", name), "grad op %d", op);
        }
        for (int op = 0; op < 4; op++)
            CHECK_MSG(close_all(other.binary[op], base.binary[op], N, "binary", name), "binary op %d", op);
        for (int op = 0; op <= ACCEL_U_GELU_TANH; op++)
            CHECK_MSG(close_all(other.unary_ref[op], base.unary_ref[op], N, "unary ref", name), "unary ref op %d", op);
        CHECK(close_all(other.binary_ref, base.binary_ref, N, "binary ref", name));
        compared++;
    }
    printf("compared %d variant(s) with the baseline (in use at start: %s)\n", compared,
           accel__cpu_variant_name(start));
    CHECK(accel__cpu_variant_use(start) == ACCEL_OK);
}

/* ---- f16 <-> f32 of every variant against the scalar conversion, bit for bit */

static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Every one of the 65536 f16 values, from each start 0..8 (unaligned starts,
 * and a length that leaves each possible vector tail). */
static bool f16_to_f32_exact(const char *variant) {
    enum { ALL = 65536 };
    static uint16_t h[ALL + 8];
    static float f[ALL + 8];
    for (int i = 0; i < ALL + 8; i++) h[i] = (uint16_t)(i * 40503u); /* odd: a permutation of 0..65535 */
    for (int start = 0; start <= 8; start++) {
        int64_t n = ALL - start;
        memset(f, 0, sizeof f);
        accel__cpu_to_f32(f + start, h + start, ACCEL_F16, n);
        for (int64_t i = start; i < start + n; i++)
            if (f32_bits(f[i]) != f32_bits(accel_f16_to_f32(h[i]))) {
                fprintf(stderr, "%s: f16 0x%04x -> 0x%08x, scalar 0x%08x\n", variant, h[i], f32_bits(f[i]),
                        f32_bits(accel_f16_to_f32(h[i])));
                return false;
            }
    }
    return true;
}

/* The f32 inputs of the narrowing test: the edge cases, then random bit
 * patterns (every class, NaN payloads included) and random values near the
 * f16 range (ties and the subnormal boundary hit often). */
static void f32_sweep(float *x, int n) {
    static const uint32_t EDGE[] = {
        0x00000000, 0x80000000, 0x00000001, 0x807fffff, 0x33000000, 0x33000001, 0x337fffff, 0x33800000,
        0x33c00000, 0x34200000, 0x387fc000, 0x387fe000, 0x38800000, 0x38801000, 0x38803000, 0x477fe000,
        0x477fefff, 0x477ff000, 0x477ff001, 0x47800000, 0x7f7fffff, 0x7f800000, 0xff800000, 0x7f800001,
        0x7fa00000, 0x7fc00000, 0xffc12345, 0x7fffffff, 0xff800001, 0x3f801000, 0x3f803000, 0x3f800fff,
    };
    int ne = (int)(sizeof EDGE / sizeof EDGE[0]);
    uint64_t s = 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < n; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        uint32_t r = (uint32_t)(s >> 32);
        if (i < ne) x[i] = bits_f32(EDGE[i]);
        else if (i % 2) x[i] = bits_f32(r);
        else /* exponent 2^-26 .. 2^17, low mantissa bits often a tie (0x1000) */
            x[i] = bits_f32((r & 0x80000000u) | ((101u + (r >> 8) % 44u) << 23) | (r & 0x7fe000u) |
                            ((r & 3u) == 0 ? 0x1000u : r & 0x1fffu));
    }
}

static bool f32_to_f16_exact(const char *variant) {
    enum { SWEEP = 1 << 20 };
    static float x[SWEEP + 8];
    static uint16_t h[SWEEP + 8], scalar[SWEEP + 8];
    f32_sweep(x, SWEEP + 8);
    for (int i = 0; i < SWEEP + 8; i++) scalar[i] = accel_f32_to_f16(x[i]);
    static const int64_t LENGTHS[] = {SWEEP, 1, 7, 9, 15, 17, 1001};
    for (int start = 0; start <= 8; start++)
        for (int l = 0; l < (int)(sizeof LENGTHS / sizeof LENGTHS[0]); l++) {
            int64_t n = LENGTHS[l] - (l == 0 ? start : 0);
            memset(h, 0, sizeof h);
            accel__cpu_from_f32(h + start, ACCEL_F16, x + start, n);
            for (int64_t i = 0; i < start + n + 8 && i < SWEEP + 8; i++) { /* and nothing written past it */
                uint16_t want = i >= start && i < start + n ? scalar[i] : 0;
                if (h[i] != want) {
                    fprintf(stderr, "%s: f32 0x%08x -> 0x%04x, want 0x%04x (start %d, n %lld)\n", variant,
                            f32_bits(x[i]), h[i], want, start, (long long)n);
                    return false;
                }
            }
        }
    return true;
}

/* What a NaN becomes, pinned (the hardware alone gives other bits): widening
 * keeps the bits, a signalling NaN included; narrowing gives the quiet NaN
 * 0x7e00 with the sign, whatever the payload. */
static bool f16_nans_pinned(void) {
    uint16_t h[16];
    float f[16];
    for (int i = 0; i < 16; i++) h[i] = (uint16_t)(i % 2 ? 0xfc01 + i : 0x7c01 + 0x20 * i);
    accel__cpu_to_f32(f, h, ACCEL_F16, 16);
    for (int i = 0; i < 16; i++) {
        uint32_t want = (uint32_t)(h[i] & 0x8000) << 16 | 0x7f800000u | (uint32_t)(h[i] & 0x3ff) << 13;
        if (f32_bits(f[i]) != want) return false;
    }
    for (int i = 0; i < 16; i++) f[i] = bits_f32(i % 2 ? 0xff800001u + (uint32_t)i : 0x7fc00000u + 0x2000u * (uint32_t)i);
    accel__cpu_from_f32(h, ACCEL_F16, f, 16);
    for (int i = 0; i < 16; i++)
        if (h[i] != (i % 2 ? 0xfe00 : 0x7e00)) return false;
    return true;
}

static void test_f16_conversions_match_the_scalar_one(void) {
    accel__cpu_variant start = accel__cpu_variant_current();
    for (int v = ACCEL__CPU_BASELINE; v < ACCEL__CPU_N_VARIANTS; v++) {
        if (!accel__cpu_variant_runnable((accel__cpu_variant)v)) continue;
        CHECK(accel__cpu_variant_use((accel__cpu_variant)v) == ACCEL_OK);
        const char *name = accel__cpu_variant_name((accel__cpu_variant)v);
        CHECK_MSG(f16_to_f32_exact(name), "%s: f16 -> f32", name);
        CHECK_MSG(f32_to_f16_exact(name), "%s: f32 -> f16", name);
        CHECK_MSG(f16_nans_pinned(), "%s: f16 NaNs", name);
    }
    CHECK(accel__cpu_variant_use(start) == ACCEL_OK);
}

/* ---- tanh and GELU-tanh of every variant (vec_math.h's accel__tanhf) against libm */

/* |a - b| in ulps: the floats' bits as a number line (-0 and +0 both 0). */
static int64_t ulps_apart(float a, float b) {
    int32_t ia, ib;
    memcpy(&ia, &a, 4);
    memcpy(&ib, &b, 4);
    if (ia < 0) ia = INT32_MIN - ia;
    if (ib < 0) ib = INT32_MIN - ib;
    return llabs((int64_t)ia - ib);
}

/* The sweep: every 4093rd float (each binade, both signs, subnormals, NaNs),
 * every float around the switch from the polynomial to the exponential
 * (0.625) and around where tanh rounds to 1 (~9), and the special values.
 * Returns the count (about 1.9 million); x holds TANH_SWEEP_CAP floats. */
enum { TANH_SWEEP_CAP = 3 << 20 };
static int tanh_sweep(float *x) {
    int n = 0;
    for (uint64_t b = 0; b <= 0xffffffffu; b += 4093) x[n++] = bits_f32((uint32_t)b);
    for (float v = 0.615f; v < 0.635f && n < TANH_SWEEP_CAP - 64; v = nextafterf(v, 1.0f)) x[n++] = v, x[n++] = -v;
    for (float v = 8.95f; v < 9.05f && n < TANH_SWEEP_CAP - 64; v = nextafterf(v, 10.0f)) x[n++] = v, x[n++] = -v;
    const float special[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, -NAN, FLT_MIN, -FLT_MIN, 1e-45f, -1e-45f,
                             FLT_MAX, -FLT_MAX, 44.36f, 44.37f, 88.0f, 0.625f, -0.625f, 1e-4f, 1e-20f};
    for (size_t i = 0; i < sizeof special / sizeof *special; i++) x[n++] = special[i];
    return n;
}

static void test_tanh_within_ulps_of_libm(void) {
    enum { CAP = TANH_SWEEP_CAP };
    float *x = malloc(sizeof(float) * CAP), *y = malloc(sizeof(float) * CAP), *d = malloc(sizeof(float) * CAP);
    float *one = malloc(sizeof(float) * CAP);
    CHECK(x && y && d && one);
    if (!x || !y || !d || !one) return;
    int n = tanh_sweep(x);
    for (int i = 0; i < n; i++) one[i] = 1.0f;
    accel__cpu_variant start = accel__cpu_variant_current();
    for (int v = ACCEL__CPU_BASELINE; v < ACCEL__CPU_N_VARIANTS; v++) {
        if (!accel__cpu_variant_runnable((accel__cpu_variant)v)) continue;
        CHECK(accel__cpu_variant_use((accel__cpu_variant)v) == ACCEL_OK);
        const char *name = accel__cpu_variant_name((accel__cpu_variant)v);
        accel__cpu_unary_f32(ACCEL_U_TANH, 0, x, y, n);
        int64_t worst = 0;
        int bad = 0;
        for (int i = 0; i < n; i++) {
            float want = tanhf(x[i]);
            bool ok = isnan(want) ? isnan(y[i]) : signbit(y[i]) == signbit(want) && ulps_apart(y[i], want) <= 2;
            if (!isnan(want) && ulps_apart(y[i], want) > worst) worst = ulps_apart(y[i], want);
            if (!ok && bad++ < 5) fprintf(stderr, "%s: tanh(%.9g) = %.9g, tanhf %.9g\n", name, x[i], y[i], want);
        }
        CHECK_MSG(bad == 0, "%s: %d of %d tanh values off", name, bad, n);
        printf("%s: tanh of %d floats, at most %lld ulp from tanhf\n", name, n, (long long)worst);
        /* GELU-tanh and its derivative against the scalar formulas with libm's tanhf */
        accel__cpu_unary_f32(ACCEL_U_GELU_TANH, 0, x, y, n);
        accel__cpu_unary_grad_f32(ACCEL_U_GELU_TANH, 0, one, x, y, d, n);
        bad = 0;
        for (int i = 0; i < n; i++) {
            float xi = x[i];
            if (!(fabsf(xi) < 1e3f)) continue; /* x^3 overflows: inf - inf in both */
            float want = accel__unary_f(ACCEL_U_GELU_TANH, xi, 0), dwant = accel__unary_df(ACCEL_U_GELU_TANH, xi, want, 0);
            bool ok = fabsf(y[i] - want) <= 3e-7f * (1.0f + fabsf(xi)) && fabsf(d[i] - dwant) <= 1e-6f * (1.0f + xi * xi);
            if (!ok && bad++ < 5)
                fprintf(stderr, "%s: gelu_tanh(%.9g) = %.9g, grad %.9g; libm's %.9g, %.9g\n", name, xi, y[i], d[i],
                        want, dwant);
        }
        CHECK_MSG(bad == 0, "%s: %d GELU-tanh values off", name, bad);
    }
    CHECK(accel__cpu_variant_use(start) == ACCEL_OK);
    free(x);
    free(y);
    free(d);
    free(one);
}

/* ---- rows apart (sdpa's tiles of a head in the projections' layout):
 * accel__cpu_to_f32_rows / _from_f32_rows of every variant give, row for
 * row, the elementwise accel_convert, and write nothing between the rows;
 * accel__cpu_copy_rows gives the rows' elements as they are */

enum { ROWS = 21, COLS = 37, GAP = 50 }; /* more rows than the prefetch runs ahead, odd widths */

static bool rows_exact(accel_dtype dt, int64_t stride, const char *variant) {
    static uint16_t src[ROWS * GAP], dst[ROWS * GAP];
    static float wide[ROWS * COLS], want[ROWS * COLS];
    for (int i = 0; i < ROWS * GAP; i++) {
        float x = (float)((i * 7919) % 1000 - 500) / 37.0f;
        accel_convert(&src[i], dt, &x, ACCEL_F32, 1);
    }
    for (int i = 0; i < ROWS * COLS; i++) wide[i] = -1.0f;
    accel__cpu_to_f32_rows(wide, src, dt, ROWS, COLS, stride);
    bool ok = true;
    for (int r = 0; r < ROWS; r++)
        for (int c = 0; c < COLS; c++) {
            accel_convert(&want[r * COLS + c], ACCEL_F32, &src[r * stride + c], dt, 1);
            ok = ok && f32_bits(wide[r * COLS + c]) == f32_bits(want[r * COLS + c]);
        }
    static uint16_t copied[ROWS * COLS];
    accel__cpu_copy_rows(copied, src, dt, ROWS, COLS, stride);
    for (int r = 0; r < ROWS; r++)
        for (int c = 0; c < COLS; c++) ok = ok && copied[r * COLS + c] == src[r * stride + c];
    for (int i = 0; i < ROWS * COLS; i++) wide[i] = want[i] * 1.001f; /* values that round */
    for (int i = 0; i < ROWS * GAP; i++) dst[i] = 0xabcd;
    accel__cpu_from_f32_rows(dst, dt, wide, ROWS, COLS, stride);
    for (int i = 0; i < ROWS * (int)stride && i < ROWS * GAP; i++) {
        int r = i / (int)stride, c = i % (int)stride;
        uint16_t expect = 0xabcd;
        if (c < COLS) accel_convert(&expect, dt, &wide[r * COLS + c], ACCEL_F32, 1);
        ok = ok && dst[i] == expect;
    }
    if (!ok) fprintf(stderr, "%s: %s rows %d apart differ from accel_convert\n", variant, accel_dtype_name(dt), (int)stride);
    return ok;
}

static void test_rows_conversions(void) {
    accel__cpu_variant start = accel__cpu_variant_current();
    for (int v = ACCEL__CPU_BASELINE; v < ACCEL__CPU_N_VARIANTS; v++) {
        if (!accel__cpu_variant_runnable((accel__cpu_variant)v)) continue;
        CHECK(accel__cpu_variant_use((accel__cpu_variant)v) == ACCEL_OK);
        const char *name = accel__cpu_variant_name((accel__cpu_variant)v);
        for (int d = 0; d < 2; d++) {
            accel_dtype dt = d ? ACCEL_F16 : ACCEL_BF16;
            CHECK(rows_exact(dt, GAP, name));
            CHECK(rows_exact(dt, COLS, name)); /* rows dense: one run */
        }
    }
    CHECK(accel__cpu_variant_use(start) == ACCEL_OK);
}

static void test_unrunnable_variant_is_refused(void) {
    accel__cpu_variant before = accel__cpu_variant_current();
    for (int v = 0; v < ACCEL__CPU_N_VARIANTS; v++) {
        if (accel__cpu_variant_runnable((accel__cpu_variant)v)) continue;
        accel_clear_error();
        CHECK(accel__cpu_variant_use((accel__cpu_variant)v) == ACCEL_ERR_UNSUPPORTED);
        CHECK_STR_CONTAINS(accel_last_error(), accel__cpu_variant_name((accel__cpu_variant)v));
        CHECK(accel__cpu_variant_current() == before);
    }
    accel_clear_error();
    CHECK(accel__cpu_variant_use(ACCEL__CPU_N_VARIANTS) == ACCEL_ERR_UNSUPPORTED);
    CHECK_STR_CONTAINS(accel_last_error(), "not compiled into this build");
    CHECK(accel__cpu_variant_current() == before);
    accel_clear_error();
}

/* ACCEL_CPU_ISA (tests/gemm.cmake runs this file under each level the CPU
 * has, and under refused values): a level caps the features, the kernel
 * variant and oneDNN; a refused value is named by every GEMM. */
static void test_isa_cap(void) {
    const char *v = getenv("ACCEL_CPU_ISA");
    accel__cpu_isa_level cap = accel__cpu_isa_cap();
    float a[4] = {1, 2, 3, 4}, c[4];
    accel_tensor *ta = accel_from_floats(ACCEL_SHAPE(2, 2), a);
    accel_tensor *y = accel_matmul(ta, ta);
    if (!v || !*v) {
        CHECK(cap == ACCEL__CPU_ISA_NONE && accel__cpu_isa_check() == ACCEL_OK);
    } else if (cap != ACCEL__CPU_ISA_NONE) { /* taken */
        CHECK_MSG(strcmp(accel__cpu_isa_cap_name(cap), v) == 0, "ACCEL_CPU_ISA=%s: cap %s", v,
                  accel__cpu_isa_cap_name(cap));
        CHECK((accel_cpu_info_get()->features & ~cap_keeps()) == 0);
        if (strcmp(accel__cpu_variant_name(ACCEL__CPU_BASELINE), "native"))
            CHECK_MSG(strcmp(accel_cpu_kernels(), v) == 0, "ACCEL_CPU_ISA=%s: kernels %s", v, accel_cpu_kernels());
        CHECK(!accel__cpu_variant_runnable((accel__cpu_variant)(cap + 1)));
        CHECK_MSG(y && accel_to_floats(y, c) == ACCEL_OK && c[0] == 7 && c[3] == 22, "%s", accel_last_error());
    } else { /* refused: named, by the check and by a GEMM */
        accel_clear_error();
        CHECK(accel__cpu_isa_check() == ACCEL_ERR_INVALID_ARG);
        CHECK_STR_CONTAINS(accel_last_error(), "ACCEL_CPU_ISA=");
        CHECK_STR_CONTAINS(accel_last_error(), v);
        CHECK(y == NULL);
        CHECK_STR_CONTAINS(accel_last_error(), "ACCEL_CPU_ISA=");
        accel_clear_error();
    }
    accel_step_reset();
}

int main(void) {
    RUN(test_isa_cap);
    RUN(test_features_match_the_kernel);
    RUN(test_signature_matches_the_kernel);
    RUN(test_strings);
    RUN(test_best_variant_is_chosen);
    RUN(test_variants_agree);
    RUN(test_f16_conversions_match_the_scalar_one);
    RUN(test_rows_conversions);
    RUN(test_tanh_within_ulps_of_libm);
    RUN(test_unrunnable_variant_is_refused);
    return check_summary();
}
