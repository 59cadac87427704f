/* Prepared weights (src/core/prepared.h): autocast's copy of an f32 weight is
 * made once per version of the weight and reused by forward, backward and
 * every micro-batch until a write changes the weight.
 *   - training with the cache is bit-identical to training without it
 *     (losses, gradients, weights; bf16 and f16; accumulation 1 and 4), and
 *     converts once per optimizer step, not per call;
 *   - every library path that writes a weight bumps its storage version: a
 *     forward after the write sees the new values (a writer that forgot
 *     fails here: the forward would reuse the old copy);
 *   - forms die with their weights in any order, also mid-step while the
 *     tape still reads them (ASan/LSan runs check the memory).
 * tests/CMakeLists.txt runs it again with ACCEL_GEMM=dnnl (oneDNN multiplies
 * the bf16 copies itself, so the cached form is the cast, not the widened). */
#include <pthread.h>
#include <unistd.h>

#include "accel/accel.h"
#include "check.h"
#include "core/prepared.h"

/* ------------------------------------------------------------ training, cached vs not */

static accel_llama_config small_config(void) {
    accel_llama_config c = accel_llama_config_default();
    c.vocab_size = 64;
    c.hidden_size = 32;
    c.intermediate_size = 48;
    c.num_hidden_layers = 2;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.max_position_embeddings = 32;
    return c;
}

enum { BATCH = 2, SEQ = 8, STEPS = 3 };

static accel_tensor *batch_ids(int step, int micro) {
    int64_t ids[BATCH * SEQ];
    for (int i = 0; i < BATCH * SEQ; i++) ids[i] = (step * 131 + micro * 17 + i * 7) % 64;
    accel_tensor *t = accel_empty(ACCEL_I64, ACCEL_SHAPE(BATCH, SEQ));
    CHECK(t && accel_tensor_from_host(t, ids) == ACCEL_OK);
    return t;
}

/* Every parameter (or its gradient) of m, in state_dict order, into out. */
static int64_t snapshot(accel_module *m, float *out, bool grads) {
    accel_state_dict *sd = accel_module_state_dict(m);
    int64_t at = 0;
    for (int i = 0; i < sd->n; i++) {
        accel_tensor *t = sd->entries[i].t;
        if (sd->entries[i].is_tied_alias || (grads && !t->grad)) continue;
        if (out) CHECK(accel_to_floats(grads ? t->grad : t, out + at) == ACCEL_OK);
        at += accel_numel(t);
    }
    accel_state_dict_free(sd);
    return at;
}

typedef struct trace {
    float loss[STEPS * 4];
    float *grads, *weights; /* after each step: STEPS x numel */
    uint64_t builds_after_micro[STEPS * 4], rewrites_after_micro[STEPS * 4];
    uint64_t builds_after_step[STEPS];
} trace;

/* m's parameters set from init (snapshot's order). */
static void load_weights(accel_module *m, const float *init) {
    accel_state_dict *sd = accel_module_state_dict(m);
    int64_t at = 0;
    for (int i = 0; i < sd->n; i++) {
        if (sd->entries[i].is_tied_alias) continue;
        CHECK(accel_tensor_from_host(sd->entries[i].t, init + at) == ACCEL_OK);
        at += accel_numel(sd->entries[i].t);
    }
    accel_state_dict_free(sd);
}

/* STEPS AdamW steps of `accum` micro-batches each under autocast dt, from
 * the weights `init`; the step arena is reset after each optimizer step, as
 * a training loop does, and with reset_micro after each micro-batch too (the
 * update then finds the copies handed out by an earlier step, else by its
 * own step, whose tape its backwards emptied). */
