/*
 * accel/tracking.h — Accelerate's logging, progress bars and experiment
 * trackers (accelerate.logging, tqdm on the main process, accelerate.tracking).
 *
 * Needs only core.h, so every layer can log through it. The process index
 * and count come from the Accelerator once one exists (it attaches itself),
 * else from the launcher's RANK / WORLD_SIZE.
 *
 * Logging (accelerate.logging.get_logger):
 *
 *     accel_logger *log = accel_get_logger("train");
 *     accel_log_info(log, "epoch %d", e);                        // main process only
 *     accel_logger_log(log, ACCEL_LOG_INFO, ACCEL_LOG_IN_ORDER, "rank-local %d", x);  // every rank, in order
 *
 * prints "INFO:train:[RANK 0] epoch 1" on stderr (Python logging's default
 * format with Accelerate's rank prefix). The level is ACCEL_LOG_LEVEL, else
 * ACCELERATE_LOG_LEVEL ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL" or a
 * number), else WARNING (Python's root default). The library's own warnings
 * go through the logger named "accel".
 *
 * Progress (tqdm on the main process): on a terminal one line redrawn in
 * place, "train:  45%|████▌     | 45/100 [00:10<00:12,  4.50it/s, loss=1.2345, tok/s=1234]";
 * elsewhere (a file, a pipe, a CI log) the same text as plain lines at most
 * every min_interval seconds (default 10) and once at the end. Off on
 * other ranks, with opts.disable, or with ACCEL_DISABLE_PROGRESS=1.
 *
 * Trackers (accelerate.tracking): a run named `project` under a logging
 * directory; store_init_configuration once (hparams), log(values, step) many
 * times, finish once. Built in:
 *   "tensorboard"  <dir>/<project>/events.out.tfevents.<time>.<host>.<pid>.<n>:
 *                  scalars (simple_value) and strings (text plugin) as
 *                  torch.utils.tensorboard.SummaryWriter writes them; the
 *                  config as add_hparams(config, {}) writes it (a sub-run
 *                  <dir>/<project>/<time>/ with the hparams plugin's
 *                  experiment, session start and end) plus hparams.yml there.
 *   "jsonl"        <dir>/<project>/log.jsonl: {"step": 3, "loss": 0.5, ...} a line;
 *                  config.json beside it.
 *   "csv"          <dir>/<project>/log.csv: header "step,<keys in first-seen order>";
 *                  a new key rewrites the file with the wider header; config.json.
 * Your own: accel_tracker_new(&ops, ctx). The Accelerator's
 * init_trackers/log/end_training (accelerator.h) drive them on the main
 * process only.
 */
#ifndef ACCEL_TRACKING_H
#define ACCEL_TRACKING_H

#include <stdarg.h>

#include "core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------ logging */

typedef enum accel_log_level {
    ACCEL_LOG_DEBUG = 10,
    ACCEL_LOG_INFO = 20,
    ACCEL_LOG_WARNING = 30,
    ACCEL_LOG_ERROR = 40,
    ACCEL_LOG_CRITICAL = 50,
} accel_log_level;

/* Flags of accel_logger_log. 0 = Accelerate's defaults (main process only, no order). */
enum {
    ACCEL_LOG_ALL_PROCESSES = 1u << 0, /* main_process_only=False */
    ACCEL_LOG_IN_ORDER = 1u << 1,      /* in_order=True: rank by rank, a barrier after each (collective) */
};

typedef struct accel_logger accel_logger;

/* The logger of that name (created on first use, lives until exit; the same
 * pointer for the same name). NULL name = "accel". NULL only on OOM. */
accel_logger *accel_get_logger(const char *name);
void accel_logger_set_level(accel_logger *lg, accel_log_level level);
accel_log_level accel_logger_level(const accel_logger *lg);
/* Where its lines go (default stderr; NULL restores it). Borrowed. */
void accel_logger_set_stream(accel_logger *lg, FILE *f);
/* Logs when level >= the logger's level and this process should log.
 * ACCEL_LOG_IN_ORDER needs the Accelerator (every rank must call): without
 * one on several processes it is ACCEL_ERR_STATE with Accelerate's message. */
