/* Core: dtypes, conversions, tensors, arenas, errors, RNG, printing. */
#include <math.h>
#include <omp.h>
#include <pthread.h>

#include "accel/accel.h"
#include "check.h"

static void test_bf16_f16_rounding(void) {
    /* bf16: 1 + 2^-8 is exactly halfway between 1 and 1 + 2^-7: ties to even -> 1. */
    CHECK(accel_f32_to_bf16(1.0f + 1.0f / 256) == 0x3f80);
    CHECK(accel_f32_to_bf16(1.0f + 3.0f / 256) == 0x3f82); /* tie, odd below -> up */
    CHECK(accel_bf16_to_f32(0x3f80) == 1.0f);
    CHECK(isnan(accel_bf16_to_f32(accel_f32_to_bf16(NAN))));
    /* f16 */
    CHECK(accel_f32_to_f16(1.0f) == 0x3c00);
    CHECK(accel_f32_to_f16(65504.0f) == 0x7bff);
    CHECK(accel_f32_to_f16(65520.0f) == 0x7c00);           /* overflow rounds to inf */
    CHECK(accel_f32_to_f16(1.0f + 1.0f / 2048) == 0x3c00); /* tie to even */
    CHECK(accel_f32_to_f16(5.960464477539063e-08f) == 0x0001); /* smallest subnormal */
    CHECK(accel_f32_to_f16(2.9802322387695312e-08f) == 0x0000); /* half of it: tie to even 0 */
    CHECK(accel_f16_to_f32(0x0001) == 5.960464477539063e-08f);
    CHECK(accel_f16_to_f32(0xc000) == -2.0f);
    for (uint32_t h = 0; h < 0x7c00; h++) /* every finite f16 round-trips */
        CHECK(accel_f32_to_f16(accel_f16_to_f32((uint16_t)h)) == h);
}

static void test_dtype_names(void) {
    CHECK(accel_dtype_parse("torch.bfloat16") == ACCEL_BF16);
    CHECK(accel_dtype_parse("F16") == ACCEL_F16);
    CHECK(accel_dtype_parse("fp32") == ACCEL_F32);
    CHECK(accel_dtype_parse("complex64") == -1);
    CHECK(accel_dtype_size(ACCEL_I64) == 8);
    CHECK(strcmp(accel_dtype_st_name(ACCEL_BF16), "BF16") == 0);
}

static void test_tensors_and_views(void) {
    accel_tensor *t = accel_arange(ACCEL_F32, 0, 6);
    CHECK(t && accel_numel(t) == 6);
    int64_t shape[2] = {2, 3}, stride[2] = {1, 2};
    accel_tensor *v = accel_view_raw(t, 2, shape, stride, 0); /* a transposed view of [3,2] */
    CHECK(!accel_is_contiguous(v));
    CHECK(accel_get(v, (int64_t[]){1, 2}) == 5.0);
    accel_tensor *c = accel_empty(ACCEL_BF16, 2, shape);
    CHECK(accel_copy_(c, v) == ACCEL_OK);
    CHECK(accel_get(c, (int64_t[]){0, 1}) == 2.0);
    /* A view must lie in t's elements: past them it read the memory that came
     * next (the sum of a [6] view at offset 3 of arange(6) was garbage). */
    const char *past = "reaches past the 6 elements of t";
    CHECK(accel_view_raw(t, 1, (int64_t[]){6}, (int64_t[]){1}, 3) == NULL);
    CHECK(accel_last_status() == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), past);
    CHECK(accel_view_raw(t, 1, (int64_t[]){4}, (int64_t[]){2}, 0) == NULL); /* stride too long */
    CHECK_STR_CONTAINS(accel_last_error(), past);
    CHECK(accel_view_raw(t, 1, (int64_t[]){2}, (int64_t[]){1}, -1) == NULL); /* before the first */
    CHECK(accel_view_raw(t, 1, (int64_t[]){2}, (int64_t[]){-1}, 0) == NULL);
    CHECK(accel_view_raw(t, 1, (int64_t[]){3}, (int64_t[]){INT64_MAX}, 0) == NULL); /* wraps int64 */
    CHECK(accel_view_raw(t, 2, shape, NULL, 0) == NULL);
    accel_clear_error();
    accel_tensor *in = accel_view_raw(v, 1, (int64_t[]){2}, (int64_t[]){-1}, 5); /* [5, 4]: inside v's reach */
    CHECK(in && accel_get(in, (int64_t[]){1}) == 4.0);
    CHECK(accel_view_raw(t, 1, (int64_t[]){0}, (int64_t[]){1}, 99) != NULL); /* no elements, nothing read */
    accel_tensor *p = accel_tensor_new(ACCEL_F32, ACCEL_SHAPE(4), ACCEL_CPU_DEVICE);
    CHECK(p && ((float *)p->data)[3] == 0.0f);
    accel_tensor_free(p);
    accel_tensor_free(NULL);
    accel_tensor *m = accel_tensor_new(ACCEL_F32, ACCEL_SHAPE(1000000, 1000000), ACCEL_META_DEVICE);
    CHECK(m && m->data == NULL && accel_numel(m) == 1000000000000LL);
    accel_tensor_free(m);
    accel_step_reset();
}