static void train(accel_module *m, const float *init, int64_t numel, accel_dtype dt, int accum, bool reset_micro,
                  trace *tr) {
    load_weights(m, init);
    accel_optimizer *opt = accel_optimizer_new_module(ACCEL_OPTIM_ADAMW, m, NULL);
    CHECK(opt != NULL);
    accel__prepared_stats st0 = accel__prepared_stats_get();
    for (int s = 0; s < STEPS; s++) {
        for (int k = 0; k < accum; k++) {
            accel_dtype prev = accel_autocast_begin(dt);
            accel_tensor *loss = accel_llama_loss(m, batch_ids(s, k));
            accel_autocast_end(prev);
            CHECK_MSG(loss && accel_backward(loss) == ACCEL_OK, "%s", accel_last_error());
            CHECK(accel_to_floats(loss, &tr->loss[s * accum + k]) == ACCEL_OK);
            accel__prepared_stats st = accel__prepared_stats_get();
            tr->builds_after_micro[s * accum + k] = st.builds - st0.builds;
            tr->rewrites_after_micro[s * accum + k] = st.rewrites - st0.rewrites;
            if (reset_micro) accel_step_reset();
        }
        snapshot(m, tr->grads + s * numel, true);
        CHECK(accel_optimizer_step(opt) == ACCEL_OK);
        tr->builds_after_step[s] = accel__prepared_stats_get().builds - st0.builds;
        CHECK(accel_optimizer_zero_grad(opt) == ACCEL_OK);
        snapshot(m, tr->weights + s * numel, false);
        accel_step_reset();
    }
    accel_optimizer_free(opt);
}

static void trace_alloc(trace *tr, int64_t numel) {
    memset(tr, 0, sizeof *tr);
    tr->grads = calloc((size_t)(STEPS * numel), sizeof(float));
    tr->weights = calloc((size_t)(STEPS * numel), sizeof(float));
}

static void trace_free(trace *tr) {
    free(tr->grads);
    free(tr->weights);
}

/* A small Llama, and its initial weights in snapshot's order (*init: malloc'd). */
static accel_module *small_model(float **init, int64_t *numel) {
    accel_llama_config c = small_config();
    accel_module *m = accel_llama_new(&c, ACCEL_CPU_DEVICE);
    CHECK(m != NULL);
    *numel = snapshot(m, NULL, false);
    *init = malloc((size_t)*numel * sizeof(float));
    snapshot(m, *init, false);
    return m;
}

static void check_identical(accel_dtype dt, int accum, bool reset_micro) {
    int64_t numel;
    float *init;
    accel_module *m = small_model(&init, &numel);
    trace cached, plain;
    trace_alloc(&cached, numel);
    trace_alloc(&plain, numel);

    train(m, init, numel, dt, accum, reset_micro, &cached);
    bool was = accel__prepared_set_enabled(false);
    train(m, init, numel, dt, accum, reset_micro, &plain);
    accel__prepared_set_enabled(was);

    const char *name = accel_dtype_name(dt);
    CHECK_MSG(memcmp(cached.loss, plain.loss, sizeof(float) * (size_t)(STEPS * accum)) == 0, "%s x%d: losses differ",
              name, accum);
    CHECK_MSG(memcmp(cached.grads, plain.grads, sizeof(float) * (size_t)(STEPS * numel)) == 0,
              "%s x%d: gradients differ", name, accum);
    CHECK_MSG(memcmp(cached.weights, plain.weights, sizeof(float) * (size_t)(STEPS * numel)) == 0,
              "%s x%d: weights differ", name, accum);
    CHECK_MSG(cached.loss[0] != cached.loss[STEPS * accum - 1], "%s x%d: training did not move", name, accum);

    /* Once per step: the first micro-batch of the first step converts every
     * weight the forward multiplies, the others and every backward reuse it.
     * From then on the optimizer's update rounds the new weights into those
     * copies (a rewrite each) and builds again what is made from the copies
     * (oneDNN's layouts, where this CPU's GEMMs take them) right after: the
     * next step's forward and backward build nothing, and builds and
     * rewrites together stay the same count each step. Without the cache
     * nothing is built. */
    uint64_t per_step = cached.builds_after_micro[0];
    CHECK_MSG(per_step >= 2u * 7u + 1u, "%s: %llu weights prepared per step (2 layers x 7 linears + lm_head)", name,
              (unsigned long long)per_step);
    for (int s = 0; s < STEPS; s++)
        for (int k = 0; k < accum; k++) {
            uint64_t b = cached.builds_after_micro[s * accum + k], r = cached.rewrites_after_micro[s * accum + k];
            CHECK_MSG(b + r == (uint64_t)(s + 1) * per_step,
                      "%s x%d: step %d micro-batch %d: %llu builds + %llu rewrites, want %llu", name, accum, s, k,
                      (unsigned long long)b, (unsigned long long)r, (unsigned long long)((s + 1) * per_step));
            CHECK_MSG(r >= (uint64_t)s * (2u * 7u + 1u), "%s x%d: step %d: %llu copies rewritten by the optimizer",
                      name, accum, s, (unsigned long long)r);
            CHECK_MSG(s == 0 || b == cached.builds_after_step[s - 1],
                      "%s x%d: step %d micro-batch %d built %llu forms after the update", name, accum, s, k,
                      (unsigned long long)(b - cached.builds_after_step[s - 1]));
        }
    CHECK(plain.builds_after_micro[STEPS * accum - 1] == 0 && plain.rewrites_after_micro[STEPS * accum - 1] == 0);

    trace_free(&cached);
    trace_free(&plain);
    free(init);
    accel_module_free(m);
    accel_step_reset();
}

