/* The CPU backend's measured GEMM choices (backends/cpu/gemm.h, docs/cpu.md
 * "Measured choice") carried where the backend does not reach: to the job's
 * other ranks, and into and out of a checkpoint. The backend makes and
 * installs the table as JSON (accel__gemm_choices_bundle / _install); these
 * move it over a process group and through a file. Internal. */
#ifndef ACCEL_ACCELERATOR_GEMM_CHOICES_H
#define ACCEL_ACCELERATOR_GEMM_CHOICES_H

#include "accel/dist.h"

/* The table, every thread count's choices ({"tables": [<a cache file's
 * JSON>, ...]}), into path, with a checkpoint; and back: a saved table
 * replaces the whole table (the saver's own thread count's choices as this
 * process's count's) and is never timed again nor added to from the cache,
 * so a resumed run multiplies as the saved one did (a missing file is no
 * error: an older checkpoint; a single table, as checkpoints held before
 * bundles, is read as this thread count's). ACCEL_OK, or an error naming
 * the file. */
accel_status accel__gemm_choices_save(const char *path);
accel_status accel__gemm_choices_load(const char *path);

/* Collective over pg (at accelerator creation): rank 0 reads its cache and
 * sends its table; every other rank replaces its own table with it. From
 * then on no rank reads a cache file (nor times: a job's ranks never do), so
 * all multiply alike whatever their caches hold; a class rank 0 had not
 * cached takes the rule on every rank. A group of one: nothing. ACCEL_OK, or
 * an error (the broadcast's; a table this rank cannot read). */
accel_status accel__gemm_choices_share(accel_pg *pg);

#endif
