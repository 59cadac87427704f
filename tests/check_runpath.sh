#!/bin/sh
# No empty or relative entry in the RUNPATH (or RPATH) of any program,
# library or plug-in the build made: an empty entry (CMake's padding for a
# later rewrite) or a relative one makes the loader search the directory the
# program is run from, so a libjansson.so.4 left there would be loaded.
# Usage: check_runpath.sh BUILD_DIR
set -eu
BUILD=$1
bad=0 n=0
for f in $(find "$BUILD/bin" "$BUILD/lib" -type f \( -perm -u+x -o -name '*.so*' \) 2>/dev/null); do
    head -c 4 "$f" | grep -q 'ELF' || continue
    n=$((n + 1))
    paths=$(readelf -d "$f" 2>/dev/null | sed -n 's/.*(R[UN]*PATH).*\[\(.*\)\]/\1/p')
    [ -n "$paths" ] || continue
    case ":$paths:" in
    *::*) echo "$f: empty RUNPATH entry in [$paths]"; bad=1; continue ;;
    esac
    old_ifs=$IFS; IFS=:
    for p in $paths; do
        case "$p" in
        /* | '$ORIGIN'*) ;;
        *) echo "$f: relative RUNPATH entry '$p' in [$paths]"; bad=1 ;;
        esac
    done
    IFS=$old_ifs
done
[ "$n" -gt 0 ] || { echo "no ELF file under $BUILD/bin and $BUILD/lib"; exit 1; }
[ "$bad" = 0 ] && echo "$n files: every RUNPATH entry is an absolute directory"
exit $bad