static void test_bf16_identical(void) {
    for (int reset_micro = 0; reset_micro < 2; reset_micro++) {
        check_identical(ACCEL_BF16, 1, reset_micro);
        check_identical(ACCEL_BF16, 4, reset_micro);
    }
}

static void test_f16_identical(void) {
    for (int reset_micro = 0; reset_micro < 2; reset_micro++) {
        check_identical(ACCEL_F16, 1, reset_micro);
        check_identical(ACCEL_F16, 4, reset_micro);
    }
}

/* An optimizer step taken while the tape still holds a forward (a loss
 * computed after the backward, its backward run after the update): the
 * update must not round the new weights into the copies that tape reads, so
 * that backward multiplies the weights its forward saw, as without the cache;
 * the step after reads the new ones. Both runs' gradients, weights and next
 * loss agree to the bit, and the update with a live tape rewrote nothing. */
typedef struct late_run {
    float loss;
    float *grads, *weights;
    uint64_t rewrites_live_tape;
} late_run;

static void update_with_live_tape(accel_module *m, const float *init, late_run *r) {
    load_weights(m, init);
    accel_optimizer *opt = accel_optimizer_new_module(ACCEL_OPTIM_ADAMW, m, NULL);
    CHECK(opt && accel_optimizer_zero_grad(opt) == ACCEL_OK); /* the other run's last gradients */
    accel_dtype prev = accel_autocast_begin(ACCEL_BF16);
    accel_tensor *first = accel_llama_loss(m, batch_ids(0, 0));
    CHECK(first && accel_backward(first) == ACCEL_OK);
    accel_tensor *late = accel_llama_loss(m, batch_ids(0, 1)); /* its tape reads the copies of now */
    CHECK(late != NULL);
    uint64_t r0 = accel__prepared_stats_get().rewrites;
    CHECK(accel_optimizer_step(opt) == ACCEL_OK);
    r->rewrites_live_tape = accel__prepared_stats_get().rewrites - r0;
    CHECK(accel_optimizer_zero_grad(opt) == ACCEL_OK);
    CHECK_MSG(accel_backward(late) == ACCEL_OK, "%s", accel_last_error());
    snapshot(m, r->grads, true);
    snapshot(m, r->weights, false);
    accel_step_reset();
    accel_tensor *next = accel_llama_loss(m, batch_ids(1, 0));
    CHECK(next && accel_to_floats(next, &r->loss) == ACCEL_OK);
    accel_autocast_end(prev);
    accel_optimizer_free(opt);
    accel_step_reset();
}

