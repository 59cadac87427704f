# The PyTorch checkpoint reader (torch.save's zip, restricted unpickler):
# fuzz target tests/fuzz_torch_load.c, registered as io.cmake registers the
# safetensors one: a replay driver always, libFuzzer for 20 s under clang.
add_executable(fuzz_torch_load ${CMAKE_CURRENT_SOURCE_DIR}/fuzz_torch_load.c)
target_include_directories(fuzz_torch_load PRIVATE ${CMAKE_SOURCE_DIR}/src)
target_link_libraries(fuzz_torch_load PRIVATE accel)
add_test(NAME fuzz_torch_load_seeds COMMAND fuzz_torch_load ${CMAKE_CURRENT_SOURCE_DIR}/data/fuzz_seeds_torch)
set(_torch_fuzz_env "OMP_NUM_THREADS=1;ASAN_OPTIONS=detect_leaks=1:intercept_tls_get_addr=0")
set_tests_properties(fuzz_torch_load_seeds PROPERTIES ENVIRONMENT "${_torch_fuzz_env}")
if(CMAKE_C_COMPILER_ID MATCHES "Clang")
  # the reader's sources compiled into the target carry the fuzzer's coverage instrumentation
  add_executable(fuzz_torch_load_libfuzzer ${CMAKE_CURRENT_SOURCE_DIR}/fuzz_torch_load.c
    ${CMAKE_SOURCE_DIR}/src/io/safetensors_read.c ${CMAKE_SOURCE_DIR}/src/io/checkpoint.c
    ${CMAKE_SOURCE_DIR}/src/io/io_util.c ${CMAKE_SOURCE_DIR}/src/io/torch_load.c
    ${CMAKE_SOURCE_DIR}/src/io/torch_unpickle.c ${CMAKE_SOURCE_DIR}/src/io/zip_read.c)
  target_include_directories(fuzz_torch_load_libfuzzer PRIVATE ${CMAKE_SOURCE_DIR}/src)
  target_compile_definitions(fuzz_torch_load_libfuzzer PRIVATE ACCEL_LIBFUZZER)
  target_compile_options(fuzz_torch_load_libfuzzer PRIVATE -fsanitize=fuzzer,address,undefined)
  target_link_options(fuzz_torch_load_libfuzzer PRIVATE -fsanitize=fuzzer,address,undefined)
  target_link_libraries(fuzz_torch_load_libfuzzer PRIVATE accel)
  file(MAKE_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR}/fuzz_corpus_torch)
  add_test(NAME fuzz_torch_load_libfuzzer
    COMMAND fuzz_torch_load_libfuzzer -max_total_time=20 -rss_limit_mb=1024 -max_len=8192 -timeout=10
            -dict=${CMAKE_CURRENT_SOURCE_DIR}/fuzz_torch_load.dict
            ${CMAKE_CURRENT_BINARY_DIR}/fuzz_corpus_torch ${CMAKE_CURRENT_SOURCE_DIR}/data/fuzz_seeds_torch)
  # each input is written to files (the zip writer and accel_torch_save fsync them): on a disk
  # that is 100 inputs a second, in memory 2000
  if(IS_DIRECTORY /dev/shm)
    list(APPEND _torch_fuzz_env "TMPDIR=/dev/shm")
  endif()
  set_tests_properties(fuzz_torch_load_libfuzzer PROPERTIES TIMEOUT 120 ENVIRONMENT "${_torch_fuzz_env}")
endif()
