/* src/io/torch_pickle.h — what torch.save's data.pkl is made of, shared by
 * the writer (torch_save.c) and the restricted reader (torch_unpickle.c):
 * the pickle opcodes either uses and torch's legacy storage class names.
 * Internal: prefix accel__, not installed. */
#ifndef ACCEL_TORCH_PICKLE_H
#define ACCEL_TORCH_PICKLE_H

#include "accel/core.h"

/* The opcodes of pickle protocols 2-4 (CPython's pickle.py names) that
 * state dicts use: the writer emits some, the reader takes all of them. */
enum {
    OP_PROTO = 0x80, OP_FRAME = 0x95, OP_STOP = '.', OP_MARK = '(', OP_EMPTY_DICT = '}', OP_EMPTY_TUPLE = ')',
    OP_TUPLE = 't', OP_TUPLE1 = 0x85, OP_TUPLE2 = 0x86, OP_TUPLE3 = 0x87, OP_BINUNICODE = 'X',
    OP_SHORT_BINUNICODE = 0x8c, OP_BINUNICODE8 = 0x8d, OP_GLOBAL = 'c', OP_STACK_GLOBAL = 0x93,
    OP_BINPERSID = 'Q', OP_BININT = 'J', OP_BININT1 = 'K', OP_BININT2 = 'M', OP_LONG1 = 0x8a, OP_BINFLOAT = 'G',
    OP_NONE = 'N', OP_NEWTRUE = 0x88, OP_NEWFALSE = 0x89, OP_REDUCE = 'R', OP_BUILD = 'b', OP_SETITEM = 's',
    OP_SETITEMS = 'u', OP_BINPUT = 'q', OP_LONG_BINPUT = 'r', OP_MEMOIZE = 0x94, OP_BINGET = 'h',
    OP_LONG_BINGET = 'j',
};

/* torch.<Type>Storage of dtype dt (torch/storage.py's legacy names), NULL
 * for a dtype torch has no such class of. */
static inline const char *accel__torch_storage_class(accel_dtype dt) {
    static const char *const N[ACCEL_DTYPE_COUNT] = {
        [ACCEL_F32] = "FloatStorage", [ACCEL_BF16] = "BFloat16Storage", [ACCEL_F16] = "HalfStorage",
        [ACCEL_F64] = "DoubleStorage", [ACCEL_I64] = "LongStorage", [ACCEL_I32] = "IntStorage",
        [ACCEL_U8] = "ByteStorage", [ACCEL_BOOL] = "BoolStorage", [ACCEL_I8] = "CharStorage",
        [ACCEL_I16] = "ShortStorage"};
    return (unsigned)dt < ACCEL_DTYPE_COUNT ? N[dt] : NULL;
}

#endif