static void test_update_with_live_tape(void) {
    int64_t numel;
    float *init;
    accel_module *m = small_model(&init, &numel);
    late_run run[2];
    for (int k = 0; k < 2; k++) {
        run[k].grads = calloc((size_t)numel, sizeof(float));
        run[k].weights = calloc((size_t)numel, sizeof(float));
        bool was = accel__prepared_set_enabled(k == 0);
        update_with_live_tape(m, init, &run[k]);
        accel__prepared_set_enabled(was);
    }
    CHECK_MSG(run[0].rewrites_live_tape == 0, "%llu copies rewritten under a live tape",
              (unsigned long long)run[0].rewrites_live_tape);
    CHECK(memcmp(run[0].grads, run[1].grads, sizeof(float) * (size_t)numel) == 0);
    CHECK(memcmp(run[0].weights, run[1].weights, sizeof(float) * (size_t)numel) == 0);
    CHECK(memcmp(&run[0].loss, &run[1].loss, sizeof(float)) == 0);
    for (int k = 0; k < 2; k++) {
        free(run[k].grads);
        free(run[k].weights);
    }
    free(init);
    accel_module_free(m);
}

/* Two threads taking turns on one model (docs/contract.md: a handle used by
 * one thread at a time): T runs a forward and keeps its loss; U then runs a
 * forward (taking the copies T's tape holds), its backward and an update.
 * The copies T's tape reads must keep the values T's forward saw: U's update
 * rewrites no copy another thread was handed, and T's gradients are the
 * uncached run's to the bit. */
typedef struct turns {
    accel_module *m;
    pthread_barrier_t forward_done, update_done;
    float *grads;
} turns;

static void *holder_thread(void *arg) {
    turns *c = arg;
    accel_dtype prev = accel_autocast_begin(ACCEL_BF16);
    accel_tensor *loss = accel_llama_loss(c->m, batch_ids(0, 1));
    accel_autocast_end(prev);
    CHECK(loss != NULL);
    pthread_barrier_wait(&c->forward_done);
    pthread_barrier_wait(&c->update_done);
    CHECK_MSG(accel_backward(loss) == ACCEL_OK, "%s", accel_last_error());
    snapshot(c->m, c->grads, true);
    accel_step_reset();
    accel_thread_cleanup();
    return NULL;
}

static void take_turns(accel_module *m, const float *init, float *grads) {
    load_weights(m, init);
    accel_optimizer *opt = accel_optimizer_new_module(ACCEL_OPTIM_ADAMW, m, NULL);
    CHECK(opt && accel_optimizer_zero_grad(opt) == ACCEL_OK);
    turns c = {.m = m, .grads = grads};
    pthread_barrier_init(&c.forward_done, NULL, 2);
    pthread_barrier_init(&c.update_done, NULL, 2);
    pthread_t t;
    CHECK(pthread_create(&t, NULL, holder_thread, &c) == 0);
    pthread_barrier_wait(&c.forward_done);
    accel_dtype prev = accel_autocast_begin(ACCEL_BF16);
    accel_tensor *loss = accel_llama_loss(m, batch_ids(0, 0));
    accel_autocast_end(prev);
    CHECK(loss && accel_backward(loss) == ACCEL_OK);
    CHECK(accel_optimizer_step(opt) == ACCEL_OK);
    CHECK(accel_optimizer_zero_grad(opt) == ACCEL_OK);
    pthread_barrier_wait(&c.update_done);
    pthread_join(t, NULL);
    accel_optimizer_free(opt);
    accel_step_reset();
    pthread_barrier_destroy(&c.forward_done);
    pthread_barrier_destroy(&c.update_done);
}

