# tokenizer: fuzz target for the tokenizer.json loader and the encode/decode
# pipeline (tests/fuzz_tokenizer.c), registered as io.cmake registers the
# safetensors one: a replay driver always, libFuzzer for 20 s under clang.
add_executable(fuzz_tokenizer ${CMAKE_CURRENT_SOURCE_DIR}/fuzz_tokenizer.c)
target_include_directories(fuzz_tokenizer PRIVATE ${CMAKE_SOURCE_DIR}/src)
target_link_libraries(fuzz_tokenizer PRIVATE accel PkgConfig::PCRE2)
add_test(NAME fuzz_tokenizer_seeds COMMAND fuzz_tokenizer ${CMAKE_CURRENT_SOURCE_DIR}/data/fuzz_seeds_tokenizer
         WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR})
if(CMAKE_C_COMPILER_ID MATCHES "Clang")
  # the tokenizer's sources compiled into the target carry the fuzzer's coverage instrumentation
  file(GLOB _tok_sources ${CMAKE_SOURCE_DIR}/src/tokenizer/*.c)
  add_executable(fuzz_tokenizer_libfuzzer ${CMAKE_CURRENT_SOURCE_DIR}/fuzz_tokenizer.c ${_tok_sources})
  target_include_directories(fuzz_tokenizer_libfuzzer PRIVATE ${CMAKE_SOURCE_DIR}/src)
  target_compile_definitions(fuzz_tokenizer_libfuzzer PRIVATE ACCEL_LIBFUZZER)
  target_compile_options(fuzz_tokenizer_libfuzzer PRIVATE -fsanitize=fuzzer,address,undefined)
  target_link_options(fuzz_tokenizer_libfuzzer PRIVATE -fsanitize=fuzzer,address,undefined)
  target_link_libraries(fuzz_tokenizer_libfuzzer PRIVATE accel PkgConfig::PCRE2 PkgConfig::UTF8PROC PkgConfig::JANSSON)
  file(MAKE_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR}/fuzz_corpus_tokenizer)
  add_test(NAME fuzz_tokenizer_libfuzzer
    COMMAND fuzz_tokenizer_libfuzzer -max_total_time=20 -rss_limit_mb=1024 -max_len=32768
            ${CMAKE_CURRENT_BINARY_DIR}/fuzz_corpus_tokenizer ${CMAKE_CURRENT_SOURCE_DIR}/data/fuzz_seeds_tokenizer
    WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR})
  set_tests_properties(fuzz_tokenizer_libfuzzer PROPERTIES TIMEOUT 120)
endif()
# examples/tokenize (tests/run_tokenize.sh)
add_test(NAME example_tokenize COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/run_tokenize.sh $<TARGET_FILE:tokenize>
         WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR})
