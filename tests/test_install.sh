#!/bin/sh
# The installed library, used from outside the tree as its README says:
#   1. `cmake --install BUILD --prefix /opt/accel` with DESTDIR (a staging
#      root, as packagers use), so the files land in $STAGE/opt/accel;
#   2. the example compiled with only `pkg-config --cflags --libs accel`
#      (shared library) and run;
#   3. the same, linked statically (`pkg-config --static`, only libaccel.a
#      on the search path) and run without LD_LIBRARY_PATH;
#   4. a CMake project with find_package(accel) linking accel::accel and
#      accel::accel_static, both run;
#   5. the backend plug-ins in lib/accel/: libaccel.so and the CLI need no
#      GPU library, and each program above finds the hostless plug-in at run
#      time (ACCEL_TEST_DEVICES=1 registers its device, or says why not).
# Usage: test_install.sh BUILD_DIR EXAMPLE.c CC [EXTRA_CFLAGS]
set -eu
BUILD=$1 EXAMPLE=$2 CC=$3 EXTRA=${4:-}
HERE=$(cd "$(dirname "$0")" && pwd)
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
STAGE=$TMP/stage P=$TMP/stage/opt/accel

DESTDIR=$STAGE cmake --install "$BUILD" --prefix /opt/accel >/dev/null
for f in include/accel/accel.h include/accel/cpu.h lib/libaccel.a lib/libaccel.so lib/pkgconfig/accel.pc \
         lib/cmake/accel/accelConfig.cmake lib/cmake/accel/accelConfigVersion.cmake bin/accel \
         lib/accel/libaccel-hostless.so; do
    [ -e "$P/$f" ] || { echo "not installed: $f"; exit 1; }
done
soname=$(readelf -d "$P/lib/libaccel.so" | sed -n 's/.*SONAME.*\[\(.*\)\]/\1/p')
[ "$soname" = libaccel.so.0 ] && [ -e "$P/lib/$soname" ] || { echo "bad soname '$soname'"; exit 1; }
# Only the public API is exported: no internal accel__ symbols.
if nm -D --defined-only "$P/lib/libaccel.so" | grep -q ' accel__'; then
    echo "libaccel.so exports internal symbols:"; nm -D --defined-only "$P/lib/libaccel.so" | grep ' accel__' | head
    exit 1
fi

# The core links no accelerator runtime: the plug-ins do (lib/accel/).
for f in lib/libaccel.so bin/accel; do
    if readelf -d "$P/$f" | grep NEEDED | grep -Ei 'cuda|cublas|nccl|ascend|hccl'; then
        echo "$f needs a GPU library"; exit 1
    fi
done
if [ -e "$BUILD/lib/accel/libaccel-cuda.so" ] && [ ! -e "$P/lib/accel/libaccel-cuda.so" ]; then
    echo "not installed: lib/accel/libaccel-cuda.so"; exit 1
fi
# The CLI in bin/ finds the plug-ins in ../lib/accel (no ACCEL_BACKEND_PATH).
env_out=$(ACCEL_TEST_DEVICES=1 "$P/bin/accel" env 2>&1) || { echo "accel env failed: $env_out"; exit 1; }
echo "$env_out" | grep -q 'ACCEL_TEST_DEVICES' && { echo "installed accel: $env_out" | grep ACCEL_TEST; exit 1; }

export PKG_CONFIG_PATH=$P/lib/pkgconfig
check_run() { # NAME BINARY: the example's own success line, and the hostless plug-in found
    out=$(ACCEL_TEST_DEVICES=1 "$2" 2>"$TMP/err") || { echo "$1: exit status $?"; cat "$TMP/err"; exit 1; }
    echo "$out" | grep -q 'final_loss=' || { echo "$1: unexpected output: $out"; exit 1; }
    if grep -q 'ACCEL_TEST_DEVICES' "$TMP/err"; then echo "$1: the plug-in was not found:"; cat "$TMP/err"; exit 1; fi
    echo "$1: $out"
}

# shellcheck disable=SC2046,SC2086 # word splitting of the flags is wanted
$CC $EXTRA "$EXAMPLE" -o "$TMP/prog" $(pkg-config --cflags --libs accel)
LD_LIBRARY_PATH=$P/lib check_run pkg-config "$TMP/prog"
readelf -d "$TMP/prog" | grep -q 'NEEDED.*libaccel.so.0' || { echo "prog does not use libaccel.so.0"; exit 1; }

mkdir "$TMP/static_only"
ln -s "$P/lib/libaccel.a" "$TMP/static_only/"
# shellcheck disable=SC2046,SC2086
$CC $EXTRA "$EXAMPLE" -o "$TMP/prog_static" -L"$TMP/static_only" $(pkg-config --cflags --libs --static accel)
# outside the prefix: the staged install is not the configured one, so ACCEL_BACKEND_PATH
ACCEL_BACKEND_PATH=$P/lib/accel check_run pkg-config-static "$TMP/prog_static"

cmake -S "$HERE/install_consumer" -B "$TMP/consumer" -DCMAKE_PREFIX_PATH="$P" -DCMAKE_C_COMPILER="$CC" \
      -DCMAKE_C_FLAGS="$EXTRA" -DACCEL_EXAMPLE="$EXAMPLE" >"$TMP/consumer.log" 2>&1 ||
    { cat "$TMP/consumer.log"; exit 1; }
cmake --build "$TMP/consumer" >>"$TMP/consumer.log" 2>&1 || { cat "$TMP/consumer.log"; exit 1; }
LD_LIBRARY_PATH=$P/lib check_run find_package-shared "$TMP/consumer/consumer_shared"
ACCEL_BACKEND_PATH=$P/lib/accel check_run find_package-static "$TMP/consumer/consumer_static"