static void test_update_while_another_thread_holds(void) {
    int64_t numel;
    float *init;
    accel_module *m = small_model(&init, &numel);
    float *grads[2];
    for (int k = 0; k < 2; k++) {
        grads[k] = calloc((size_t)numel, sizeof(float));
        bool was = accel__prepared_set_enabled(k == 0);
        take_turns(m, init, grads[k]);
        accel__prepared_set_enabled(was);
    }
    CHECK_MSG(memcmp(grads[0], grads[1], sizeof(float) * (size_t)numel) == 0,
              "the holding thread's gradients differ from the uncached run's");
    free(grads[0]);
    free(grads[1]);
    free(init);
    accel_module_free(m);
}

/* ------------------------------------------------------------ every writer bumps the version */

enum { IN = 32, OUT = 16, ROWS = 4 };

static accel_tensor *g_x;
/* Forms the forward after a write to the weight rebuilds: its copy, and
 * where oneDNN multiplies bf16 that copy's oneDNN layout too
 * (backends/cpu/gemm.h: accel__gemm_weight). */
static uint64_t g_builds_per_forward;

/* y = x w^T under bf16 autocast, as host floats. */
static void forward(accel_tensor *w, float *y) {
    accel_dtype prev = accel_autocast_begin(ACCEL_BF16);
    accel_tensor *out = accel_linear(g_x, w, NULL);
    accel_autocast_end(prev);
    CHECK_MSG(out && accel_to_floats(out, y) == ACCEL_OK, "%s", accel_last_error());
}

typedef void (*writer)(accel_module *m, accel_tensor *w);

/* Writes w by `write`, then checks that the next (cached) forward rebuilt
 * the copy and equals an uncached forward on the new values. */
static void check_writer(const char *what, accel_module *m, accel_tensor **wp, writer write) {
    float before[ROWS * OUT], after[ROWS * OUT], want[ROWS * OUT];
    forward(*wp, before);
    accel_step_reset(); /* the copy is no longer read by a tape: it may be rebuilt in place */
    write(m, *wp);
    accel_step_reset();
    *wp = accel_module_get_tensor(m, "weight"); /* a load may have replaced the tensor's storage */
    uint64_t builds = accel__prepared_stats_get().builds;
    forward(*wp, after);
    CHECK_MSG(accel__prepared_stats_get().builds == builds + g_builds_per_forward, "%s: the weight's copy was not rebuilt",
              what);
    bool was = accel__prepared_set_enabled(false);
    forward(*wp, want);
    accel__prepared_set_enabled(was);
    CHECK_MSG(memcmp(after, want, sizeof after) == 0, "%s: the forward read the old weight", what);
    CHECK_MSG(memcmp(want, before, sizeof want) != 0, "%s: the write changed nothing (the test cannot fail)", what);
    accel_step_reset();
}

static float g_seq = 1.0f;

/* Host values unlike the weight's before (each call another set). */
static void new_values(float *v) {
    g_seq += 1.0f;
    for (int i = 0; i < OUT * IN; i++) v[i] = 0.01f * (float)((i * 37 + (int)g_seq * 11) % 101) - 0.5f;
}

static void write_copy(accel_module *m, accel_tensor *w) {
    (void)m;
    float v[OUT * IN];
    new_values(v);
    CHECK(accel_copy_(w, accel_from_floats(ACCEL_SHAPE(OUT, IN), v)) == ACCEL_OK);
}

static void write_from_host(accel_module *m, accel_tensor *w) {
    (void)m;
    float v[OUT * IN];
    new_values(v);
    CHECK(accel_tensor_from_host(w, v) == ACCEL_OK);
}

static void write_fill(accel_module *m, accel_tensor *w) {
    (void)m;
    CHECK(accel_fill_(w, 0.25 + g_seq++) == ACCEL_OK);
}

static void write_zero(accel_module *m, accel_tensor *w) {
    (void)m;
    CHECK(accel_zero_(w) == ACCEL_OK);
}