accel_status accel_logger_log(accel_logger *lg, accel_log_level level, unsigned flags, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
accel_status accel_logger_logv(accel_logger *lg, accel_log_level level, unsigned flags, const char *fmt, va_list ap);
#define accel_log_debug(lg, ...) accel_logger_log((lg), ACCEL_LOG_DEBUG, 0, __VA_ARGS__)
#define accel_log_info(lg, ...) accel_logger_log((lg), ACCEL_LOG_INFO, 0, __VA_ARGS__)
#define accel_log_warning(lg, ...) accel_logger_log((lg), ACCEL_LOG_WARNING, 0, __VA_ARGS__)
#define accel_log_error(lg, ...) accel_logger_log((lg), ACCEL_LOG_ERROR, 0, __VA_ARGS__)
/* "DEBUG".."CRITICAL" (any case) or a number; -1 when neither. */
int accel_log_level_parse(const char *s);
/* This process's index and the process count as the logger sees them. */
int accel_process_index(void);
int accel_process_count(void);

/* ------------------------------------------------------------------ progress */

typedef struct accel_progress_opts {
    const char *desc;       /* prefix ("train"); copied */
    const char *unit;       /* "it" */
    FILE *stream;           /* stderr */
    double min_interval;    /* seconds between redraws: 0.1 on a terminal, 10 elsewhere; <0 = every update */
    double delay;           /* draw nothing before this many seconds (tqdm's delay): short work stays quiet */
    bool disable;           /* also ACCEL_DISABLE_PROGRESS=1 */
    bool all_processes;     /* draw on every rank (default: main process only) */
} accel_progress_opts;

typedef struct accel_progress accel_progress;

accel_progress_opts accel_progress_opts_default(void);
/* total <= 0: unknown (no percentage or ETA). A disabled bar is a valid bar
 * that prints nothing. NULL opts = defaults. NULL (error set) on OOM or when
 * ACCEL_DISABLE_PROGRESS is set but no boolean (1/true/yes/on, 0/false/no/off). */
accel_progress *accel_progress_new(int64_t total, const accel_progress_opts *opts);
/* n more units done (tqdm.update). */
void accel_progress_update(accel_progress *p, int64_t n);
/* Fields shown after the rate: the last loss ("loss=1.2345") and a token
 * count whose rate is shown ("tok/s=1234"). */
void accel_progress_set_loss(accel_progress *p, double loss);
void accel_progress_add_tokens(accel_progress *p, int64_t tokens);
/* Free text after the fields (tqdm.set_postfix_str); copied. */
void accel_progress_set_postfix(accel_progress *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int64_t accel_progress_count(const accel_progress *p);
/* Draws the final state, ends the line, frees. NULL is a no-op. */
void accel_progress_close(accel_progress *p);

struct accel_dataloader;
struct accel_batch;
/* The training-loop helper: a bar over one epoch of dl (total =
 * accel_dataloader_len), advanced by accel_progress_next. */
accel_progress *accel_progress_over_loader(struct accel_dataloader *dl, const accel_progress_opts *opts);
/* accel_dataloader_next, then one step of the bar (not at the end). */
bool accel_progress_next(accel_progress *p, struct accel_dataloader *dl, struct accel_batch *out);

/* ------------------------------------------------------------------ trackers */

typedef enum accel_value_kind {
    ACCEL_VALUE_FLOAT = 0,
    ACCEL_VALUE_INT,
    ACCEL_VALUE_BOOL,
    ACCEL_VALUE_STRING,
} accel_value_kind;

/* One key of a config or of a log call (Python's dict entry). */
typedef struct accel_value {
    const char *key;
    accel_value_kind kind;
    double f;
    int64_t i;           /* INT; BOOL: 0 or 1 */
    const char *s;       /* STRING */
} accel_value;

#define ACCEL_VALUE_F(k, v) ((accel_value){.key = (k), .kind = ACCEL_VALUE_FLOAT, .f = (v)})
#define ACCEL_VALUE_I(k, v) ((accel_value){.key = (k), .kind = ACCEL_VALUE_INT, .i = (v)})
#define ACCEL_VALUE_B(k, v) ((accel_value){.key = (k), .kind = ACCEL_VALUE_BOOL, .i = (v) ? 1 : 0})
#define ACCEL_VALUE_S(k, v) ((accel_value){.key = (k), .kind = ACCEL_VALUE_STRING, .s = (v)})

/* A tracker's behaviour (Accelerate's GeneralTracker). Every function may be
 * NULL (nothing to do). step < 0: no step given. A function fails by
 * returning its status, its message set with accel_set_error (the
 * Accelerator's calls name the tracker and the function, and say when it
 * set none). */
typedef struct accel_tracker_ops {
    const char *name;
    accel_status (*store_init_configuration)(void *ctx, int n, const accel_value *config);
    accel_status (*log)(void *ctx, int n, const accel_value *values, int64_t step);
    /* Flushes and closes; ctx is not used again (free it here). */
    accel_status (*finish)(void *ctx);
} accel_tracker_ops;

typedef struct accel_tracker accel_tracker;

/* A tracker of your own; ops is borrowed (keep it alive), ctx is yours. */
accel_tracker *accel_tracker_new(const accel_tracker_ops *ops, void *ctx);
/* A built-in tracker ("tensorboard", "jsonl", "csv") writing under
 * <logging_dir>/<project>/ (made if missing). NULL + error: unknown name
 * (naming the choices), unwritable directory. */
accel_tracker *accel_tracker_open(const char *name, const char *project, const char *logging_dir);
const char *accel_tracker_name(const accel_tracker *t);
/* The ctx given to accel_tracker_new (NULL for a built-in). */
void *accel_tracker_context(const accel_tracker *t);
/* Keys must be non-empty; strings non-NULL. */
accel_status accel_tracker_store_init_configuration(accel_tracker *t, int n, const accel_value *config);
accel_status accel_tracker_log(accel_tracker *t, int n, const accel_value *values, int64_t step);
/* Finishes (flush, close) and frees. NULL is a no-op. A tracker added to an
 * accelerator is its: refused (ACCEL_ERR_STATE), nothing freed. */
accel_status accel_tracker_finish(accel_tracker *t);
/* The i-th built-in tracker's name ("tensorboard", "jsonl", "csv"), NULL past the last. */
const char *accel_tracker_builtin(int i);

#ifdef __cplusplus
}
#endif
#endif /* ACCEL_TRACKING_H */
