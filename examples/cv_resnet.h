/* examples/cv_resnet.h - the small ResNet of examples/cv_example.c (and of
 * bench/bench_conv.c, which times its training step): torchvision's
 * BasicBlock and module names, 3-channel images of any size in.
 *
 *   conv1 3x3 (3 -> 16), bn1, relu
 *   layer1.0: BasicBlock 16 -> 16
 *   layer2.0: BasicBlock 16 -> 32, stride 2, downsample (1x1 conv stride 2, bn)
 *   avgpool (adaptive, 1x1), flatten, fc (32 -> classes)
 *
 * Header-only (static functions): each program is one file. */
#ifndef ACCEL_EXAMPLES_CV_RESNET_H
#define ACCEL_EXAMPLES_CV_RESNET_H

#include "accel/accel.h"

/* torchvision's BasicBlock: relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut),
 * the shortcut x itself or its downsample (children conv1, bn1, conv2, bn2,
 * [downsample]). */
static accel_tensor *block_forward(accel_module *m, accel_tensor *x) {
    accel_module **c = m->children;
    accel_tensor *y = accel_relu(accel_module_call(c[1], accel_module_call(c[0], x)));
    y = accel_module_call(c[3], accel_module_call(c[2], y));
    accel_tensor *shortcut = m->n_children > 4 ? accel_module_call(c[4], x) : x;
    return accel_relu(accel_add(y, shortcut));
}

static const accel_module_ops BLOCK_OPS = {"BasicBlock", block_forward, NULL};

static accel_module *conv(int64_t in, int64_t out, int64_t k, int64_t stride) {
    int64_t pad = k / 2;
    return accel_conv2d_new(in, out, (int64_t[]){k, k}, (int64_t[]){stride, stride}, (int64_t[]){pad, pad}, NULL, 1,
                            false, ACCEL_CPU_DEVICE, ACCEL_F32);
}

static accel_module *bn(int64_t c) { return accel_batch_norm2d_new(c, 1e-5, 0.1, true, true, ACCEL_CPU_DEVICE, ACCEL_F32); }

static accel_module *basic_block(int64_t in, int64_t out, int64_t stride) {
    accel_module *m = accel_module_new(&BLOCK_OPS, NULL);
    bool ok = m && accel_module_add_child(m, "conv1", conv(in, out, 3, stride)) && accel_module_add_child(m, "bn1", bn(out)) &&
              accel_module_add_child(m, "conv2", conv(out, out, 3, 1)) && accel_module_add_child(m, "bn2", bn(out));
    if (ok && (stride != 1 || in != out))
        ok = accel_module_add_child(m, "downsample", accel_sequential_new(2, (accel_module *[]){conv(in, out, 1, stride), bn(out)}));
    if (!ok) accel_module_free(m);
    return ok ? m : NULL;
}

/* children: conv1, bn1, relu, layer1, layer2, avgpool, flatten, fc, run in order */
static accel_module *cv_resnet(int64_t classes) {
    accel_module *m = accel_sequential_new(0, NULL);
    const char *names[] = {"conv1", "bn1", "relu", "layer1", "layer2", "avgpool", "flatten", "fc"};
    accel_module *parts[] = {conv(3, 16, 3, 1),
                             bn(16),
                             accel_relu_module_new(),
                             accel_sequential_new(1, (accel_module *[]){basic_block(16, 16, 1)}),
                             accel_sequential_new(1, (accel_module *[]){basic_block(16, 32, 2)}),
                             accel_adaptive_avg_pool2d_new((int64_t[]){1, 1}),
                             accel_flatten_new(1, -1),
                             accel_linear_new(32, classes, true, ACCEL_CPU_DEVICE, ACCEL_F32)};
    bool ok = m != NULL;
    for (int i = 0; i < 8; i++) { /* each part added, or freed */
        if (ok) ok = accel_module_add_child(m, names[i], parts[i]) != NULL;
        else accel_module_free(parts[i]);
    }
    if (!ok) accel_module_free(m);
    return ok ? m : NULL;
}

#endif
