/* A training step's host-side figures on a device, counted on the hostless
 * test device (a GPU's stand-in: its kernels are the CPU's, its memory is not
 * the host's): after the first steps, a step of a Llama prepared by the
 * Accelerator (made on the cpu and placed on the device; bf16 autocast,
 * AdamW, and f32; with gradient accumulation too, whose loss share the
 * fused cross-entropy's backward multiplies in on the device instead of
 * reading it) makes no persistent device allocation (on a GPU: no
 * cudaMalloc; step memory comes from the step pool) and no device-to-host
 * read (no host wait: the host can run ahead of the stream), and launches the
 * same number of kernels every step. Prints the figures docs/cuda.md quotes.
 * The loss is read once, after the measured steps. */
#include <stdio.h>

#include "accel/accel.h"
#include "accel/accelerator.h"
#include "backends/hostless/hostless.h"
#include "check.h"

enum { WARMUP = 2, MEASURED = 3, B = 4, T = 16 };

static accel_tensor *batch(int step, accel_device dev) {
    int64_t ids[B * T];
    for (int i = 0; i < B * T; i++) ids[i] = (step * 7 + i * 13) % 97;
    return accel_to_device(accel_from_data(ACCEL_I64, ACCEL_SHAPE(B, T), ids), dev);
}

static void run(const char *mixed_precision, int accumulation) {
    accel_accelerator_opts o = accel_accelerator_opts_default();
    o.mixed_precision = mixed_precision;
    o.gradient_accumulation_steps = accumulation;
    accel_accelerator *acc = accel_accelerator_new(&o);
    CHECK_MSG(acc != NULL, "%s", accel_last_error());
    if (!acc) return;
    accel_device dev = accel_accelerator_device(acc);
    CHECK(dev.type == ACCEL_DEV_HOSTLESS);
    accel_manual_seed(1);
    accel_llama_config c = accel_llama_config_default();
    c.vocab_size = 97, c.hidden_size = 64, c.intermediate_size = 160, c.num_hidden_layers = 2;
    c.num_attention_heads = 4, c.num_key_value_heads = 2, c.max_position_embeddings = T;
    accel_module *m = accel_llama_new(&c, ACCEL_CPU_DEVICE);
    accel_optim_hparams h = accel_optim_defaults(ACCEL_OPTIM_ADAMW, 1e-3);
    accel_optimizer *opt = accel_optimizer_new_module(ACCEL_OPTIM_ADAMW, m, &h);
    CHECK(m && opt && accel_accelerator_prepare(acc, m, opt, NULL) == ACCEL_OK);
    accel__hostless_calls before, after;
    int64_t kernels[MEASURED] = {0};
    accel_tensor *loss = NULL;
    for (int s = 0; s < WARMUP + MEASURED; s++) {
        accel_step_reset();
        accel__hostless_call_counts(dev.index, &before);
        accel_tensor *ids = batch(s, dev);
        CHECK(accel_accelerator_accumulate(acc) == ACCEL_OK); /* with accumulation, every other step updates */
        accel_dtype prev = accel_accelerator_autocast_begin(acc);
        loss = accel_llama_loss(m, ids);
        CHECK(accel_accelerator_autocast_end(acc, prev) == ACCEL_OK);
        CHECK_MSG(loss && accel_accelerator_backward(acc, loss) == ACCEL_OK &&
                      accel_accelerator_optimizer_step(acc, opt) == ACCEL_OK,
                  "step %d: %s", s, accel_last_error());
        accel_accelerator_zero_grad(acc, opt);
        accel__hostless_call_counts(dev.index, &after);
        if (s < WARMUP) continue;
        int64_t allocs = after.allocs - before.allocs, reads = after.host_reads - before.host_reads;
        kernels[s - WARMUP] = after.kernels - before.kernels;
        CHECK_MSG(allocs == 0 && reads == 0,
                  "%s, accumulation %d, step %d: %lld device allocations, %lld device-to-host reads", mixed_precision,
                  accumulation, s, (long long)allocs, (long long)reads);
    }
    /* with accumulation, steps alternate between accumulating and updating */
    for (int i = accumulation; i < MEASURED; i++) CHECK(kernels[i] == kernels[i - accumulation] && kernels[i] > 0);
    double l = loss ? accel_item(loss) : 0.0;
    CHECK(l > 0.0 && l < 10.0);
    printf("mixed_precision=%s, accumulation %d: steps launch %lld, %lld, %lld kernels, 0 device allocations, 0 host "
           "reads (loss %.4f)\n",
           mixed_precision, accumulation, (long long)kernels[0], (long long)kernels[1], (long long)kernels[2], l);
    accel_step_reset();
    accel_accelerator_free(acc);
    accel_optimizer_free(opt);
    accel_module_free(m);
}

static void test_steady_steps(void) {
    run("no", 1);
    run("bf16", 1);
    run("bf16", 2);
}

int main(void) {
    if (accel__hostless_register(1) != ACCEL_OK) {
        fprintf(stderr, "%s\n", accel_last_error());
        return 1;
    }
    accel_set_default_device((accel_device){ACCEL_DEV_HOSTLESS, 0});
    RUN(test_steady_steps);
    return check_summary();
}