static void test_errors(void) {
    accel_clear_error();
    CHECK(isnan(accel_item(NULL)));
    CHECK(accel_last_status() == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "accel_item");
    accel_clear_error();
    accel_tensor *t = accel_zeros(ACCEL_F32, ACCEL_SHAPE(2));
    accel_step_reset();
    CHECK(isnan(accel_item(t)));
    CHECK_STR_CONTAINS(accel_last_error(), "after its step ended");
    accel_clear_error();
    accel_device d = ACCEL_CPU_DEVICE;
    d.index = 7; /* a served type, an index past its devices: says how many there are */
    CHECK(accel_tensor_new(ACCEL_F32, ACCEL_SHAPE(2), d) == NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "device cpu:7 is not available: there is 1 cpu device here");
    accel_clear_error();
    CHECK(accel_device_parse("npu:0", &d) == ACCEL_ERR_DEVICE);
    CHECK_STR_CONTAINS(accel_last_error(), "npu:0");
    accel_clear_error();
    CHECK(accel_device_parse("cuda:1", &d) == ACCEL_OK && d.index == 1);
    CHECK(!accel_device_available(d));
    /* the index is digits alone (strtol took " 1" and "+1" as 1) */
    CHECK(accel_device_parse("cuda: 1", &d) == ACCEL_ERR_INVALID_ARG);
    CHECK(accel_device_parse("cuda:+1", &d) == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "bad device index in 'cuda:+1'");
    accel_clear_error();
    /* a message that wraps the pending one (as the release paths' errors do) */
    accel_set_error(ACCEL_ERR_IO, "inner %d", 7);
    CHECK(accel_set_error(ACCEL_ERR_DEVICE, "outer (%s) done", accel_last_error()) == ACCEL_ERR_DEVICE);
    CHECK(strcmp(accel_last_error(), "outer (inner 7) done") == 0);
    CHECK(accel_last_status() == ACCEL_ERR_DEVICE);
    accel_clear_error();
}

/* A step whose arena grew past its chunk: the reset replaces the chunks, and
 * a step tensor of the step that ended (here a view made before the growth,
 * as a program makes one before its loop) is still reported when used, not
 * read from freed memory; the next steps run as before. */
static void test_step_tensor_after_growth(void) {
    accel_clear_error();
    accel_step_reset();
    size_t cap0 = accel_arena_capacity(accel_step_arena());
    accel_tensor *x = accel_zeros(ACCEL_F32, ACCEL_SHAPE(2, 3, 4, 8));
    accel_tensor *xt = accel_transpose(x, 1, 2);
    CHECK(xt != NULL);
    int64_t big = (int64_t)(cap0 / sizeof(float)) * 4;
    CHECK(accel_empty(ACCEL_F32, 1, &big) != NULL); /* pushes a chunk */
    accel_step_reset();
    CHECK(accel_arena_capacity(accel_step_arena()) > cap0);
    for (int round = 0; round < 3; round++) {
        CHECK(accel_rope(xt, 0, 10000.0) == NULL);
        CHECK(accel_last_status() == ACCEL_ERR_STATE);
        CHECK_STR_CONTAINS(accel_last_error(), "not a live tensor");
        accel_clear_error();
        CHECK(isnan(accel_item(x)));
        accel_clear_error();
        accel_tensor *y = accel_rope(accel_zeros(ACCEL_F32, ACCEL_SHAPE(1, 2, 3, 4)), 0, 10000.0);
        CHECK(y && accel_get(y, (int64_t[]){0, 1, 2, 3}) == 0.0);
        accel_step_reset();
    }
}

