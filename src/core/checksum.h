/* src/core/checksum.h — CRC-32C (Castagnoli, reflected polynomial 0x82F63B78),
 * the checksum of checkpoint files (their completion marker records one per
 * file) and of TensorBoard's TFRecord framing.
 *
 * The implementation is chosen once at run time: the SSE4.2 crc32 instruction
 * on x86-64 CPUs that have it (three interleaved streams, ~20 GB/s), else a
 * portable slice-by-8 table (~1-2 GB/s). Both give the same value.
 * Internal: prefix accel__, not installed. */
#ifndef ACCEL_CORE_CHECKSUM_H
#define ACCEL_CORE_CHECKSUM_H

#include <stddef.h>
#include <stdint.h>

#include "accel/core.h"

/* CRC-32C of n bytes ("123456789" -> 0xE3069283). */
uint32_t accel__crc32c(const void *data, size_t n);
/* Continues a CRC-32C: accel__crc32c_update(accel__crc32c(a, n), b, m) is the
 * CRC-32C of a's n bytes followed by b's m (start from 0). */
uint32_t accel__crc32c_update(uint32_t crc, const void *data, size_t n);
/* The CRC-32C of a's bytes followed by b's, from their CRC-32Cs and b's length. */
uint32_t accel__crc32c_combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b);
/* Which implementation runs here: "sse4.2" or "table". */
const char *accel__crc32c_impl(void);
/* Forces the table implementation (tests compare it with the fast one);
 * false restores the run-time choice. Not thread-safe with running CRCs. */
void accel__crc32c_force_table(bool on);
/* CRC-32C of a whole regular file, read in 1 MiB chunks (a file of 128 MiB
 * or more in ranges of at least 64 MiB, one per OpenMP thread); *bytes gets
 * its size. Errors (ACCEL_ERR_IO) name the file. */
accel_status accel__file_crc32c(const char *path, uint32_t *crc, int64_t *bytes);

#endif
