/* src/io/zip_format.h — the zip format's record signatures and fixed header
 * sizes (APPNOTE.TXT), shared by the writer (zip_write.c) and the reader
 * (zip_read.c). Internal: not installed. */
#ifndef ACCEL_ZIP_FORMAT_H
#define ACCEL_ZIP_FORMAT_H

#define ACCEL__ZIP_SIG_LOCAL 0x04034b50u
#define ACCEL__ZIP_SIG_CENTRAL 0x02014b50u
#define ACCEL__ZIP_SIG_END64 0x06064b50u
#define ACCEL__ZIP_SIG_LOCATOR64 0x07064b50u
#define ACCEL__ZIP_SIG_END 0x06054b50u
#define ACCEL__ZIP_LOCAL_BYTES 30 /* a local header before its name and extra field */

#endif
