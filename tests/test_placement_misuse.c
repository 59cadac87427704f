/* Device placement misused (hostless:0 stands in for a GPU): a prepare that
 * fails at every device allocation in turn, then retried; a loader used
 * after its accelerator is gone; a prepared loader whose batch cannot be
 * moved to the device; a model unprepared and prepared again;
 * accel_llama_loss under bf16 with and without the Accelerator. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "accel/accel.h"
#include "accel/accelerator.h"
#include "backends/hostless/hostless.h"
#include "check.h"

static accel_device DEV = {ACCEL_DEV_HOSTLESS, 0};

static accel_module *mlp(void) {
    accel_module *l[3] = {accel_linear_new(4, 8, true, ACCEL_CPU_DEVICE, ACCEL_F32), accel_relu_module_new(),
                          accel_linear_new(8, 1, true, ACCEL_CPU_DEVICE, ACCEL_F32)};
    return accel_sequential_new(3, l);
}

static bool all_on(accel_module *m, accel_device d) {
    accel_tensor **ps;
    int n = accel_module_parameters(m, &ps);
    bool ok = n > 0;
    for (int i = 0; i < n; i++) ok &= accel_device_eq(ps[i]->device, d);
    accel_free(ps);
    return ok;
}

static bool all_host_or_dev(accel_module *m) {
    return all_on(m, ACCEL_CPU_DEVICE) || all_on(m, DEV);
}

/* prepare(model, opt, dl) with the k-th device allocation failing, then retried. */
static void test_prepare_fails_at_each_allocation(void) {
    float xs[32];
    for (int i = 0; i < 32; i++) xs[i] = (float)i / 32.0f;
    accel_tensor *fields[1] = {accel_from_floats(ACCEL_SHAPE(8, 4), xs)};
    accel_dataset *ds = accel_tensor_dataset_new(1, fields);
    for (int k = 1; k <= 40; k++) {
        for (int mp = 0; mp < 2; mp++) {
            accel_accelerator_opts o = accel_accelerator_opts_default();
            o.mixed_precision = mp ? "bf16" : "no";
            accel_accelerator *acc = accel_accelerator_new(&o);
            accel_module *m = mlp();
            accel_optim_hparams h = accel_optim_defaults(ACCEL_OPTIM_ADAMW, 0.1);
            accel_optimizer *opt = accel_optimizer_new_module(ACCEL_OPTIM_ADAMW, m, &h);
            accel_dataloader_opts lo = accel_dataloader_opts_default();
            lo.batch_size = 2;
            accel_dataloader *dl = accel_dataloader_new(ds, &lo);
            CHECK(acc && m && opt && dl);
            accel__hostless_alloc_fail_at(k);
            accel_status st = accel_accelerator_prepare(acc, m, opt, dl, NULL);
            accel__hostless_alloc_fail_at(0);
            CHECK_MSG(all_host_or_dev(m), "k=%d mp=%d: the model is split between host and device", k, mp);
            if (st) {
                st = accel_accelerator_prepare(acc, m, opt, dl, NULL);
                CHECK_MSG(st == ACCEL_OK, "k=%d mp=%d: the retry failed: %s", k, mp, accel_last_error());
            }
            CHECK_MSG(all_on(m, DEV), "k=%d mp=%d: not placed", k, mp);
            for (int s = 0; s < 2 && st == ACCEL_OK; s++) {
                accel_batch b;
                CHECK(accel_dataloader_next(dl, &b) && accel_device_eq(b.fields[0]->device, DEV));
                accel_dtype prev = accel_accelerator_autocast_begin(acc);
                accel_tensor *y = accel_module_call(m, b.fields[0]);
                CHECK(accel_accelerator_autocast_end(acc, prev) == ACCEL_OK);
                accel_tensor *loss = accel_mean_all(y);
                CHECK_MSG(loss && accel_accelerator_backward(acc, loss) == ACCEL_OK &&
                              accel_accelerator_optimizer_step(acc, opt) == ACCEL_OK,
                          "k=%d mp=%d step %d: %s", k, mp, s, accel_last_error());
                accel_accelerator_zero_grad(acc, opt);
                accel_step_reset();
            }
            accel_step_reset();
            accel_accelerator_free(acc);
            accel_batch b;
            CHECK(accel_dataloader_set_epoch(dl, 0) == ACCEL_OK && accel_dataloader_next(dl, &b) &&
                  b.fields[0]->device.type == ACCEL_DEV_CPU);
            accel_step_reset();
            accel_optimizer_free(opt);
            accel_module_free(m);
            accel_dataloader_free(dl);
        }
    }
    accel_dataset_free(ds);
}

