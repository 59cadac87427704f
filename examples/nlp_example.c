/* Accelerate's nlp_example.py in C: fine-tune a BERT sentence-pair classifier
 * (MRPC-like: is sentence B a paraphrase of sentence A?) under the
 * Accelerator, evaluating on every process and gathering the predictions with
 * gather_for_metrics for accuracy and F1 after each epoch.
 *
 *     accel launch --num_processes 2 [--mixed_precision bf16]
 *                  build/bin/nlp_example TOKENIZER_JSON MODEL_DIR [EPOCHS=3] [LR=2e-5] [BATCH=16] [SEED=42]
 *
 * TOKENIZER_JSON: a WordPiece tokenizer.json (BERT's; a directory holding one
 * will do). MODEL_DIR: a BERT config.json (or RoBERTa's, XLM-RoBERTa's: the
 * same pairs, padded with its pad_token_id, and no token types where its
 * type_vocab_size is 1), with the weights of a checkpoint
 * (model.safetensors or shards) when it has them, else the model is randomly
 * initialised from the config (SEED on every process; it also seeds the
 * shuffling and dropout, not the data set, which is fixed). A pre-trained
 * encoder without a classification head gets a new one.
 *
 * The data set is generated, deterministically: sentences of 4 to 7 words of a
 * fixed lexicon; a paraphrase (label 1) is A's words in another order, a
 * non-paraphrase (label 0) a sentence of words of another topic (make_pair). Each
 * pair is tokenized as BERT's pair template, [CLS] A [SEP] B [SEP] with token
 * types 0 then 1 (all 0 for a model of one token type), padded to SEQ with
 * the model's pad_token_id (0 when it has none) and attention_mask 0.
 * As nlp_example.py: AdamW, a linear schedule with warm-up (10% of the
 * steps here; the script's 100 steps are most of this small run), the
 * scheduler sized by the unsharded loader's length. Prints on the main
 * process, per epoch:
 *     epoch 0: {'accuracy': 0.7745, 'f1': 0.8231} (this process's train loss 0.5621)
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "accel/accel.h"
#include "example_args.h"

#define SEQ 24 /* the longest pair, [CLS] 7 words . [SEP] 7 words . [SEP], is 19 */
#define N_TRAIN 2048
#define N_EVAL 408 /* MRPC's validation size */

static const char *const LEXICON[] = {
    "school", "city",  "university", "state", "world", "time",  "years", "national",
    "first",  "new",   "two",        "known", "made",  "many",  "most",  "later",
    "other",  "united", "after",     "would", "over",  "some",  "such",  "their",
};
#define N_WORDS (int)(sizeof LEXICON / sizeof *LEXICON)