/* Shapes from files: a product past int64 is an error, never a wrapped size. */
static void test_shape_overflow(void) {
    accel_clear_error();
    int64_t huge[2] = {(int64_t)1 << 33, (int64_t)1 << 33};
    CHECK(accel_tensor_new(ACCEL_F32, 2, huge, ACCEL_META_DEVICE) == NULL);
    CHECK(accel_last_status() == ACCEL_ERR_SHAPE);
    CHECK_STR_CONTAINS(accel_last_error(), "accel_tensor_new: shape [8589934592, 8589934592] has too many elements");
    accel_clear_error();
    CHECK(accel_empty(ACCEL_U8, 2, huge) == NULL && accel_last_status() == ACCEL_ERR_SHAPE);
    accel_clear_error();
    int64_t with_empty[3] = {0, (int64_t)1 << 40, (int64_t)1 << 40}; /* its strides would overflow */
    CHECK(accel_tensor_new(ACCEL_F32, 3, with_empty, ACCEL_META_DEVICE) == NULL);
    accel_clear_error();
    int64_t big[2] = {(int64_t)1 << 29, (int64_t)1 << 30}; /* 2^59 elements: fine on meta */
    accel_tensor *t = accel_tensor_new(ACCEL_F64, 2, big, ACCEL_META_DEVICE);
    CHECK(t && accel_numel(t) == (int64_t)1 << 59 && accel_nbytes(t) == (size_t)1 << 62);
    accel_tensor_free(t);
}

static void test_arena_reuse(void) {
    accel_arena *a = accel_arena_create(1024);
    for (int step = 0; step < 3; step++) {
        for (int i = 0; i < 100; i++) CHECK(accel_arena_alloc(a, 1000, 64) != NULL);
        if (step > 0) CHECK(accel_arena_capacity(a) >= accel_arena_used(a));
        size_t cap = accel_arena_capacity(a);
        accel_arena_reset(a);
        if (step > 0) CHECK(accel_arena_capacity(a) == cap); /* no growth after the first step */
    }
    accel_arena_destroy(a);
}

/* A rewind frees what came after its mark, chunks pushed since included; the
 * peak remembers it, and the reset sizes the next step's chunk from the peak,
 * so an alike step that rewinds does not grow the arena again. */
static void test_arena_mark_rewind(void) {
    accel_arena *a = accel_arena_create(1024);
    for (int step = 0; step < 3; step++) {
        char *keep = accel_arena_alloc(a, 100, 16);
        size_t used = accel_arena_used(a);
        accel_arena_mark m = accel_arena_mark_now(a);
        for (int i = 0; i < 50; i++) CHECK(accel_arena_alloc(a, 1000, 64) != NULL);
        CHECK(accel_arena_peak(a) >= 50000);
        CHECK(accel_arena_rewind(a, m) == ACCEL_OK);
        CHECK(accel_arena_used(a) == used && accel_arena_peak(a) >= 50000);
        CHECK((char *)accel_arena_alloc(a, 8, 16) == keep + 112); /* the freed memory is handed out again */
        size_t cap = accel_arena_capacity(a);
        if (step > 0) CHECK(cap >= 50000);
        accel_arena_reset(a);
        CHECK(accel_arena_peak(a) == 0 && accel_arena_used(a) == 0);
        if (step > 0) CHECK(accel_arena_capacity(a) == cap); /* no growth after the first step */
    }
    accel_arena_destroy(a);
}

/* A mark that does not fit the arena is refused, the arena unchanged (it
 * used to abort the process). */