/* Allocations of at least g_fail_from bytes fail while it is not 0 (the
 * library's allocator: the device's step pool grows through it). */
static size_t g_fail_from;

static void *failing_alloc(void *ctx, size_t bytes, size_t align) {
    (void)ctx;
    void *p = NULL;
    if (g_fail_from && bytes >= g_fail_from) return NULL;
    return posix_memalign(&p, align < sizeof(void *) ? sizeof(void *) : align, bytes ? bytes : 1) ? NULL : p;
}

static void failing_free(void *ctx, void *p) {
    (void)ctx;
    free(p);
}

#define WIDE (1 << 18) /* floats of a sample's second field: 1 MiB, a batch's 2 */

/* A prepared loader's batch whose move to the device fails half-way (its
 * first field moved, the device's step pool then unable to grow for the
 * second, 2 MiB): accel_dataloader_next returns false with an error naming
 * the loader, the batch and the device, gives no half-moved batch, and does
 * not advance: the next call, the device able again, returns that batch,
 * then the epoch goes on. Run in a thread of its own, whose step arena (4
 * MiB) and device step pool (1 MiB) are fresh, so that only the pool grows
 * for the batch. */
static void *batch_move_fails(void *ds) {
    accel_set_default_device(DEV); /* the thread's own: the accelerator's device */
    accel_accelerator *acc = accel_accelerator_new(NULL);
    accel_dataloader_opts lo = accel_dataloader_opts_default();
    lo.batch_size = 2;
    accel_dataloader *dl = accel_dataloader_new(ds, &lo);
    CHECK(acc && dl && accel_accelerator_prepare(acc, dl, NULL) == ACCEL_OK);
    /* the thread's arena and pool made before the allocator fails */
    CHECK(accel_step_arena() && accel_empty_on(ACCEL_F32, 1, (int64_t[]){1}, DEV));
    accel_step_reset();
    accel_allocator failing = {failing_alloc, failing_free, NULL};
    accel_set_allocator(&failing);
    g_fail_from = 2u << 20;
    accel_batch b;
    bool got = accel_dataloader_next(dl, &b);
    g_fail_from = 0;
    accel_set_allocator(NULL);
    CHECK_MSG(!got && accel_last_status() == ACCEL_ERR_OOM, "got %d: %s", got, accel_last_error());
    CHECK_STR_CONTAINS(accel_last_error(), "accel_dataloader_next: batch 0 of epoch 0 could not be moved to hostless:0 "
                                           "(field 1 of 2: out of memory");
    CHECK(b.n_fields == 0 && !b.fields[0] && !b.fields[1]);
    CHECK(accel_dataloader_position(dl) == 0);
    accel_step_reset();
    for (int i = 0; i < 2; i++) {
        CHECK_MSG(accel_dataloader_next(dl, &b) && b.index == i && b.n_fields == 2, "batch %d: %s", i,
                  accel_last_error());
        float y[2], x0 = -1;
        CHECK(accel_device_eq(b.fields[0]->device, DEV) && accel_device_eq(b.fields[1]->device, DEV));
        CHECK(accel_tensor_to_host(b.fields[0], y) == ACCEL_OK && y[0] == 2 * i && y[1] == 2 * i + 1);
        CHECK(accel_tensor_to_host(accel_slice(accel_slice(b.fields[1], 0, 1, 2, 1), 1, WIDE - 1, WIDE, 1), &x0) ==
              ACCEL_OK && x0 == 2 * i + 1);
        accel_step_reset();
    }
    CHECK(!accel_dataloader_next(dl, &b) && accel_last_status() == ACCEL_OK); /* the epoch's end */
    accel_accelerator_free(acc);
    accel_dataloader_free(dl);
    accel_thread_cleanup();
    return NULL;
}