/* splitmix64: the same data on every process and every run. */
static uint64_t next_rand(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* n distinct indices of the lexicon's third `topic` into w. */
static void draw_words(uint64_t *s, int topic, int n, int *w) {
    for (int i = 0; i < n; i++) {
        bool again;
        do {
            w[i] = topic * (N_WORDS / 3) + (int)(next_rand(s) % (N_WORDS / 3));
            again = false;
            for (int j = 0; j < i; j++) again |= w[j] == w[i];
        } while (again);
    }
}

static void sentence(const int *w, int n, char *out, size_t cap) {
    out[0] = 0;
    for (int i = 0; i < n; i++) {
        strncat(out, LEXICON[w[i]], cap - strlen(out) - 1);
        strncat(out, i + 1 < n ? " " : " .", cap - strlen(out) - 1);
    }
}

/* One pair: sentence A of words of topic 0 or 1 (a third of the lexicon
 * each), and B = A's words in another order (label 1), or as many words of
 * the other topic or of topic 2, which only non-paraphrases use (label 0, each
 * half the time). B's words alone tell the label of a quarter of the pairs
 * (topic 2: learnt first, 75% accuracy); the rest needs A and B together. */
static int make_pair(uint64_t *s, char *a, char *b, size_t cap) {
    int n = 4 + (int)(next_rand(s) % 4), topic = (int)(next_rand(s) % 2), wa[8], wb[8];
    draw_words(s, topic, n, wa);
    int label = (int)(next_rand(s) % 2);
    if (label) {
        memcpy(wb, wa, sizeof wa); /* shuffled (Fisher-Yates) */
        for (int i = n - 1; i > 0; i--) {
            int j = (int)(next_rand(s) % (uint64_t)(i + 1)), t = wb[i];
            wb[i] = wb[j];
            wb[j] = t;
        }
    } else {
        draw_words(s, next_rand(s) % 2 ? 1 - topic : 2, n, wb);
    }
    sentence(wa, n, a, cap);
    sentence(wb, n, b, cap);
    return label;
}

/* The split as four tensors [n, SEQ] ids, token types, mask and [n] labels. */
typedef struct split {
    int64_t n;
    int64_t *ids, *tt, *mask, *labels;
} split;

static void split_free(split *d) {
    free(d->ids);
    free(d->tt);
    free(d->mask);
    free(d->labels);
}

/* What the model takes of the pairs: its padding id, whether it has token types. */
typedef struct pair_format {
    int64_t sep, pad;
    bool types;
} pair_format;

/* [CLS] A [SEP] B [SEP] as the pair template; 0 or 1 + a message. */
static int encode_pair(const accel_tokenizer *tok, const char *a, const char *b, const pair_format *pf, int64_t *ids,
                       int64_t *tt, int64_t *mask) {
    int64_t *ea = NULL, *eb = NULL, na = 0, nb = 0;
    if (accel_tokenizer_encode(tok, a, strlen(a), true, &ea, &na) ||
        accel_tokenizer_encode(tok, b, strlen(b), false, &eb, &nb)) {
        free(ea);
        fprintf(stderr, "nlp_example: %s\n", accel_last_error());
        return 1;
    }
    int rc = 0;
    if (na + nb + 1 > SEQ) {
        fprintf(stderr, "nlp_example: the pair \"%s\" / \"%s\" is %lld tokens, more than %d\n", a, b,
                (long long)(na + nb + 1), SEQ);
        rc = 1;
    }
    for (int64_t i = 0; !rc && i < SEQ; i++) {
        bool in_a = i < na, in_b = !in_a && i < na + nb + 1;
        ids[i] = in_a ? ea[i] : !in_b ? pf->pad : i < na + nb ? eb[i - na] : pf->sep;
        tt[i] = in_b && pf->types;
        mask[i] = in_a || in_b;
    }
    free(ea);
    free(eb);
    return rc;
}

static int make_split(const accel_tokenizer *tok, const accel_bert_config *c, uint64_t seed, int64_t n, split *d) {
    d->n = n;
    d->ids = malloc((size_t)(n * SEQ) * sizeof(int64_t));
    d->tt = malloc((size_t)(n * SEQ) * sizeof(int64_t));
    d->mask = malloc((size_t)(n * SEQ) * sizeof(int64_t));
    d->labels = malloc((size_t)n * sizeof(int64_t));
    pair_format pf = {accel_tokenizer_token_to_id(tok, "[SEP]"), c->pad_token_id >= 0 ? c->pad_token_id : 0,
                      c->type_vocab_size > 1};
    if (!d->ids || !d->tt || !d->mask || !d->labels || pf.sep < 0) {
        fprintf(stderr, "nlp_example: %s\n", pf.sep < 0 ? "the tokenizer has no [SEP] token" : "out of memory");
        return 1;
    }
    uint64_t s = seed;
    char a[128], b[128];
    for (int64_t i = 0; i < n; i++) {
        d->labels[i] = make_pair(&s, a, b, sizeof a);
        if (encode_pair(tok, a, b, &pf, d->ids + i * SEQ, d->tt + i * SEQ, d->mask + i * SEQ)) return 1;
    }
    return 0;
}

/* The split as a data set of four fields: ids, token types, mask, labels. */
static accel_dataset *dataset(const split *d) {
    accel_tensor *t[4] = {
        accel_from_data(ACCEL_I64, 2, (int64_t[]){d->n, SEQ}, d->ids),
        accel_from_data(ACCEL_I64, 2, (int64_t[]){d->n, SEQ}, d->tt),
        accel_from_data(ACCEL_I64, 2, (int64_t[]){d->n, SEQ}, d->mask),
        accel_from_data(ACCEL_I64, 1, (int64_t[]){d->n}, d->labels),
    };
    accel_dataset *ds = t[0] && t[1] && t[2] && t[3] ? accel_tensor_dataset_new(4, t) : NULL;
    accel_step_reset();
    return ds;
}

/* Accuracy and F1 (of label 1) over every sample of the eval split:
 * predictions and labels gathered from all processes. 0 or 1. */
static int evaluate(accel_accelerator *acc, accel_module *model, accel_dataloader *dl, double *accuracy,
                    double *f1) {
    int64_t tp = 0, fp = 0, fn = 0, right = 0, total = 0;
    accel_module_train(model, false);
    accel_batch b;
    while (accel_dataloader_next(dl, &b)) {
        accel_dtype prev = accel_accelerator_autocast_begin(acc);
        accel_tensor *logits = accel_bert_classify(model, b.fields[0], b.fields[1], b.fields[2]);
        accel_accelerator_autocast_end(acc, prev);
        accel_tensor *in[2] = {logits ? accel_argmax(logits, 1, false) : NULL, b.fields[3]}, *out[2];
        if (!in[0] || accel_accelerator_gather_for_metrics_n(acc, 2, in, out) != ACCEL_OK) return 1;
        int64_t n = out[0]->shape[0];
        for (int64_t i = 0; i < n; i++) {
            int64_t p = (int64_t)accel_get(out[0], &i), y = (int64_t)accel_get(out[1], &i);
            right += p == y;
            tp += p == 1 && y == 1;
            fp += p == 1 && y == 0;
            fn += p == 0 && y == 1;
        }
        total += n;
        accel_step_reset();
    }
    if (accel_last_status() != ACCEL_OK) return 1;
    accel_module_train(model, true);
    *accuracy = total ? (double)right / (double)total : 0;
    *f1 = tp ? 2.0 * (double)tp / (double)(2 * tp + fp + fn) : 0;
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 3 || argc > 7) {
        fprintf(stderr, "usage: nlp_example TOKENIZER_JSON MODEL_DIR [EPOCHS=3] [LR=2e-5] [BATCH=16] [SEED=42]\n");
        return 2;
    }
    long long epochs, batch, seed;
    double lr;
    bool ok = arg_int(argc, argv, 3, 3, &epochs) && arg_real(argc, argv, 4, 2e-5, &lr) &&
              arg_int(argc, argv, 5, 16, &batch) && arg_int(argc, argv, 6, 42, &seed);
    if (!ok || epochs < 1 || epochs > 1000000 || !(lr > 0) || batch < 1 || batch > 1000000 || seed < 0) {
        fprintf(stderr, "nlp_example: EPOCHS and BATCH must be integers >= 1, LR a number > 0 and SEED an integer >= 0\n");
        return 2;
    }
    accel_accelerator *acc = accel_accelerator_new(NULL); /* what `accel launch` set */
    if (!acc) {
        fprintf(stderr, "nlp_example: %s\n", accel_last_error());
        return 1;
    }
    accel_set_seed(acc, (uint64_t)seed, false); /* the same initial weights and dropout on every process */
    accel_tokenizer *tok = accel_tokenizer_load(argv[1]);
    accel_module *model = tok ? accel_bert_from_pretrained(argv[2], ACCEL_CPU_DEVICE) : NULL;
    int rc = !model;
    if (!rc && accel_bert_config_of(model)->vocab_size < accel_tokenizer_vocab_size(tok)) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: vocab_size %lld is smaller than the tokenizer's %lld ids",
                        argv[2], (long long)accel_bert_config_of(model)->vocab_size,
                        (long long)accel_tokenizer_vocab_size(tok));
        rc = 1;
    }
    if (!rc && accel_bert_config_of(model)->num_labels != 2) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "%s: num_labels is %lld; a paraphrase task has 2", argv[2],
                        (long long)accel_bert_config_of(model)->num_labels);
        rc = 1;
    }
    split train = {0}, eval = {0};
    if (!rc)
        rc = make_split(tok, accel_bert_config_of(model), 1, N_TRAIN, &train) ||
             make_split(tok, accel_bert_config_of(model), 2, N_EVAL, &eval);
    accel_dataset *train_ds = rc ? NULL : dataset(&train), *eval_ds = rc ? NULL : dataset(&eval);
    accel_dataloader *train_dl =
        train_ds ? accel_dataloader_new(train_ds, &(accel_dataloader_opts){.batch_size = batch, .shuffle = true,
                                                                           .seed = (uint64_t)seed})
                 : NULL;
    accel_dataloader *eval_dl =
        eval_ds ? accel_dataloader_new(eval_ds, &(accel_dataloader_opts){.batch_size = 32}) : NULL;
    accel_optim_hparams h = accel_optim_defaults(ACCEL_OPTIM_ADAMW, lr);
    accel_optimizer *opt = train_dl && eval_dl ? accel_optimizer_new_module(ACCEL_OPTIM_ADAMW, model, &h) : NULL;
    /* sized before prepare: the unsharded length (the scheduler steps once per process per step) */
    int64_t total = opt ? accel_dataloader_len(train_dl) * epochs : 0;
    accel_lr_scheduler *sched = opt ? accel_lr_scheduler_new(opt, ACCEL_SCHED_LINEAR, total / 10, total) : NULL;
    if (!rc) rc = !sched || accel_accelerator_prepare(acc, model, opt, train_dl, eval_dl, sched) != ACCEL_OK;
    for (int epoch = 0; epoch < epochs && !rc; epoch++) {
        accel_batch b;
        double loss_sum = 0;
        int64_t steps = 0;
        accel_dataloader_set_epoch(train_dl, epoch);
        while (!rc && accel_dataloader_next(train_dl, &b)) {
            accel_tensor *loss = accel_bert_loss(model, b.fields[0], b.fields[1], b.fields[2], b.fields[3], NULL);
            rc |= accel_accelerator_backward(acc, loss) != ACCEL_OK;
            rc |= accel_accelerator_optimizer_step(acc, opt) != ACCEL_OK;
            accel_accelerator_scheduler_step(acc, sched);
            accel_accelerator_zero_grad(acc, opt);
            if (!rc) loss_sum += accel_item(loss);
            steps++;
            accel_step_reset();
        }
        double accuracy = 0, f1 = 0;
        rc = rc || accel_last_status() != ACCEL_OK || evaluate(acc, model, eval_dl, &accuracy, &f1);
        if (!rc)
            accel_accelerator_print(acc, "epoch %d: {'accuracy': %.4f, 'f1': %.4f} (this process's train loss %.4f)\n", epoch,
                                    accuracy, f1, steps ? loss_sum / (double)steps : 0.0);
    }
    if (rc) fprintf(stderr, "nlp_example: %s\n", accel_last_error()); /* once, whichever step failed */
    accel_accelerator_free(acc);
    accel_lr_scheduler_free(sched);
    accel_optimizer_free(opt);
    accel_module_free(model);
    accel_dataloader_free(train_dl);
    accel_dataloader_free(eval_dl);
    accel_dataset_free(train_ds);
    accel_dataset_free(eval_ds);
    split_free(&train);
    split_free(&eval);
    accel_tokenizer_free(tok);
    accel_thread_cleanup();
    return rc || !tok;
}
