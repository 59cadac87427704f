/* accel_generate and accel_sample_logits: greedy, temperature, top-k, top-p
 * (transformers' warper semantics), seeds, eos, argument errors. Greedy
 * against transformers is in test_llama_hf. */
#include <math.h>
#include <string.h>

#include "accel/autograd.h"
#include "accel/bigmodel.h"
#include "check.h"

static void test_greedy_and_ties(void) {
    accel_tensor *l = accel_from_floats(ACCEL_SHAPE(5), (const float[]){0.1f, 2.0f, -1.0f, 2.0f, 0.5f});
    accel_generate_opts o = {0};
    CHECK(accel_sample_logits(l, &o, NULL) == 1); /* first index on ties, like torch.argmax */
    o.do_sample = true;
    CHECK(accel_sample_logits(l, &o, NULL) == -1); /* sampling needs a generator */
    CHECK_STR_CONTAINS(accel_last_error(), "generator");
    accel_clear_error();
    /* logits are one row */
    CHECK(accel_sample_logits(accel_zeros(ACCEL_F32, ACCEL_SHAPE(1, 5)), &o, NULL) == -1);
    CHECK_STR_CONTAINS(accel_last_error(), "expected one non-empty row");
    accel_clear_error();
    accel_step_reset();
}

/* counts of 4000 draws from logits log(p) with options o */
static void draw(const float *p, int n, const accel_generate_opts *o, uint64_t seed, int *counts) {
    accel_rng rng;
    accel_rng_init(&rng, seed);
    memset(counts, 0, sizeof(int) * (size_t)n);
    for (int k = 0; k < 4000; k++) {
        float l[8];
        for (int i = 0; i < n; i++) l[i] = logf(p[i]);
        int64_t t = accel_sample_logits(accel_from_floats(1, (const int64_t[]){n}, l), o, &rng);
        CHECK(t >= 0 && t < n);
        if (t >= 0 && t < n) counts[t]++;
        accel_step_reset();
    }
}

static void test_sampling_distribution(void) {
    const float p[4] = {0.15f, 0.5f, 0.05f, 0.3f};
    int c[4];
    accel_generate_opts o = {.do_sample = true};
    draw(p, 4, &o, 1, c);
    for (int i = 0; i < 4; i++) CHECK_CLOSE(c[i] / 4000.0, p[i], 0, 0.03);
    /* top-k 2: only the two largest, renormalised 0.5/0.8 and 0.3/0.8 */
    o.top_k = 2;
    draw(p, 4, &o, 2, c);
    CHECK(c[0] == 0 && c[2] == 0);
    CHECK_CLOSE(c[1] / 4000.0, 0.625, 0, 0.03);
    /* top-p 0.7: ascending cumulative 0.05, 0.2, 0.5, 1.0; removed while <= 0.3 */
    o.top_k = 0;
    o.top_p = 0.7;
    draw(p, 4, &o, 3, c);
    CHECK(c[0] == 0 && c[2] == 0 && c[1] > 0 && c[3] > 0);
    /* top-p 0.4: only the 0.5 token survives */
    o.top_p = 0.4;
    draw(p, 4, &o, 4, c);
    CHECK(c[1] == 4000);
    /* temperature: 0.05 sharpens to the argmax, 10 flattens towards uniform */
    o.top_p = 1;
    o.temperature = 0.05;
    draw(p, 4, &o, 5, c);
    CHECK(c[1] > 3990);
    o.temperature = 10;
    draw(p, 4, &o, 6, c);
    for (int i = 0; i < 4; i++) CHECK(c[i] > 800 && c[i] < 1200);
}

/* Out-of-range sampling parameters: an error naming the parameter, as
 * transformers' warpers raise; greedy decoding ignores them. */
static void expect_bad_option(accel_generate_opts o, const char *needle) {
    accel_tensor *l = accel_from_floats(ACCEL_SHAPE(3), (const float[]){0.f, 1.f, 2.f});
    accel_rng rng;
    accel_rng_init(&rng, 1);
    accel_clear_error();
    CHECK_MSG(accel_sample_logits(l, &o, &rng) == -1, "%s", needle);
    CHECK_STR_CONTAINS(accel_last_error(), needle);
    accel_clear_error();
    CHECK(accel_generate_opts_check(&o, 1) == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), needle);
    accel_clear_error();
    o.do_sample = false;
    CHECK(accel_generate_opts_check(&o, 1) == ACCEL_OK);
}