static void test_arena_bad_marks(void) {
    accel_arena *a = accel_arena_create(1024), *b = accel_arena_create(1024);
    accel_arena_alloc(a, 100, 16);
    accel_arena_mark early = accel_arena_mark_now(a);
    accel_arena_alloc(a, 100, 16);
    accel_arena_mark late = accel_arena_mark_now(a);
    for (int i = 0; i < 20; i++) accel_arena_alloc(a, 1000, 64); /* pushes chunks */
    size_t used = accel_arena_used(a);
    CHECK(accel_arena_rewind(b, early) == ACCEL_ERR_STATE); /* another arena's mark */
    CHECK_STR_CONTAINS(accel_last_error(), "not of this arena");
    accel_clear_error();
    CHECK(accel_arena_used(a) == used);
    CHECK(accel_arena_rewind(a, early) == ACCEL_OK && accel_arena_used(a) < used);
    CHECK(accel_arena_rewind(a, late) == ACCEL_ERR_STATE); /* rewound past it */
    CHECK_STR_CONTAINS(accel_last_error(), "already rewound past");
    accel_clear_error();
    accel_arena_reset(a);
    CHECK(accel_arena_rewind(a, early) == ACCEL_ERR_STATE); /* a mark of an earlier step */
    CHECK_STR_CONTAINS(accel_last_error(), "earlier step");
    accel_clear_error();
    CHECK(accel_arena_rewind(NULL, early) == ACCEL_OK);
    accel_arena_destroy(a);
    accel_arena_destroy(b);
}

/* A size that wraps (-1 elements times 8 bytes) got a pointer to a few bytes
 * and moved the arena's end backwards; an alignment not a power of two gave
 * a misaligned one. Both refused, the arena unchanged. */
static void test_arena_bad_sizes(void) {
    accel_arena *a = accel_arena_create(1024);
    char *first = accel_arena_alloc(a, 100, 16);
    size_t used = accel_arena_used(a);
    CHECK(accel_arena_alloc(a, (size_t)-1 * 8, 8) == NULL);
    CHECK(accel_last_status() == ACCEL_ERR_OOM);
    CHECK_STR_CONTAINS(accel_last_error(), "more than an arena can hold");
    accel_clear_error();
    CHECK(accel_arena_alloc(a, SIZE_MAX, 64) == NULL);
    accel_clear_error();
    CHECK(accel_arena_alloc(a, 16, 24) == NULL);
    CHECK(accel_last_status() == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "alignment 24 is not a power of two");
    accel_clear_error();
    CHECK(accel_arena_used(a) == used && accel_arena_peak(a) == used);
    CHECK((char *)accel_arena_alloc(a, 8, 0) == first + 112); /* 0: the default alignment */
    accel_arena_destroy(a);
}

