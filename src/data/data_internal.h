/* Shared between the files of src/data. */
#ifndef ACCEL_DATA_INTERNAL_H
#define ACCEL_DATA_INTERNAL_H

#include "accel/data.h"
#include "core/handle.h"
#include "core/link.h"

/* Collates samples idx[0..n) into step tensors out->fields[f] [n, ...]. */
accel_status accel__dataset_collate(accel_dataset *ds, int64_t n, const int64_t *idx,
                                    accel_batch *out);
/* The links of a dataset (core/link.h): its data loaders, which its free
 * detaches (they then refuse every call that reads it). */
accel__link **accel__dataset_links(accel_dataset *ds);
/* ACCEL__DEAD for a dataset (core/handle.h), whose fields are dataset.c's. */
bool accel__dataset_dead(const accel_dataset *ds, const char *fn);
/* The links of a data loader (core/link.h): the accelerator that prepared it. */
accel__link **accel__dataloader_links(accel_dataloader *dl);
/* Where the loader's batches go (Accelerate's device placement, set by the
 * accelerator that prepares it): cpu leaves them in host memory. */
void accel__dataloader_place(accel_dataloader *dl, accel_device dev);

#endif