static void test_batch_move_fails(void) {
    float y[4] = {0, 1, 2, 3}, *x = malloc((size_t)4 * WIDE * sizeof *x);
    for (int i = 0; i < 4 * WIDE; i++) x[i] = (float)(i / WIDE);
    accel_tensor *fields[2] = {accel_from_floats(ACCEL_SHAPE(4, 1), y), accel_from_floats(ACCEL_SHAPE(4, WIDE), x)};
    accel_dataset *ds = accel_tensor_dataset_new(2, fields);
    free(x);
    pthread_t t;
    CHECK(ds && pthread_create(&t, NULL, batch_move_fails, ds) == 0 && pthread_join(t, NULL) == 0);
    accel_dataset_free(ds);
    accel_step_reset();
}

/* unprepare and prepare again, the optimizer stepping between; a second accelerator. */
static void test_reprepare(void) {
    accel_accelerator *a = accel_accelerator_new(NULL);
    accel_module *m = mlp();
    accel_optim_hparams h = accel_optim_defaults(ACCEL_OPTIM_ADAMW, 0.1);
    accel_optimizer *opt = accel_optimizer_new_module(ACCEL_OPTIM_ADAMW, m, &h);
    float xs[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    CHECK(accel_accelerator_prepare(a, m, opt) == ACCEL_OK);
    for (int round = 0; round < 3; round++) {
        accel_tensor *x = accel_to_device(accel_from_floats(ACCEL_SHAPE(2, 4), xs), DEV);
        accel_tensor *loss = accel_mean_all(accel_module_call(m, x));
        CHECK_MSG(loss && accel_backward(loss) == ACCEL_OK && accel_optimizer_step(opt) == ACCEL_OK, "round %d: %s",
                  round, accel_last_error());
        accel_optimizer_zero_grad(opt);
        accel_step_reset();
        CHECK(accel_accelerator_unprepare_model(a, m) == ACCEL_OK);
        CHECK(all_on(m, DEV));
        CHECK_MSG(accel_accelerator_prepare(a, m) == ACCEL_OK, "%s", accel_last_error());
    }
    accel_accelerator *b = accel_accelerator_new(NULL);
    CHECK(accel_accelerator_prepare(b, m) != ACCEL_OK);
    accel_module_free(m); /* model before the accelerators */
    accel_accelerator_free(a);
    accel_optimizer_free(opt);
    accel_accelerator_free(b);
    accel_step_reset();
}


static accel_module *tiny_llama(void) {
    accel_manual_seed(3);
    accel_llama_config c = accel_llama_config_default();
    c.vocab_size = 97, c.hidden_size = 64, c.intermediate_size = 160, c.num_hidden_layers = 2;
    c.num_attention_heads = 4, c.num_key_value_heads = 2, c.max_position_embeddings = 16;
    return accel_llama_new(&c, ACCEL_CPU_DEVICE);
}

/* accel_llama_loss, bf16, accumulation 2, through the Accelerator: the same
 * loss as the model's own bf16 autocast, the gradient half of it; the
 * forward's logits are still f32 through the Accelerator. */
static void llama_loss_accumulation(const char *mp, accel_dtype dt) {
    accel_accelerator_opts o = accel_accelerator_opts_default();
    o.mixed_precision = mp;
    o.gradient_accumulation_steps = 2;
    accel_accelerator *acc = accel_accelerator_new(&o);
    accel_module *a = tiny_llama(), *b = tiny_llama();
    /* its optimizer prepared: fp16's unscale divides a prepared optimizer's gradients */
    accel_optim_hparams h = accel_optim_defaults(ACCEL_OPTIM_SGD, 0.1);
    accel_optimizer *opt = a ? accel_optimizer_new_module(ACCEL_OPTIM_SGD, a, &h) : NULL;
    CHECK(acc && a && b && opt && accel_accelerator_prepare(acc, a, opt) == ACCEL_OK &&
          accel_module_to(b, DEV) == ACCEL_OK);
    int64_t ids[4 * 16];
    for (int i = 0; i < 4 * 16; i++) ids[i] = (i * 13 + 5) % 97;
    accel_tensor *x = accel_to_device(accel_from_data(ACCEL_I64, ACCEL_SHAPE(4, 16), ids), DEV);
    CHECK(accel_accelerator_accumulate(acc) == ACCEL_OK);
    accel_dtype prev = accel_accelerator_autocast_begin(acc);
    accel_tensor *la = accel_llama_loss(a, x);
    accel_tensor *logits = accel_llama_forward(a, x, NULL);
    CHECK(accel_accelerator_autocast_end(acc, prev) == ACCEL_OK);
    CHECK(logits && logits->dtype == ACCEL_F32);
    CHECK_MSG(la && la->dtype == ACCEL_F32, "%s: loss dtype %s", mp, la ? accel_dtype_name(la->dtype) : "-");
    CHECK_MSG(la && accel_accelerator_backward(acc, la) == ACCEL_OK, "%s: %s", mp, accel_last_error());
    if (dt == ACCEL_F16) CHECK(accel_accelerator_unscale_gradients(acc) == ACCEL_OK);
    accel_dtype p2 = accel_autocast_begin(dt);
    accel_tensor *lb = accel_llama_loss(b, x);
    accel_autocast_end(p2);
    CHECK(lb && accel_backward(lb) == ACCEL_OK);
    double va = accel_item(la), vb = accel_item(lb);
    CHECK_MSG(fabs(va - vb) <= 1e-6 * fabs(vb), "losses %.9g %.9g", va, vb);
    accel_tensor **pa, **pb;
    int n = accel_module_parameters(a, &pa);
    CHECK(accel_module_parameters(b, &pb) == n);
    double worst = 0;
    for (int i = 0; i < n; i++) {
        if (!pa[i]->grad || !pb[i]->grad) { CHECK_MSG(0, "param %d: no grad", i); continue; }
        int64_t k = accel_numel(pa[i]);
        float *ga = accel_malloc((size_t)k * sizeof *ga), *gb = accel_malloc((size_t)k * sizeof *gb);
        accel_tensor *ha = accel_to_dtype(pa[i]->grad, ACCEL_F32), *hb = accel_to_dtype(pb[i]->grad, ACCEL_F32);
        CHECK(accel_tensor_to_host(ha, ga) == ACCEL_OK && accel_tensor_to_host(hb, gb) == ACCEL_OK);
        double num = 0, den = 0;
        for (int64_t j = 0; j < k; j++) num += fabs(ga[j] - 0.5 * gb[j]), den += fabs(0.5 * gb[j]);
        if (den > 0 && num / den > worst) worst = num / den;
        accel_free(ga);
        accel_free(gb);
    }
    CHECK_MSG(worst < 1e-2, "%s: gradients differ: relative %g", mp, worst);
    accel_free(pa);
    accel_free(pb);
    accel_step_reset();
    accel_accelerator_free(acc);
    accel_optimizer_free(opt);
    accel_module_free(a);
    accel_module_free(b);
    accel_step_reset();
}

static void test_llama_loss_bf16_accumulation(void) { llama_loss_accumulation("bf16", ACCEL_BF16); }
static void test_llama_loss_fp16_accumulation(void) { llama_loss_accumulation("fp16", ACCEL_F16); }

int main(void) {
    if (accel__hostless_register(1) != ACCEL_OK) {
        fprintf(stderr, "%s\n", accel_last_error());
        return 1;
    }
    accel_set_default_device(DEV);
    RUN(test_prepare_fails_at_each_allocation);
    RUN(test_batch_move_fails);
    RUN(test_reprepare);
    RUN(test_llama_loss_bf16_accumulation);
    RUN(test_llama_loss_fp16_accumulation);
    return check_summary();
}