static void write_rng(accel_module *m, accel_tensor *w) {
    (void)m;
    CHECK(accel_rng_normal_(NULL, w, 0.0, 0.1) == ACCEL_OK);
}

/* Half the weight, through a view of its second half. */
static void write_view(accel_module *m, accel_tensor *w) {
    (void)m;
    accel_tensor *half = accel_view_raw(w, 1, (int64_t[]){OUT * IN / 2}, (int64_t[]){1}, OUT * IN / 2);
    CHECK(half && accel_fill_(half, -0.75 + g_seq++) == ACCEL_OK);
}

static void write_raw_then_increment(accel_module *m, accel_tensor *w) {
    (void)m;
    float *p = w->data; /* the cpu: a host address */
    for (int i = 0; i < OUT * IN; i++) p[i] = p[i] * 0.5f + 0.125f;
    accel_tensor_increment_version(w);
}

static void write_sgd_step(accel_module *m, accel_tensor *w) {
    (void)m;
    accel_optim_hparams h = accel_optim_defaults(ACCEL_OPTIM_SGD, 0.5);
    accel_optimizer *opt = accel_optimizer_new_params(ACCEL_OPTIM_SGD, 1, &w, &h);
    CHECK(opt != NULL);
    bool had = w->grad != NULL;
    if (!had) w->grad = accel_tensor_new(ACCEL_F32, 2, w->shape, w->device);
    CHECK(accel_fill_(w->grad, 1.0) == ACCEL_OK);
    CHECK(accel_optimizer_step(opt) == ACCEL_OK);
    accel_optimizer_free(opt);
}

/* Adam on the module's flat buffer: the update writes the buffer, not the
 * weight's header; the weight's copy was made from the buffer's bytes. */
static void write_flat_adam(accel_module *m, accel_tensor *w) {
    accel_flat_params *fp = accel_module_flatten(m, 16, 1);
    CHECK(fp != NULL);
    accel_flat_buffer *b = &fp->buffers[ACCEL_F32];
    int64_t n = 0;
    for (int i = 0; i < b->n; i++) n += accel_numel(b->tensors[i]);
    accel_tensor *params = accel_tensor_wrap(b->params, ACCEL_F32, 1, &n, b->device);
    accel_tensor *grads = accel_tensor_wrap(b->grads, ACCEL_F32, 1, &n, b->device);
    CHECK(accel_fill_(grads, 1.0) == ACCEL_OK);
    accel_optim_hparams h = accel_optim_defaults(ACCEL_OPTIM_ADAM, 0.1);
    accel_optimizer *opt = accel_optimizer_new_flat(ACCEL_OPTIM_ADAM, params, grads, &h);
    CHECK(opt != NULL);
    float before[ROWS * OUT], after[ROWS * OUT], want[ROWS * OUT];
    forward(w, before); /* the copy of the flattened weight */
    accel_step_reset();
    CHECK(accel_optimizer_step(opt) == ACCEL_OK);
    uint64_t builds = accel__prepared_stats_get().builds;
    forward(w, after);
    CHECK_MSG(accel__prepared_stats_get().builds == builds + g_builds_per_forward,
              "flat adam: the weight's copy was not rebuilt");
    bool was = accel__prepared_set_enabled(false);
    forward(w, want);
    accel__prepared_set_enabled(was);
    CHECK_MSG(memcmp(after, want, sizeof after) == 0, "flat adam: the forward read the old weight");
    CHECK(memcmp(after, before, sizeof after) != 0);
    accel_step_reset();
    accel_optimizer_free(opt);
    accel_tensor_free(params);
    accel_tensor_free(grads);
    accel_flat_params_free(fp); /* copies the weight back into its own memory */
}

static const char *fixture_path(void) {
    static char path[64];
    snprintf(path, sizeof path, "/tmp/accel_weight_cache_%d.safetensors", (int)getpid());
    return path;
}

