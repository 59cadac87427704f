# Front door. `make` builds, `make demo` runs the 2-process training demo,
# `make test` runs every test twice: a normal build and an ASan+UBSan build,
# `make install [PREFIX=/usr/local] [DESTDIR=]` installs headers, libaccel.so.0,
# libaccel.a, accel.pc, the CMake package and the `accel` CLI.
JOBS ?= $(shell nproc)
PREFIX ?= /usr/local
DESTDIR ?=
DEB_PACKAGES = build-essential cmake pkg-config libopenblas-dev libopenmpi-dev openmpi-bin zlib1g-dev \
               libjansson-dev libyaml-dev libprotobuf-c-dev protobuf-c-compiler libdnnl-dev \
               libpcre2-dev libutf8proc-dev nettle-dev

.PHONY: all deps build install demo test test-fast test-asan fuzz bench clean

all: build

deps:
	@missing=""; for p in $(DEB_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  if [ "$$(id -u)" = 0 ]; then SUDO=""; else SUDO=sudo; fi; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing; \
	fi

build/CMakeCache.txt: | deps
	cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo

build: deps build/CMakeCache.txt
	cmake --build build -j $(JOBS)

install: build
	DESTDIR="$(DESTDIR)" cmake --install build --prefix "$(PREFIX)"

# The CUDA kernels' machine code (sm_90) is compiled, and checked by ptxas, once: in `build`.
# The ASan and clang builds compile them to PTX only (nvcc instruments nothing
# for ASan, and clang compiles none of them): a third of nvcc's CPU time for the same
# sources through the same front end, and a GPU still runs them (JIT from PTX).
CUDA_PTX_ONLY = -DACCEL_CUDA_ARCHITECTURES=80-virtual

build-asan/CMakeCache.txt: | deps
	cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DACCEL_SANITIZE=ON $(CUDA_PTX_ONLY)

demo: build
	./build/bin/accel launch --num_processes 2 --mixed_precision no ./build/bin/train_linear

test-fast: build
	cd build && ctest --output-on-failure -j $(JOBS)

# intercept_tls_get_addr=0: this toolchain's LeakSanitizer crashes ("Tracer caught signal 11")
# walking the dynamic TLS of threads that ran code of a dlopen'ed library (oneDNN, in its
# plug-in); without the interception it still scans every thread's stack and static TLS.
ASAN_TEST_OPTIONS = detect_leaks=1:intercept_tls_get_addr=0

test-asan: deps build-asan/CMakeCache.txt
	cmake --build build-asan -j $(JOBS)
	cd build-asan && ASAN_OPTIONS=$(ASAN_TEST_OPTIONS) UBSAN_OPTIONS=print_stacktrace=1 ctest --output-on-failure -j $(JOBS) -E '_nosan$$'

test: test-fast test-asan

# clang build of everything (-Werror) + the safetensors/index/PyTorch-file parser, tokenizer, configuration-file
# (config.json, accel config YAML, GEMM choice table, device map, checkpoint marker, ZeRO-3 sharded index) and
# PyTorch checkpoint reader (zip, unpickler) fuzzers for 20 s each.
fuzz: deps
	@dpkg-query -W -f='$${Status}' clang 2>/dev/null | grep -q "install ok installed" && \
	  dpkg-query -W -f='$${Status}' libclang-rt-14-dev 2>/dev/null | grep -q "install ok installed" || \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq clang libclang-rt-14-dev)
	CC=clang cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DACCEL_NATIVE=OFF $(CUDA_PTX_ONLY)
	cmake --build build-fuzz -j $(JOBS)
	cd build-fuzz && ctest --output-on-failure -R 'fuzz_(safetensors|tokenizer|config|torch_load)'

bench: build
	bash bench/run.sh

clean:
	rm -rf build build-asan build-fuzz
