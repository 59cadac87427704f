/* TensorBoard event files (tensorboard.c), visible to the tests. */
#ifndef ACCEL_TB_INTERNAL_H
#define ACCEL_TB_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "core/checksum.h"
#include "tracking/tracking_internal.h"

/* TFRecord's masked CRC: rotate right by 15, add 0xa282ead8. */
uint32_t accel__crc32c_masked(const void *data, size_t n);

/* The tracker ops and context of the "tensorboard", "jsonl" and "csv" trackers. */
extern const accel_tracker_ops accel__tb_ops, accel__jsonl_ops, accel__csv_ops;
void *accel__tb_open(const char *run_dir);
void *accel__jsonl_open(const char *run_dir);
void *accel__csv_open(const char *run_dir);

/* Writes the config as JSON (sorted keys as Accelerate's json trackers do). */
accel_status accel__config_json(const char *path, int n, const accel_value *config);

#endif