static void write_safetensors(accel_module *m, accel_tensor *w) {
    (void)m;
    float v[OUT * IN];
    new_values(v);
    accel_tensor *src = accel_tensor_new(ACCEL_F32, 2, w->shape, ACCEL_CPU_DEVICE);
    CHECK(src && accel_tensor_from_host(src, v) == ACCEL_OK);
    const char *name = "weight";
    CHECK(accel_safetensors_save(fixture_path(), 1, &name, &src, 0, NULL) == ACCEL_OK);
    accel_tensor_free(src);
    accel_safetensors *st = accel_safetensors_open(fixture_path());
    CHECK(st && accel_safetensors_load_into(st, "weight", w) == ACCEL_OK);
    accel_safetensors_close(st);
    unlink(fixture_path());
}

/* A broadcast into the weight's memory (DDP's sync at prepare). Root 0 of a
 * group of one: the write is the group's, the values the same; so the
 * values change first, with the version bumped only by the collective: a
 * raw write, as a peer's bytes arrive. */
static void write_broadcast(accel_module *m, accel_tensor *w) {
    (void)m;
    accel_pg *pg = accel_dist_default_group();
    CHECK(pg != NULL);
    float *p = w->data;
    for (int i = 0; i < OUT * IN; i++) p[i] += 0.0625f;
    CHECK(accel_pg_broadcast(pg, w->data, (size_t)accel_numel(w), ACCEL_F32, 0) == ACCEL_OK);
}

static void test_every_writer_bumps(void) {
    accel_module *m = accel_linear_new(IN, OUT, false, ACCEL_CPU_DEVICE, ACCEL_F32);
    CHECK(m != NULL);
    accel_tensor *w = accel_module_get_tensor(m, "weight");
    float xv[ROWS * IN];
    for (int i = 0; i < ROWS * IN; i++) xv[i] = 0.02f * (float)(i % 23) - 0.2f;
    g_x = accel_tensor_new(ACCEL_F32, 2, (int64_t[]){ROWS, IN}, ACCEL_CPU_DEVICE);
    CHECK(g_x && accel_tensor_from_host(g_x, xv) == ACCEL_OK);
    CHECK(accel_dist_init() == ACCEL_OK);
    float y0[ROWS * OUT];
    forward(w, y0); /* the forms of w and of g_x */
    accel_step_reset();
    CHECK(accel_fill_(w, 0.25) == ACCEL_OK);
    uint64_t b0 = accel__prepared_stats_get().builds;
    forward(w, y0);
    g_builds_per_forward = accel__prepared_stats_get().builds - b0;
    CHECK(g_builds_per_forward >= 1);
    accel_step_reset();

    check_writer("accel_copy_", m, &w, write_copy);
    check_writer("accel_tensor_from_host", m, &w, write_from_host);
    check_writer("accel_fill_", m, &w, write_fill);
    check_writer("accel_zero_", m, &w, write_zero);
    check_writer("accel_rng_normal_", m, &w, write_rng);
    check_writer("a view's accel_fill_", m, &w, write_view);
    check_writer("t->data + accel_tensor_increment_version", m, &w, write_raw_then_increment);
    check_writer("sgd step", m, &w, write_sgd_step);
    check_writer("adam on a flat buffer", m, &w, write_flat_adam);
    check_writer("accel_safetensors_load_into", m, &w, write_safetensors);
    check_writer("accel_pg_broadcast", m, &w, write_broadcast);

    /* the version itself: every write moves it, a read does not */
    uint64_t v = accel__tensor_version(w);
    float y[ROWS * OUT];
    forward(w, y);
    CHECK(accel__tensor_version(w) == v);
    CHECK(accel_fill_(w, 1.0) == ACCEL_OK);
    CHECK(accel__tensor_version(w) > v);

    accel_dist_finalize();
    accel_tensor_free(g_x);
    accel_module_free(m);
    accel_step_reset();
}

/* ------------------------------------------------------------ lifetimes */

/* Two models, forms in both, freed in the order given; the bytes held in
 * forms go back to what they were. */