static void test_rng(void) {
    accel_rng r1, r2;
    accel_rng_init(&r1, 42);
    accel_rng_init(&r2, 42);
    accel_tensor *a = accel_empty(ACCEL_F32, ACCEL_SHAPE(100000));
    accel_tensor *b = accel_empty(ACCEL_F32, ACCEL_SHAPE(100000));
    accel_set_num_threads(1);
    accel_rng_normal_(&r1, a, 0, 1);
    accel_set_num_threads(2);
    accel_rng_normal_(&r2, b, 0, 1);
    CHECK(memcmp(a->data, b->data, 400000) == 0); /* independent of thread count */
    double s = 0, s2 = 0;
    for (int i = 0; i < 100000; i++) {
        double v = ((float *)a->data)[i];
        s += v;
        s2 += v * v;
    }
    CHECK(fabs(s / 100000) < 0.02 && fabs(s2 / 100000 - 1) < 0.02);
    int64_t perm[10];
    accel_rng_randperm(&r1, 10, perm);
    int seen = 0;
    for (int i = 0; i < 10; i++) seen |= 1 << perm[i];
    CHECK(seen == 1023);
    /* PyTorch refuses these; they drew silently (a negative std mirrored,
     * an inverted range sampled outside it, keep_prob 1.5 kept all). */
    accel_tensor *x = accel_zeros(ACCEL_F32, ACCEL_SHAPE(4));
    accel_tensor *mask = accel_zeros(ACCEL_U8, ACCEL_SHAPE(4));
    uint64_t offset = r1.offset;
    CHECK(accel_rng_normal_(&r1, x, 0, -1) == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "std >= 0.0");
    CHECK(accel_rng_normal_(&r1, x, NAN, 1) == ACCEL_ERR_INVALID_ARG);
    CHECK(accel_rng_uniform_(&r1, x, 5, 1) == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "lo=5 > hi=1");
    CHECK(accel_rng_uniform_(&r1, x, 0, INFINITY) == ACCEL_ERR_INVALID_ARG);
    CHECK(accel_rng_bernoulli_(&r1, mask, 1.5) == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "keep_prob in [0, 1]");
    CHECK(accel_rng_bernoulli_(&r1, mask, NAN) == ACCEL_ERR_INVALID_ARG);
    accel_clear_error();
    CHECK(r1.offset == offset && accel_item(accel_sum_all(x)) == 0.0); /* nothing drawn */
    CHECK(accel_rng_normal_(&r1, x, 0, 0) == ACCEL_OK && accel_rng_uniform_(&r1, x, 2, 2) == ACCEL_OK);
    CHECK(accel_rng_bernoulli_(&r1, mask, 1.0) == ACCEL_OK && accel_item(accel_sum_all(accel_to_dtype(mask, ACCEL_F32))) == 4);
    accel_step_reset();
}

static void test_print(void) {
    float v[4] = {1, 2, 3, 4.5f};
    accel_tensor *t = accel_from_floats(ACCEL_SHAPE(2, 2), v);
    CHECK(strcmp(accel_tensor_str(t), "tensor([[1.0000, 2.0000],\n        [3.0000, 4.5000]])") == 0);
    accel_tensor *i = accel_arange(ACCEL_I32, 0, 3);
    CHECK(strcmp(accel_tensor_str(i), "tensor([0, 1, 2], dtype=torch.int32)") == 0);
    accel_step_reset();
}

static void test_null_generators(void) {
    /* NULL means the default generator, as torch's generator=None. */
    accel_manual_seed(5);
    uint64_t a = accel_rng_next_u64(NULL);
    accel_manual_seed(5);
    CHECK(accel_rng_next_u64(accel_default_rng()) == a);
    accel_clear_error();
    accel_rng_init(NULL, 1);
    CHECK(accel_last_status() == ACCEL_ERR_INVALID_ARG);
    accel_clear_error();
    accel_rng_randperm(NULL, 3, NULL);
    CHECK_STR_CONTAINS(accel_last_error(), "accel_rng_randperm");
    accel_clear_error();
}

static void test_null_queries(void) {
    char b[16];
    CHECK(accel_numel(NULL) == 0 && accel_nbytes(NULL) == 0);
    CHECK(!accel_is_contiguous(NULL) && !accel_same_shape(NULL, NULL));
    CHECK(strcmp(accel_shape_str(NULL, b, sizeof b), "(null)") == 0);
    CHECK(accel_arena_alloc(NULL, 8, 16) == NULL);
    CHECK(accel_last_status() == ACCEL_ERR_INVALID_ARG);
    accel_clear_error();
    CHECK(accel_arena_used(NULL) == 0 && accel_arena_capacity(NULL) == 0 && accel_arena_generation(NULL) == 0);
    CHECK(accel_tensor_rebind(NULL, NULL, false) == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "accel_tensor_rebind");
    accel_clear_error();
    accel_tensor *s = accel_zeros(ACCEL_F32, ACCEL_SHAPE(2));
    float other[2];
    void *before = s->data;
    /* a step tensor cannot be re-pointed: the status says so and s is unchanged */
    CHECK(accel_tensor_rebind(s, other, true) == ACCEL_ERR_INVALID_ARG && s->data == before);
    accel_clear_error();
    accel_step_reset();
    /* No memory under the elements: refused, not a segfault at the first
     * op (wrap) or in the copy (rebind). A device nobody serves: refused. */
    CHECK(accel_tensor_wrap(NULL, ACCEL_F32, ACCEL_SHAPE(4), ACCEL_CPU_DEVICE) == NULL);
    CHECK(accel_last_status() == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "accel_tensor_wrap: data is NULL for 4 elements");
    accel_clear_error();
    accel_tensor *empty = accel_tensor_wrap(NULL, ACCEL_F32, ACCEL_SHAPE(0), ACCEL_CPU_DEVICE); /* no elements */
    CHECK(empty != NULL);
    accel_tensor_free(empty);
    CHECK(accel_tensor_wrap(other, ACCEL_F32, ACCEL_SHAPE(2), ((accel_device){ACCEL_DEV_NPU, 0})) == NULL);
    CHECK(accel_last_status() == ACCEL_ERR_DEVICE);
    accel_clear_error();
    accel_tensor *own = accel_tensor_new(ACCEL_F32, ACCEL_SHAPE(2), ACCEL_CPU_DEVICE);
    void *had = own->data;
    CHECK(accel_tensor_rebind(own, NULL, true) == ACCEL_ERR_INVALID_ARG && own->data == had);
    CHECK_STR_CONTAINS(accel_last_error(), "cannot copy the contents to NULL");
    accel_clear_error();
    accel_tensor_free(own);
}

