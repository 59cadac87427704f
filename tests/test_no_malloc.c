/* The promise of CONVENTIONS.md: a training step allocates nothing after the
 * first one. A counting allocator watches 4 steps of a small Llama (forward,
 * loss, backward, clip, AdamW step, zero_grad, step reset), with per-tensor
 * parameters, with flattened parameters and a flat optimizer, and with
 * activation checkpointing (its arena rewinds and its bounce buffer); and
 * mixed_precision='fp8''s Linears on the cpu reference, with the scale
 * updates the Accelerator makes after each forward and backward (the
 * model's metas and buffers made once, fp8_scaling.h). ZeRO-3 on a device,
 * on 1 to 3 processes: tests/test_zero3_device_memory.c. */
#include <stdlib.h>

#include "accel/accel.h"
#include "accelerator/fp8_scaling.h"
#include "check.h"
#include "count_alloc.h"
#include "fp8_fixture.h"
#include "nn/fp8_modules.h"
#include "ops/fp8_linear.h"

static accel_module *small_llama(void) {
    accel_llama_config c = accel_llama_config_default();
    c.vocab_size = 48;
    c.hidden_size = 32;
    c.intermediate_size = 48;
    c.num_hidden_layers = 2;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.max_position_embeddings = 32;
    accel_manual_seed(0);
    return accel_llama_new(&c, ACCEL_CPU_DEVICE);
}

/* Runs 4 steps; allocs[s] = allocations made during step s. */
static void train(accel_module *m, accel_optimizer *opt, long allocs[4]) {
    int64_t ids_data[2 * 12];
    for (int i = 0; i < 24; i++) ids_data[i] = (i * 7 + 3) % 48;
    double first = 0, last = 0;
    for (int s = 0; s < 4; s++) {
        long before = n_allocs;
        accel_tensor *ids = accel_from_data(ACCEL_I64, ACCEL_SHAPE(2, 12), ids_data);
        accel_tensor *loss = accel_llama_loss(m, ids);
        CHECK_MSG(loss != NULL, "%s", accel_last_error());
        if (!loss) return;
        *(s == 0 ? &first : &last) = accel_item(loss);
        CHECK(accel_backward(loss) == ACCEL_OK);
        CHECK(!isnan(accel_optimizer_clip_grad_norm(opt, 1.0, 2.0)));
        CHECK(accel_optimizer_step(opt) == ACCEL_OK);
        accel_optimizer_zero_grad(opt);
        accel_step_reset();
        allocs[s] = n_allocs - before;
    }
    CHECK(last < first); /* it trains */
}

static void check_per_tensor_params(bool checkpointing) {
    accel_module *m = small_llama();
    CHECK(accel_module_set_gradient_checkpointing(m, checkpointing) == ACCEL_OK);
    accel_tensor **ps;
    int n = accel_module_parameters(m, &ps);
    accel_optim_hparams h = accel_optim_defaults(ACCEL_OPTIM_ADAMW, 1e-2);
    accel_optimizer *opt = accel_optimizer_new_params(ACCEL_OPTIM_ADAMW, n, ps, &h);
    long allocs[4];
    train(m, opt, allocs);
    CHECK(allocs[0] > 0); /* grads and the step arena appear in step 1 */
    for (int s = 1; s < 4; s++) CHECK_MSG(allocs[s] == 0, "step %d made %ld allocations", s + 1, allocs[s]);
    accel_optimizer_free(opt);
    accel_free(ps);
    accel_module_free(m);
}

static void test_per_tensor_params(void) { check_per_tensor_params(false); }
static void test_checkpointed(void) { check_per_tensor_params(true); }

static void test_flat_params(void) {
    accel_module *m = small_llama();
    accel_flat_params *fp = accel_module_flatten(m, 16, 64);
    accel_flat_buffer *b = &fp->buffers[ACCEL_F32];
    accel_optim_hparams h = accel_optim_defaults(ACCEL_OPTIM_ADAMW, 1e-2);
    accel_tensor *params = accel_tensor_wrap(b->params, ACCEL_F32, 1, &b->numel, b->device);
    accel_tensor *grads = accel_tensor_wrap(b->grads, ACCEL_F32, 1, &b->numel, b->device);
    accel_optimizer *opt = accel_optimizer_new_flat(ACCEL_OPTIM_ADAMW, params, grads, &h);
    accel_tensor_free(params);
    accel_tensor_free(grads);
    long allocs[4];
    train(m, opt, allocs);
    for (int s = 1; s < 4; s++) CHECK_MSG(allocs[s] == 0, "step %d made %ld allocations", s + 1, allocs[s]);
    accel_optimizer_free(opt);
    accel_flat_params_free(fp);
    accel_module_free(m);
}

/* Two fp8 Linears as a prepared fp8 model runs them (deferred updates): the
 * forward under the fp8 autocast with the model's forward log and weight
 * cache (its casts rebuilt in place when SGD writes the weights), its X and W
 * updates, the backward with a log, its dY updates, SGD, step reset. */
static void test_fp8_linears(void) {
    accel_module *kids[2] = {accel_linear_new(32, 48, true, ACCEL_CPU_DEVICE, ACCEL_F32),
                             accel_linear_new(48, 32, false, ACCEL_CPU_DEVICE, ACCEL_F32)};
    accel_module *m = accel_sequential_new(2, kids);
    accel__fp8_recipe r = accel__fp8_recipe_default();
    r.history_len = 8, r.deferred_update = true;
    accel__fp8_state *fs = NULL;
    accel__fp8_log backward = {0};
    CHECK(accel__fp8_convert_model(m, r) == ACCEL_OK && accel__fp8_state_new(m, &fs) == ACCEL_OK);
    CHECK(fs && fs->n == 2 && accel__fp8_log_reserve(&backward, fs->n) == ACCEL_OK);
    accel_optimizer *opt = accel_optimizer_new_module(ACCEL_OPTIM_SGD, m, NULL);
    long allocs[4];
    for (int s = 0; s < 4 && fs; s++) {
        long before = n_allocs;
        accel_tensor *x = accel_full(ACCEL_F32, ACCEL_SHAPE(2, 8, 32), 0.5 + s);
        accel_tensor *y = fp8_hooked_forward(m, x, &r, fs);
        CHECK_MSG(y != NULL, "%s", accel_last_error());
        accel__fp8_log *lprev = accel__fp8_log_begin(&backward);
        CHECK(y && accel_backward(accel_sum_all(y)) == ACCEL_OK);
        accel__fp8_log_end(lprev);
        CHECK(backward.n == 2 && accel__fp8_reduce_and_update(NULL, fs, ACCEL__FP8_DY, 1, r, &backward) == ACCEL_OK);
        CHECK(accel_optimizer_step(opt) == ACCEL_OK);
        accel_optimizer_zero_grad(opt);
        accel_step_reset();
        allocs[s] = n_allocs - before;
    }
    for (int s = 1; s < 4; s++) CHECK_MSG(allocs[s] == 0, "fp8 step %d made %ld allocations", s + 1, allocs[s]);
    accel_optimizer_free(opt);
    accel__fp8_log_free(&backward);
    accel__fp8_state_free(fs);
    accel_module_free(m);
}

int main(void) {
    count_alloc_install();
    RUN(test_per_tensor_params);
    RUN(test_flat_params);
    RUN(test_checkpointed);
    RUN(test_fp8_linears);
    accel_thread_cleanup();
    accel_set_allocator(NULL);
    return check_summary();
}
