/* A BERT fixture's batch (tests/data/hf_bert*: expected.safetensors'
 * ids, token_type_ids, attention_mask and labels), for the tests of the
 * classification and masked-LM heads. */
#ifndef ACCEL_TESTS_BERT_BATCH_H
#define ACCEL_TESTS_BERT_BATCH_H

#include "accel/accel.h"
#include "accel/io.h"
#include "check.h"

typedef struct batch {
    accel_tensor *ids, *tt, *mask, *labels;
} batch;

static inline batch load_batch(accel_safetensors *st) {
    batch b = {accel_safetensors_tensor(st, "ids", -1), accel_safetensors_tensor(st, "token_type_ids", -1),
               accel_safetensors_tensor(st, "attention_mask", -1), accel_safetensors_tensor(st, "labels", -1)};
    CHECK(b.ids && b.tt && b.mask && b.labels);
    return b;
}

static inline void free_batch(batch *b) {
    accel_tensor_free(b->ids);
    accel_tensor_free(b->tt);
    accel_tensor_free(b->mask);
    accel_tensor_free(b->labels);
}

#endif
