# Backend plug-ins (src/backends/plugin.h; tests/test_plugin.c): broken plug-in
# files, each in a directory of its own under its real name, and the runs
# that find them first through ACCEL_BACKEND_PATH.
set(_pdir ${CMAKE_CURRENT_BINARY_DIR}/plugins)
file(WRITE ${_pdir}/garbage/libaccel-hostless.so "this is not a shared object\n")
# other_headers: no_init's file as built against shared headers of another
# text (another ACCEL__PLUGIN_HEADERS_HASH), whose sizes all match.
string(SHA256 _other "not ${ACCEL_PLUGIN_LAYOUT_DEF}")
string(SUBSTRING ${_other} 0 8 _other)
foreach(kind bad_abi no_init other_headers)
  string(TOUPPER ${kind} def)
  set(layout ${ACCEL_PLUGIN_LAYOUT_DEF})
  if(kind STREQUAL "other_headers")
    set(def NO_INIT)
    set(layout ACCEL__PLUGIN_HEADERS_HASH=0x${_other}u)
  endif()
  add_library(plugin_${kind} MODULE plugin_bad.c)
  target_include_directories(plugin_${kind} PRIVATE ${CMAKE_SOURCE_DIR}/include ${CMAKE_SOURCE_DIR}/src)
  target_compile_definitions(plugin_${kind} PRIVATE ${def} ${layout})
  set_target_properties(plugin_${kind} PROPERTIES PREFIX lib OUTPUT_NAME accel-hostless
    LIBRARY_OUTPUT_DIRECTORY ${_pdir}/${kind})
  add_dependencies(test_plugin plugin_${kind})
endforeach()
set(_cuda_plugin "")
if(TARGET accel-cuda)
  set(_cuda_plugin $<TARGET_FILE:accel-cuda>)
endif()
# `plugin` (tests/CMakeLists.txt) runs it without the files.
add_test(NAME plugin_files COMMAND test_plugin ${_pdir}/garbage/libaccel-hostless.so
  $<TARGET_FILE:plugin_bad_abi> $<TARGET_FILE:plugin_no_init> "${_cuda_plugin}")
set_tests_properties(plugin_files PROPERTIES ENVIRONMENT "OMP_NUM_THREADS=1")
foreach(case "garbage|cannot be loaded" "bad_abi|was built for another accel (plug-in ABI 999"
             "no_init|has no symbol accel_backend_hostless_init"
             "other_headers|was built for another accel (plug-in ABI 1, layout ")
  string(REPLACE "|" ";" case "${case}")
  list(GET case 0 kind)
  list(GET case 1 want)
  add_test(NAME plugin_broken_${kind} COMMAND test_plugin broken "${want}")
  set_tests_properties(plugin_broken_${kind} PROPERTIES
    ENVIRONMENT "OMP_NUM_THREADS=1;ACCEL_BACKEND_PATH=${_pdir}/${kind}")
  # CPU training is untouched by a broken plug-in, even one asked for at start-up
  add_test(NAME plugin_broken_${kind}_train COMMAND train_linear)
  set_tests_properties(plugin_broken_${kind}_train PROPERTIES PASS_REGULAR_EXPRESSION "final_loss="
    ENVIRONMENT "OMP_NUM_THREADS=1;ACCEL_TEST_DEVICES=1;ACCEL_BACKEND_PATH=${_pdir}/${kind}")
endforeach()
# The first load raced by threads (none may fail while another loads it).
add_test(NAME plugin_race COMMAND test_plugin race)
set_tests_properties(plugin_race PROPERTIES ENVIRONMENT "OMP_NUM_THREADS=1")
# No empty or relative RUNPATH entry in anything built (an empty one makes
# the loader search the working directory).
add_test(NAME runpath COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/check_runpath.sh ${CMAKE_BINARY_DIR})
# No plug-in file at all: test_plugin copied alone into an empty directory,
# where none of the places searched has libaccel-hostless.so.
add_test(NAME plugin_missing COMMAND sh -c
  "d=$(mktemp -d) && cp \"$1\" \"$d/\" && \"$d/test_plugin\" broken 'libaccel-hostless.so is not installed (looked in '; r=$?; rm -rf \"$d\"; exit $r"
  sh $<TARGET_FILE:test_plugin>)
set_tests_properties(plugin_missing PROPERTIES ENVIRONMENT "OMP_NUM_THREADS=1")
# A plug-in file planted beside a program that linked libaccel.a (and in its
# accel/) is never loaded: such a program looks in its ../lib/accel only.
add_test(NAME plugin_planted COMMAND sh -c
  "d=$(mktemp -d) && mkdir \"$d/bin\" \"$d/bin/accel\" && cp \"$1\" \"$d/bin/\" && cp \"$2\" \"$d/bin/\" && cp \"$2\" \"$d/bin/accel/\" && \"$d/bin/test_plugin\" broken 'libaccel-hostless.so is not installed (looked in '; r=$?; rm -rf \"$d\"; exit $r"
  sh $<TARGET_FILE:test_plugin> ${_pdir}/no_init/libaccel-hostless.so)
set_tests_properties(plugin_planted PROPERTIES ENVIRONMENT "OMP_NUM_THREADS=1")
# `accel env` copied alone, away from its oneDNN plug-in: the GEMM and Conv
# lines say the plug-in did not load and where it looked, not that the CPU
# lacks bf16.
if(ACCEL_HAVE_DNNL)
  add_test(NAME plugin_dnnl_missing_env COMMAND sh -c
    "d=$(mktemp -d) && cp \"$1\" \"$d/\" && \"$d/accel\" env > \"$d/out\" 2>&1; r=$?; grep -q '^- GEMM bf16: openblas on f32 operands (the oneDNN plug-in did not load: the dnnl backend plug-in libaccel-dnnl.so is not installed (looked in ' \"$d/out\" && grep -q '^- GEMM f32: openblas (the oneDNN plug-in did not load' \"$d/out\" && grep -q '^- Conv: im2col + GEMM (the oneDNN plug-in did not load: the dnnl backend plug-in libaccel-dnnl.so is not installed (looked in ' \"$d/out\" || { cat \"$d/out\"; r=1; }; rm -rf \"$d\"; exit $r"
    sh $<TARGET_FILE:accel_cli>)
  set_tests_properties(plugin_dnnl_missing_env PROPERTIES ENVIRONMENT "OMP_NUM_THREADS=1;ACCEL_GEMM=auto")
  # ACCEL_GEMM=dnnl there is no mode, as in a build without oneDNN: the GEMM
  # line says why (it said "openblas" while every GEMM failed)
  add_test(NAME plugin_dnnl_missing_gemm_dnnl COMMAND sh -c
    "d=$(mktemp -d) && cp \"$1\" \"$d/\" && \"$d/accel\" env > \"$d/out\" 2>&1; r=$?; grep -q '^- GEMM: none (ACCEL_GEMM=dnnl: the oneDNN plug-in did not load: the dnnl backend plug-in libaccel-dnnl.so is not installed (looked in ' \"$d/out\" || { cat \"$d/out\"; r=1; }; rm -rf \"$d\"; exit $r"
    sh $<TARGET_FILE:accel_cli>)
  set_tests_properties(plugin_dnnl_missing_gemm_dnnl PROPERTIES ENVIRONMENT "OMP_NUM_THREADS=1;ACCEL_GEMM=dnnl")
endif()