static void test_bad_options(void) {
    accel_generate_opts o = {.do_sample = true};
    CHECK(accel_generate_opts_check(&o, 3) == ACCEL_OK); /* zero fields: the defaults */
    accel_generate_opts b = o;
    b.temperature = -1;
    expect_bad_option(b, "`temperature` (=-1)");
    b.temperature = NAN;
    expect_bad_option(b, "`temperature` (=nan)");
    b = o;
    b.top_k = -3;
    expect_bad_option(b, "`top_k` has to be a non-negative integer (0: off), but is -3");
    b = o;
    b.top_p = 5;
    expect_bad_option(b, "`top_p` has to be a float in (0, 1] (0: the default, 1: off), but is 5");
    b.top_p = -0.5;
    expect_bad_option(b, "but is -0.5");
    b.top_p = NAN;
    expect_bad_option(b, "but is nan");
    b = o;
    b.max_new_tokens = -1;
    CHECK(accel_generate_opts_check(&b, 3) == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "`max_new_tokens` (=-1)");
    accel_clear_error();
    b.max_new_tokens = INT64_MAX - 1; /* n_prompt + max_new_tokens slots: not addressable */
    CHECK(accel_generate_opts_check(&b, 3) == ACCEL_ERR_INVALID_ARG);
    accel_clear_error();
}

static accel_module *fixture(accel_dispatched **d) {
    accel_module *m = accel_llama_from_pretrained("data/hf_llama_basic", NULL, NULL, NULL, NULL, d);
    CHECK_MSG(m != NULL, "%s", accel_last_error());
    return m;
}

static void test_generate_seeds_and_eos(void) {
    accel_dispatched *d = NULL;
    accel_module *m = fixture(&d);
    if (!m) return;
    const int64_t prompt[3] = {5, 9, 77};
    int64_t a[32], b[32], c[32], n_a, n_b, n_c;
    accel_generate_opts o = {.max_new_tokens = 12, .do_sample = true, .top_k = 20, .top_p = 0.95,
                                .temperature = 1.5, .seed = 42};
    accel_generate_opts wrong = o;
    wrong.top_p = 5;
    CHECK(accel_generate(m, prompt, 3, &wrong, a, &n_a) == ACCEL_ERR_INVALID_ARG); /* before any work */
    CHECK_STR_CONTAINS(accel_last_error(), "accel_generate: `top_p`");
    accel_clear_error();
    CHECK(accel_generate(m, prompt, 3, &o, a, &n_a) == ACCEL_OK);
    CHECK(accel_generate(m, prompt, 3, &o, b, &n_b) == ACCEL_OK);
    o.seed = 43;
    CHECK(accel_generate(m, prompt, 3, &o, c, &n_c) == ACCEL_OK);
    CHECK(n_a == 15 && n_b == 15 && n_c == 15);
    CHECK(memcmp(a, b, sizeof a[0] * 15) == 0);
    CHECK(memcmp(a, c, sizeof a[0] * 15) != 0);
    CHECK(a[0] == 5 && a[1] == 9 && a[2] == 77);
    /* greedy with eos = its own 2nd new token stops right there */
    accel_generate_opts g = {.max_new_tokens = 8};
    float logits[96];
    g.prompt_logits = accel_tensor_new(ACCEL_F32, ACCEL_SHAPE(96), ACCEL_CPU_DEVICE);
    CHECK(accel_generate(m, prompt, 3, &g, a, &n_a) == ACCEL_OK && n_a == 11);
    CHECK(accel_to_floats(g.prompt_logits, logits) == ACCEL_OK);
    accel_tensor_free(g.prompt_logits);
    int64_t best = 0;
    for (int i = 1; i < 96; i++)
        if (logits[i] > logits[best]) best = i;
    CHECK(best == a[3]); /* the prompt's last logits pick the first new token */
    g.has_eos = true;
    g.eos_token_id = a[4];
    g.prompt_logits = NULL;
    CHECK(accel_generate(m, prompt, 3, &g, b, &n_b) == ACCEL_OK);
    CHECK(n_b == 5 && b[4] == a[4]);
    /* no new tokens: only the prompt's logits */
    g.max_new_tokens = 0;
    CHECK(accel_generate(m, prompt, 3, &g, b, &n_b) == ACCEL_OK && n_b == 3);
    /* errors */
    const int64_t bad[2] = {1, 96};
    CHECK(accel_generate(m, bad, 2, &g, b, &n_b) == ACCEL_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(accel_last_error(), "prompt id 96");
    accel_clear_error();
    CHECK(accel_generate(m, prompt, 0, &g, b, &n_b) == ACCEL_ERR_INVALID_ARG);
    accel_clear_error();
    g.prompt_logits = accel_tensor_new(ACCEL_F32, ACCEL_SHAPE(5), ACCEL_CPU_DEVICE);
    CHECK(accel_generate(m, prompt, 3, &g, b, &n_b) == ACCEL_ERR_SHAPE);
    CHECK_STR_CONTAINS(accel_last_error(), "prompt_logits float32 [5]: expected a contiguous float tensor of 96 elements");
    accel_clear_error();
    accel_tensor_free(g.prompt_logits);
    accel_dispatched_free(d);
    accel_module_free(m);
}

int main(void) {
    accel_set_grad_enabled(false); /* inference only */
    RUN(test_greedy_and_ties);
    RUN(test_sampling_distribution);
    RUN(test_bad_options);
    RUN(test_generate_seeds_and_eos);
    accel_thread_cleanup();
    return check_summary();
}
