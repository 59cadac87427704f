# Per-ISA builds of the hot CPU kernel files (src/backends/cpu/cpu_variants.h
# explains the mechanism). accel_add_cpu_variants(TARGET SOURCES...) compiles
# SOURCES once per variant into object libraries, adds the objects to TARGET,
# and tells TARGET's sources which variants exist (ACCEL_CPU_VARIANT_AVX2, ...;
# ACCEL_CPU_NATIVE when the whole build is -march=native, which compiles the
# baseline variant only). The variant objects land in ACCEL_CPU_VARIANT_OBJECTS
# (parent scope) for the other libraries made of the same code.
function(accel_add_cpu_variants target)
  set(variants baseline)
  set(flags_baseline "")
  if(ACCEL_MARCH_NATIVE)
    target_compile_definitions(${target} PRIVATE ACCEL_CPU_NATIVE)
  elseif(CMAKE_SYSTEM_PROCESSOR MATCHES "^(x86_64|AMD64|amd64)$")
    list(APPEND variants avx2 avx512)
    set(flags_avx2 -mavx2 -mfma -mf16c)
    set(flags_avx512 -mavx512f -mavx512bw -mavx512vl -mavx2 -mfma -mf16c)
  endif()
  set(objects "")
  foreach(v ${variants})
    set(lib ${target}_cpu_${v})
    add_library(${lib} OBJECT ${ARGN})
    target_compile_options(${lib} PRIVATE ${flags_${v}}
      -include ${CMAKE_SOURCE_DIR}/src/backends/cpu/cpu_variant_rename.h)
    target_compile_definitions(${lib} PRIVATE ACCEL__CPU_VARIANT=${v})
    target_include_directories(${lib} PRIVATE ${CMAKE_SOURCE_DIR}/include ${CMAKE_SOURCE_DIR}/src)
    target_link_libraries(${lib} PRIVATE OpenMP::OpenMP_C) # its compile flags
    set_target_properties(${lib} PROPERTIES POSITION_INDEPENDENT_CODE ON)
    if(NOT v STREQUAL "baseline")
      string(TOUPPER ${v} V)
      target_compile_definitions(${target} PRIVATE ACCEL_CPU_VARIANT_${V})
    endif()
    list(APPEND objects $<TARGET_OBJECTS:${lib}>)
  endforeach()
  target_sources(${target} PRIVATE ${objects})
  set(ACCEL_CPU_VARIANT_OBJECTS ${objects} PARENT_SCOPE)
endfunction()
