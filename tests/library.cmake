# The library as an outsider gets it.
#
# install: installed (DESTDIR + --prefix), then an example built with only
# `pkg-config --cflags --libs accel` and with find_package(accel)
# (tests/test_install.sh). Sanitizer builds pass their flags on, so the
# outside program links the sanitizer runtime too.
set(ACCEL_INSTALL_TEST_FLAGS "")
if(ACCEL_SANITIZE)
  set(ACCEL_INSTALL_TEST_FLAGS "-fsanitize=address,undefined")
endif()
add_test(NAME install COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/test_install.sh ${CMAKE_BINARY_DIR}
  ${CMAKE_SOURCE_DIR}/examples/train_linear.c ${CMAKE_C_COMPILER} "${ACCEL_INSTALL_TEST_FLAGS}")
set_tests_properties(install PROPERTIES TIMEOUT 300 ENVIRONMENT "OMP_NUM_THREADS=2")

# layers: the layering of docs/architecture.md, checked on the sources with grep
# (tests/check_layers.sh: what core and the backends include, no model named in
# generic code, dist's allocations, every thread-local in the doc's table).
add_test(NAME layers COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/check_layers.sh ${CMAKE_SOURCE_DIR})

# portable_library: no AVX/AVX-512 code outside the per-ISA kernel variants
# (a -march=native build is for its build machine only: not checked).
if(NOT ACCEL_MARCH_NATIVE AND CMAKE_SYSTEM_PROCESSOR MATCHES "^(x86_64|AMD64|amd64)$")
  add_test(NAME portable_library COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/check_portable.sh $<TARGET_FILE:accel>)
  # the CPU-side plug-ins, once part of the library (not cuda's: cudart's own code is not ours)
  foreach(p hostless dnnl)
    if(TARGET accel-${p})
      add_test(NAME portable_plugin_${p} COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/check_portable.sh $<TARGET_FILE:accel-${p}>)
    endif()
  endforeach()
endif()