/* accel_tensor_to_meta moves a persistent tensor only (as accel_tensor_to_device_): a step tensor is
 * refused and keeps its data (it used to become meta silently, the next op reading no data), a NULL or
 * freed one is named. */
static void test_to_meta_persistent_only(void) {
    accel_tensor *s = accel_ones(ACCEL_F32, ACCEL_SHAPE(2));
    void *had = s->data;
    CHECK(accel_tensor_to_meta(s) == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "accel_tensor_to_meta: t is a step tensor");
    CHECK(s->data == had && s->device.type == ACCEL_DEV_CPU);
    accel_clear_error();
    CHECK(accel_tensor_to_meta(NULL) == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "accel_tensor_to_meta: t is NULL");
    accel_clear_error();
    accel_tensor *p = accel_tensor_new(ACCEL_F32, ACCEL_SHAPE(2), ACCEL_CPU_DEVICE);
    CHECK(accel_tensor_to_meta(p) == ACCEL_OK && p->data == NULL && p->device.type == ACCEL_DEV_META);
    accel_tensor_free(p);
    accel_step_reset();
}

/* The setters that used to return void report their failures (docs/contract.md). */
static void test_setters_report(void) {
    accel_tensor *t = accel_zeros(ACCEL_F32, ACCEL_SHAPE(2, 3));
    CHECK(accel_set(t, (int64_t[]){1, 2}, 4.5) == ACCEL_OK && accel_get(t, (int64_t[]){1, 2}) == 4.5);
    CHECK(accel_set(t, (int64_t[]){2, 0}, 1.0) == ACCEL_ERR_INVALID_ARG); /* index out of range */
    CHECK_STR_CONTAINS(accel_last_error(), "accel_set");
    accel_clear_error();
    CHECK(accel_set(NULL, (int64_t[]){0}, 1.0) != ACCEL_OK);
    CHECK_STR_CONTAINS(accel_last_error(), "accel_set");
    accel_clear_error();
    accel_tensor *m = accel_tensor_new(ACCEL_F32, ACCEL_SHAPE(2), ACCEL_META_DEVICE);
    CHECK(m && accel_set(m, (int64_t[]){0}, 1.0) != ACCEL_OK); /* meta has no data */
    CHECK_STR_CONTAINS(accel_last_error(), "accel_set");
    accel_clear_error();
    accel_tensor_free(m);
    accel_tensor *p = accel_tensor_new(ACCEL_F32, ACCEL_SHAPE(2), ACCEL_CPU_DEVICE);
    float mine[2] = {0};
    CHECK(p && accel_tensor_rebind(p, mine, false) == ACCEL_OK && p->data == (void *)mine);
    CHECK(accel_tensor_rebind(p, NULL, false) == ACCEL_OK); /* no owned memory left to free */
    accel_tensor_free(p);
    CHECK(accel_requires_grad_(NULL, true) != ACCEL_OK);
    CHECK_STR_CONTAINS(accel_last_error(), "accel_requires_grad_");
    accel_clear_error();
    /* As torch: only a floating-point tensor can require grad (an integer one
     * was accepted, then never tracked: its backward said it needed no grad). */
    accel_tensor *ids = accel_zeros(ACCEL_I64, ACCEL_SHAPE(3));
    CHECK(accel_requires_grad_(ids, true) == ACCEL_ERR_INVALID_ARG && !ids->requires_grad);
    CHECK_STR_CONTAINS(accel_last_error(), "accel_requires_grad_: t is int64");
    accel_clear_error();
    CHECK(accel_requires_grad_(ids, false) == ACCEL_OK); /* turning it off is always fine */
    CHECK(accel_tensor_increment_version(NULL) != ACCEL_OK);
    CHECK_STR_CONTAINS(accel_last_error(), "accel_tensor_increment_version");
    accel_clear_error();
    int threads = accel_num_threads();
    CHECK(accel_set_num_threads(0) == ACCEL_ERR_INVALID_ARG && accel_num_threads() == threads);
    CHECK_STR_CONTAINS(accel_last_error(), "accel_set_num_threads");
    accel_clear_error();
    accel_step_reset();
}

