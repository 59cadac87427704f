#!/bin/sh
# The static library runs on any x86-64: no AVX (VEX-encoded) instruction
# outside the archive members of the avx2/avx512 kernel variants (members
# that define NAME_avx2 / NAME_avx512 symbols, cpu_variants.h), and no
# AVX-512 register outside the avx512 ones. A stray -march=native or -mavx2
# on the whole build fails here.
# Usage: check_portable.sh LIBACCEL.a
set -eu
objdump -d --no-show-raw-insn "$1" | awk -F'\t' '
/file format/ { n++; split($0, w, ":"); name[n] = w[1]; next }
/^[0-9a-f]+ <[^>]*_avx512>:$/ { variant[n] = "avx512"; next }
/^[0-9a-f]+ <[^>]*_avx2>:$/ { if (variant[n] == "") variant[n] = "avx2"; next }
$2 ~ /^v/ { avx[n]++; if ($0 ~ /%zmm|%k[0-7]/) avx512[n]++ }
END {
    bad = n == 0
    if (bad) print "no object files in the archive"
    for (i = 1; i <= n; i++) {
        if (avx[i] && variant[i] == "") { print name[i] ": " avx[i] " AVX instructions outside the kernel variants"; bad = 1 }
        if (avx512[i] && variant[i] != "avx512") { print name[i] ": " avx512[i] " AVX-512 instructions outside the avx512 variant"; bad = 1 }
        if (variant[i] != "") nv++
    }
    if (!bad) printf "%d objects, %d of them per-ISA kernel variants: portable\n", n, nv
    exit bad
}'