static void two_models(bool first_first) {
    int64_t bytes0 = accel__prepared_stats_get().bytes;
    accel_llama_config c = small_config();
    accel_module *a = accel_llama_new(&c, ACCEL_CPU_DEVICE), *b = accel_llama_new(&c, ACCEL_CPU_DEVICE);
    CHECK(a && b);
    for (int i = 0; i < 2; i++) {
        accel_dtype prev = accel_autocast_begin(ACCEL_BF16);
        accel_tensor *la = accel_llama_loss(a, batch_ids(0, i)), *lb = accel_llama_loss(b, batch_ids(1, i));
        accel_autocast_end(prev);
        CHECK_MSG(la && lb && accel_backward(accel_add(la, lb)) == ACCEL_OK, "%s", accel_last_error());
        accel_step_reset();
    }
    CHECK(accel__prepared_stats_get().bytes > bytes0);
    accel_module_free(first_first ? a : b);
    accel_module_free(first_first ? b : a);
    accel_step_reset();
    CHECK(accel__prepared_stats_get().bytes == bytes0);
}

static void test_two_models_free_order(void) {
    two_models(true);
    two_models(false);
}

/* x's gradient (dX = dY W reads the weight's saved operand) after the
 * weight's storage was replaced between the forward and the backward (as
 * ZeRO-3 regathers a unit): the tape's copy must stay valid until the step
 * ends (ASan sees a read of freed memory otherwise). */
static void grad_after_mid_step_release(bool cache, float *gx) {
    bool was = accel__prepared_set_enabled(cache);
    accel_module *m = accel_linear_new(IN, OUT, false, ACCEL_CPU_DEVICE, ACCEL_F32);
    accel_tensor *w = accel_module_get_tensor(m, "weight");
    float wv[OUT * IN];
    for (int i = 0; i < OUT * IN; i++) wv[i] = 0.01f * (float)(i % 97) - 0.4f;
    CHECK(accel_tensor_from_host(w, wv) == ACCEL_OK);
    accel_tensor *x = accel_tensor_new(ACCEL_F32, 2, (int64_t[]){ROWS, IN}, ACCEL_CPU_DEVICE);
    CHECK(x && accel_fill_(x, 0.5) == ACCEL_OK);
    x->requires_grad = true;
    accel_dtype prev = accel_autocast_begin(ACCEL_BF16);
    accel_tensor *y = accel_sum(accel_linear(x, w, NULL), 0, NULL, false);
    accel_autocast_end(prev);
    float *moved = accel_malloc(sizeof(float) * OUT * IN);
    accel_tensor_rebind(w, moved, true); /* the form goes, but this step's tape reads it */
    CHECK(y && accel_backward(y) == ACCEL_OK);
    CHECK(accel_to_floats(x->grad, gx) == ACCEL_OK);
    accel_step_reset();

    prev = accel_autocast_begin(ACCEL_BF16);
    y = accel_sum(accel_linear(x, w, NULL), 0, NULL, false);
    accel_autocast_end(prev);
    CHECK_MSG(y != NULL, "%s", accel_last_error());
    accel_module_free(m); /* mid-step: the form is freed at the step's end */
    accel_step_reset();
    accel_free(moved);
    accel_tensor_free(x);
    accel__prepared_set_enabled(was);
}

static void test_released_mid_step(void) {
    float cached[ROWS * IN], plain[ROWS * IN];
    grad_after_mid_step_release(true, cached);
    grad_after_mid_step_release(false, plain);
    CHECK(memcmp(cached, plain, sizeof cached) == 0);
}

int main(void) {
    RUN(test_bf16_identical);
    RUN(test_f16_identical);
    RUN(test_update_with_live_tape);
    RUN(test_update_while_another_thread_holds);
    RUN(test_every_writer_bumps);
    RUN(test_two_models_free_order);
    RUN(test_released_mid_step);
    return check_summary();
}
