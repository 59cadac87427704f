# OpenBLAS that cannot be loaded (tests/blas_missing.c): the loader of
# src/backends/cpu/openblas_lazy.c and the build description, built apart
# with a library name and directory that do not exist.
add_executable(blas_missing blas_missing.c ${CMAKE_SOURCE_DIR}/src/backends/cpu/openblas_lazy.c
  ${CMAKE_SOURCE_DIR}/src/dist/buildinfo.c)
target_include_directories(blas_missing PRIVATE ${CMAKE_SOURCE_DIR}/include ${CMAKE_SOURCE_DIR}/src
  ${CMAKE_CURRENT_SOURCE_DIR} ${CBLAS_INCLUDE_DIR})
# (the top directory's source property naming the real library stays there)
target_compile_definitions(blas_missing PRIVATE ACCEL_OPENBLAS_SONAME="libaccel-no-such-blas.so.0"
  ACCEL_OPENBLAS_DIR="/nonexistent")
target_link_libraries(blas_missing PRIVATE Threads::Threads ${CMAKE_DL_LIBS})
add_test(NAME blas_missing COMMAND blas_missing)
# libaccel.a and libaccel.so define no BLAS name (openblas_lazy.h): a program
# linking its own BLAS (MKL, BLIS) beside accel gets its own functions.
add_test(NAME blas_no_public_names COMMAND sh -c
  "! nm -g --defined-only \"$1\" \"$2\" | grep -E ' (cblas|openblas)_'" sh $<TARGET_FILE:accel>
  $<TARGET_FILE:accel_shared>)