/* An integer tensor takes a value its dtype holds, truncated as a cast; a NaN
 * or a value out of range was converted anyway (undefined in C: int32 got
 * INT_MIN for NaN and for 1e10, silently), which PyTorch refuses. */
static void test_integer_values_fit(void) {
    accel_clear_error();
    CHECK(accel_full(ACCEL_I32, ACCEL_SHAPE(2), NAN) == NULL);
    CHECK(accel_last_status() == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "accel_full: value nan cannot be converted to int32");
    accel_clear_error();
    CHECK(accel_full(ACCEL_I32, ACCEL_SHAPE(2), 1e10) == NULL);
    accel_clear_error();
    CHECK(accel_full(ACCEL_I64, ACCEL_SHAPE(2), 0x1p63) == NULL);
    accel_clear_error();
    accel_tensor *u = accel_zeros(ACCEL_U8, ACCEL_SHAPE(2));
    CHECK(accel_fill_(u, -1) == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "accel_fill_: value -1 cannot be converted to uint8");
    CHECK(accel_get(u, (int64_t[]){0}) == 0); /* unchanged */
    accel_clear_error();
    accel_tensor *i8 = accel_zeros(ACCEL_I8, ACCEL_SHAPE(2));
    CHECK(accel_set(i8, (int64_t[]){1}, 128) == ACCEL_ERR_INVALID_ARG);
    CHECK(accel_set(i8, (int64_t[]){1}, INFINITY) == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "accel_set");
    accel_clear_error();
    /* what fits is taken, truncated toward zero; floats and bool take anything */
    CHECK(accel_set(i8, (int64_t[]){1}, -128.9) == ACCEL_OK && accel_get(i8, (int64_t[]){1}) == -128);
    accel_tensor *i64 = accel_full(ACCEL_I64, ACCEL_SHAPE(1), -0x1p63);
    CHECK(i64 && accel_get(i64, (int64_t[]){0}) == -0x1p63);
    accel_tensor *i32 = accel_full(ACCEL_I32, ACCEL_SHAPE(1), 2.7);
    CHECK(i32 && accel_get(i32, (int64_t[]){0}) == 2);
    CHECK(accel_full(ACCEL_F32, ACCEL_SHAPE(1), NAN) && accel_full(ACCEL_BOOL, ACCEL_SHAPE(1), NAN));
    CHECK(accel_last_status() == ACCEL_OK);
    accel_step_reset();
}

/* Materialising into a dtype that does not exist gave the tensor 0 bytes and
 * that dtype, with ACCEL_OK (accel_module_to_empty(root, dev, 55) too). */
