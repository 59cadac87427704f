# io layer: fuzz target for the safetensors header and index parsers, and the
# PyTorch (torch.save zip) reader: zip directory and restricted unpickler.
# Always: a plain driver replaying tests/data/fuzz_seeds (works with gcc, ASan included).
add_executable(fuzz_safetensors ${CMAKE_CURRENT_SOURCE_DIR}/fuzz_safetensors.c)
target_include_directories(fuzz_safetensors PRIVATE ${CMAKE_SOURCE_DIR}/src)
target_link_libraries(fuzz_safetensors PRIVATE accel PkgConfig::JANSSON)
add_test(NAME fuzz_safetensors_seeds COMMAND fuzz_safetensors ${CMAKE_CURRENT_SOURCE_DIR}/data/fuzz_seeds)
# and the valid and corrupt files judged by Python safetensors (tools/gen_safetensors_verdicts.py)
add_test(NAME fuzz_safetensors_verdicts COMMAND fuzz_safetensors ${CMAKE_CURRENT_SOURCE_DIR}/data/st_verdicts)

# With clang: a real libFuzzer run (20 s). The parser sources are compiled into
# the target so they carry the fuzzer's coverage instrumentation.
if(CMAKE_C_COMPILER_ID MATCHES "Clang")
  add_executable(fuzz_safetensors_libfuzzer ${CMAKE_CURRENT_SOURCE_DIR}/fuzz_safetensors.c
    ${CMAKE_SOURCE_DIR}/src/io/safetensors_read.c ${CMAKE_SOURCE_DIR}/src/io/checkpoint.c
    ${CMAKE_SOURCE_DIR}/src/io/io_util.c ${CMAKE_SOURCE_DIR}/src/io/torch_load.c
    ${CMAKE_SOURCE_DIR}/src/io/torch_unpickle.c ${CMAKE_SOURCE_DIR}/src/io/zip_read.c)
  target_include_directories(fuzz_safetensors_libfuzzer PRIVATE ${CMAKE_SOURCE_DIR}/src)
  target_compile_definitions(fuzz_safetensors_libfuzzer PRIVATE ACCEL_LIBFUZZER)
  target_compile_options(fuzz_safetensors_libfuzzer PRIVATE -fsanitize=fuzzer,address,undefined)
  target_link_options(fuzz_safetensors_libfuzzer PRIVATE -fsanitize=fuzzer,address,undefined)
  target_link_libraries(fuzz_safetensors_libfuzzer PRIVATE accel PkgConfig::JANSSON)
  file(MAKE_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR}/fuzz_corpus)
  add_test(NAME fuzz_safetensors_libfuzzer
    COMMAND fuzz_safetensors_libfuzzer -max_total_time=20 -rss_limit_mb=1024
            ${CMAKE_CURRENT_BINARY_DIR}/fuzz_corpus ${CMAKE_CURRENT_SOURCE_DIR}/data/fuzz_seeds
            ${CMAKE_CURRENT_SOURCE_DIR}/data/st_verdicts)
  set_tests_properties(fuzz_safetensors_libfuzzer PROPERTIES TIMEOUT 120)
endif()

# The atomic writer on a file system that keeps no sticky bit (its mark):
# test_atomic_write_nosticky runs itself again with this LD_PRELOAD shim,
# which drops the bit from every file open() creates.
add_library(nosticky_shim MODULE ${CMAKE_CURRENT_SOURCE_DIR}/nosticky_shim.c)
target_link_libraries(nosticky_shim PRIVATE ${CMAKE_DL_LIBS})
set_tests_properties(atomic_write_nosticky PROPERTIES
  ENVIRONMENT "OMP_NUM_THREADS=2;ACCEL_TEST_NOSTICKY_SHIM=$<TARGET_FILE:nosticky_shim>")
