/* What src/accelerator/tracking.c and save.c keep per accelerator. */
#ifndef ACCEL_ACCELERATOR_TRACKING_INTERNAL_H
#define ACCEL_ACCELERATOR_TRACKING_INTERNAL_H

#include "accel/accelerator.h"

/* One register_for_checkpointing entry: callbacks, or a blob (save == NULL). */
typedef struct accel__custom {
    void *obj;
    accel_state_save_fn save;
    accel_state_load_fn load;
    size_t blob_len;
} accel__custom;

typedef struct accel__tracking {
    unsigned want;            /* log_with: bit i = accel_tracker_builtin(i) */
    bool initialized;         /* init_trackers ran */
    int stored;               /* trackers[0, stored) (added by the user) took the config of a failed init_trackers */
    int n;
    accel_tracker **trackers; /* the main process's (custom ones on every rank) */
    int n_objs;
    accel__custom *objs;
    char *resumed_from;       /* load_state's checkpoint until the jsonl log has its line */
    accel_resume_point resumed;
} accel__tracking;

#endif