static void test_materialize_checks_dtype(void) {
    accel_tensor *m = accel_tensor_new(ACCEL_F32, ACCEL_SHAPE(3), ACCEL_META_DEVICE);
    accel_clear_error();
    CHECK(accel_tensor_materialize(m, ACCEL_CPU_DEVICE, (accel_dtype)55) == ACCEL_ERR_DTYPE);
    CHECK_STR_CONTAINS(accel_last_error(), "accel_tensor_materialize: invalid dtype 55");
    CHECK(m->device.type == ACCEL_DEV_META && m->dtype == ACCEL_F32 && m->data == NULL);
    accel_clear_error();
    CHECK(accel_tensor_materialize(m, ACCEL_CPU_DEVICE, ACCEL_BF16) == ACCEL_OK);
    CHECK(m->dtype == ACCEL_BF16 && m->data && accel_get(m, (int64_t[]){2}) == 0);
    accel_tensor_free(m);
}

/* Fills of zero: +0.0 as bytes (3 MiB and an odd tail), -0.0 keeping its
 * sign in every float dtype, as torch's fill_ does (bf16 and f16 filled
 * +0.0 before: a memset). */
static void test_zero_fills(void) {
    const accel_dtype dts[] = {ACCEL_F32, ACCEL_BF16, ACCEL_F16};
    for (int d = 0; d < 3; d++) {
        accel_tensor *t = accel_empty(dts[d], ACCEL_SHAPE(786433));
        CHECK(t && accel_fill_(t, 1.5) == ACCEL_OK && accel_zero_(t) == ACCEL_OK);
        const unsigned char *b = t->data;
        size_t bad = 0;
        for (size_t i = 0; i < accel_nbytes(t); i++) bad += b[i] != 0;
        CHECK_MSG(bad == 0, "%s: %zu bytes not zeroed", accel_dtype_name(dts[d]), bad);
        CHECK(accel_fill_(t, -0.0) == ACCEL_OK);
        double first = accel_get(t, (int64_t[]){0}), last = accel_get(t, (int64_t[]){786432});
        CHECK_MSG(first == 0.0 && signbit(first) && signbit(last), "%s: -0.0 filled as +0.0", accel_dtype_name(dts[d]));
    }
    accel_step_reset();
}

static void *threads_seen(void *out) {
    accel_tensor *t = accel_zeros(ACCEL_F32, ACCEL_SHAPE(4)); /* a library call: no accel_num_threads first */
    ((int *)out)[0] = omp_get_max_threads();                   /* what this thread's regions and oneDNN use */
    ((int *)out)[1] = accel_num_threads();
    accel_tensor_free(t);
    accel_thread_cleanup();
    return NULL;
}

/* accel_set_num_threads holds for every thread of the process, as
 * torch.set_num_threads: OpenMP's count is per thread, and a thread made
 * before or after the call ran its kernels at OMP_NUM_THREADS' count while
 * accel_num_threads() said otherwise. */
static void test_num_threads_every_thread(void) {
    int before = accel_num_threads(), want = before == 3 ? 2 : 3, seen[2] = {0, 0};
    CHECK(accel_set_num_threads(want) == ACCEL_OK && omp_get_max_threads() == want);
    pthread_t th;
    CHECK(pthread_create(&th, NULL, threads_seen, seen) == 0 && pthread_join(th, NULL) == 0);
    CHECK_MSG(seen[0] == want && seen[1] == want, "another thread runs %d threads, says %d (set: %d)", seen[0],
              seen[1], want);
    CHECK(accel_set_num_threads(before) == ACCEL_OK && accel_num_threads() == before);
}

int main(void) {
    RUN(test_bf16_f16_rounding);
    RUN(test_dtype_names);
    RUN(test_tensors_and_views);
    RUN(test_errors);
    RUN(test_step_tensor_after_growth);
    RUN(test_setters_report);
    RUN(test_to_meta_persistent_only);
    RUN(test_integer_values_fit);
    RUN(test_materialize_checks_dtype);
    RUN(test_zero_fills);
    RUN(test_shape_overflow);
    RUN(test_arena_reuse);
    RUN(test_arena_mark_rewind);
    RUN(test_arena_bad_marks);
    RUN(test_arena_bad_sizes);
    RUN(test_rng);
    RUN(test_print);
    RUN(test_null_generators);
    RUN(test_null_queries);
    RUN(test_num_threads_every_thread);
    return check_summary();
}
