# The configuration files a user hands accel: fuzz target tests/fuzz_config.c
# (config.json of every family, `accel config`'s YAML / JSON, the GEMM choice
# table, a device map, a checkpoint's completion marker, a ZeRO-3 sharded checkpoint's
# index), registered as io.cmake registers
# the safetensors one: a replay driver always (gcc, ASan included), libFuzzer
# for 20 s under clang. The `accel config` reader lives in the CLI, not in the
# library: its three files are compiled into both targets.
set(_cfg_cli_sources ${CMAKE_SOURCE_DIR}/src/cli/cli_cfgfile.c ${CMAKE_SOURCE_DIR}/src/cli/cli_launch_env.c
  ${CMAKE_SOURCE_DIR}/src/cli/cli_args.c)
add_executable(fuzz_config ${CMAKE_CURRENT_SOURCE_DIR}/fuzz_config.c ${_cfg_cli_sources})
target_include_directories(fuzz_config PRIVATE ${CMAKE_SOURCE_DIR}/src)
target_link_libraries(fuzz_config PRIVATE accel PkgConfig::JANSSON PkgConfig::YAML)
add_test(NAME fuzz_config_seeds COMMAND fuzz_config ${CMAKE_CURRENT_SOURCE_DIR}/data/fuzz_seeds_config
         WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR})
# intercept_tls_get_addr=0: LeakSanitizer's exit scan crashes on the threads that ran the
# oneDNN plug-in's code (the GEMMs after a choice table; the Makefile's ASAN_TEST_OPTIONS says why)
set(_cfg_fuzz_env "OMP_NUM_THREADS=2;ASAN_OPTIONS=detect_leaks=1:intercept_tls_get_addr=0")
set_tests_properties(fuzz_config_seeds PROPERTIES ENVIRONMENT "${_cfg_fuzz_env}")
if(CMAKE_C_COMPILER_ID MATCHES "Clang")
  # the parsers' sources compiled into the target carry the fuzzer's coverage instrumentation
  add_executable(fuzz_config_libfuzzer ${CMAKE_CURRENT_SOURCE_DIR}/fuzz_config.c ${_cfg_cli_sources}
    ${CMAKE_SOURCE_DIR}/src/io/hf_config.c ${CMAKE_SOURCE_DIR}/src/io/bert_config.c
    ${CMAKE_SOURCE_DIR}/src/io/checkpoint_marker.c ${CMAKE_SOURCE_DIR}/src/backends/cpu/gemm_choice.c
    ${CMAKE_SOURCE_DIR}/src/bigmodel/device_map.c ${CMAKE_SOURCE_DIR}/src/accelerator/zero3_checkpoint.c)
  target_include_directories(fuzz_config_libfuzzer PRIVATE ${CMAKE_SOURCE_DIR}/src)
  target_compile_definitions(fuzz_config_libfuzzer PRIVATE ACCEL_LIBFUZZER)
  target_compile_options(fuzz_config_libfuzzer PRIVATE -fsanitize=fuzzer,address,undefined)
  target_link_options(fuzz_config_libfuzzer PRIVATE -fsanitize=fuzzer,address,undefined)
  target_link_libraries(fuzz_config_libfuzzer PRIVATE accel PkgConfig::JANSSON PkgConfig::YAML)
  file(MAKE_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR}/fuzz_corpus_config)
  add_test(NAME fuzz_config_libfuzzer
    COMMAND fuzz_config_libfuzzer -max_total_time=20 -rss_limit_mb=2048 -max_len=4096 -timeout=10
            -dict=${CMAKE_CURRENT_SOURCE_DIR}/fuzz_config.dict ${CMAKE_CURRENT_BINARY_DIR}/fuzz_corpus_config ${CMAKE_CURRENT_SOURCE_DIR}/data/fuzz_seeds_config
    WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR})
  set_tests_properties(fuzz_config_libfuzzer PROPERTIES TIMEOUT 120 ENVIRONMENT "${_cfg_fuzz_env}")
endif()
