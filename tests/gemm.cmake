# The GEMM providers (src/backends/cpu/gemm.h, docs/cpu.md): ACCEL_GEMM read
# from the environment (and refused when it names no mode), and the tests
# whose numerics run through the GEMM once more on each provider forced (weight_cache:
# the prepared weights bit-identical on both paths, step_casts: the step tensors' shared conversions
# of either kind; ops_attention_lowp: attention's
# score GEMMs on bf16 operands where oneDNN has them, else on f32 tiles), so
# the oneDNN path (bf16 operands kept through the ops included) runs on CPUs
# whose auto choice is OpenBLAS. The plain runs (the glob) use auto.
set(_gemm_env_modes openblas bogus)
if(ACCEL_HAVE_DNNL)
  list(APPEND _gemm_env_modes dnnl)
endif()
foreach(m ${_gemm_env_modes})
  add_test(NAME gemm_providers_env_${m} COMMAND test_gemm_providers --env ${m}
           WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR})
  set_tests_properties(gemm_providers_env_${m} PROPERTIES TIMEOUT 300
                       ENVIRONMENT "OMP_NUM_THREADS=2;ACCEL_GEMM=${m}")
endforeach()
list(REMOVE_ITEM _gemm_env_modes bogus)
foreach(m ${_gemm_env_modes})
  foreach(t llama_numerics llama_autocast llama_hf ops_conv ops_matmul ops_nn nn_layers accelerator_fp16 no_malloc weight_cache step_casts
            training_memory ops_attention_lowp)
    add_test(NAME ${t}_gemm_${m} COMMAND test_${t} WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR})
    set_tests_properties(${t}_gemm_${m} PROPERTIES TIMEOUT 300
                         ENVIRONMENT "OMP_NUM_THREADS=2;ACCEL_GEMM=${m}")
  endforeach()
endforeach()
# The weights in oneDNN's layout with the prepared-weight cache off from the
# environment: nothing reordered, the same results (test_gemm_packed.c).
add_test(NAME gemm_packed_no_cache COMMAND test_gemm_packed WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR})
set_tests_properties(gemm_packed_no_cache PROPERTIES TIMEOUT 300 ENVIRONMENT "OMP_NUM_THREADS=2;ACCEL_WEIGHT_CACHE=0")

# The ISA cap (ACCEL_CPU_ISA, src/core/cpuinfo.h): the provider- and
# ISA-sensitive tests once more under each level below this machine's own
# (the kernel variants, the GEMM providers' choices and oneDNN's kernels and
# weight layouts of a CPU of that level), so a run on an AVX-512 machine
# covers what AVX2 machines choose, and every machine the baseline. The
# machine's levels come from /proc/cpuinfo at configure time (CI builds and
# tests on one machine); avx512 is its own level only where it has AVX-512.
set(_isa_levels baseline)
if(EXISTS /proc/cpuinfo)
  file(STRINGS /proc/cpuinfo _cpu_flags REGEX "^flags" LIMIT_COUNT 1)
  if(_cpu_flags MATCHES " avx2 " AND _cpu_flags MATCHES " fma " AND _cpu_flags MATCHES " f16c ")
    list(APPEND _isa_levels avx2)
    if(_cpu_flags MATCHES " avx512f " AND _cpu_flags MATCHES " avx512bw " AND _cpu_flags MATCHES " avx512vl ")
      # the machine's own level: capped there, AMX (where it has it) is what goes
      if(_cpu_flags MATCHES " amx_tile ")
        list(APPEND _isa_levels avx512)
      endif()
    endif()
  endif()
endif()
foreach(lvl ${_isa_levels})
  set(_isa_tests cpu_dispatch ops_matmul ops_fused gemm_packed pair_pack gemm_providers ops_attention_lowp ops_attention_strided sdpa_packed
      optim openblas_core conv_dnnl)
  if(NOT lvl STREQUAL "baseline") # the memory model's paths at baseline are avx2's (no bf16 units either)
    list(APPEND _isa_tests training_memory)
  endif()
  foreach(t ${_isa_tests})
    add_test(NAME ${t}_isa_${lvl} COMMAND test_${t} WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR})
    set_tests_properties(${t}_isa_${lvl} PROPERTIES TIMEOUT 300 ENVIRONMENT "OMP_NUM_THREADS=2;ACCEL_CPU_ISA=${lvl}")
  endforeach()
endforeach()
# OPENBLAS_CORETYPE takes effect only in an OpenBLAS built with DYNAMIC_ARCH
# (Debian's libopenblas0-pthread is); one built for a single core runs it
# whatever the variable says, and the forced runs below would repeat the plain
# ones (cli_env_blas_core_forced would fail). openblas_get_config() of the
# library the build links names DYNAMIC_ARCH where it is.
try_run(_blas_probe_ran _blas_probe_built ${CMAKE_CURRENT_BINARY_DIR}/openblas_probe
        ${CMAKE_CURRENT_SOURCE_DIR}/openblas_config_probe.c LINK_LIBRARIES ${OPENBLAS_LIB}
        RUN_OUTPUT_VARIABLE _blas_config)
string(STRIP "${_blas_config}" _blas_config)
if(_blas_probe_built AND "${_blas_probe_ran}" STREQUAL "0" AND _blas_config MATCHES "(^| )DYNAMIC_ARCH( |$)")
  set(_blas_coretype_forces TRUE)
else()
  set(_blas_coretype_forces FALSE)
  if(_blas_probe_built AND "${_blas_probe_ran}" STREQUAL "0")
    set(_blas_why "(\"${_blas_config}\") is not built with DYNAMIC_ARCH: OPENBLAS_CORETYPE cannot take effect there")
  else()
    set(_blas_why "could not be asked for its build (tests/openblas_config_probe.c did not build or run)")
  endif()
  message(STATUS "OpenBLAS ${OPENBLAS_LIB} ${_blas_why}, so the tests' _blas_<core> variants and "
          "cli_env_blas_core_forced are not registered")
endif()
# OpenBLAS's core forced to one of this machine's level (OPENBLAS_CORETYPE):
# where OpenBLAS does not know the CPU it runs a core below it and gives its
# f32 work to oneDNN (openblas_core.h), so the path of a machine whose
# OpenBLAS knows its CPU (OpenBLAS the f32 rule, the measured choice starting
# from it, bf16 on f32 operands where oneDNN has no bf16 matmul) runs here
# only so: Haswell's kernels under the avx2 cap (an AVX2 machine's whole path:
# Zen 3's), SkylakeX's uncapped on an AVX-512 machine.
set(_blas_core_tests ops_matmul gemm_packed gemm_providers gemm_choice training_memory ops_attention_lowp openblas_core
    conv_dnnl)
set(_blas_cores)
if(_blas_coretype_forces AND _cpu_flags MATCHES " avx2 " AND _cpu_flags MATCHES " fma " AND _cpu_flags MATCHES " f16c ")
  list(APPEND _blas_cores avx2_haswell)
  set(_blas_env_avx2_haswell "ACCEL_CPU_ISA=avx2;OPENBLAS_CORETYPE=Haswell")
endif()
if(_blas_coretype_forces AND _cpu_flags MATCHES " avx512f " AND _cpu_flags MATCHES " avx512bw "
   AND _cpu_flags MATCHES " avx512vl ")
  list(APPEND _blas_cores skylakex)
  set(_blas_env_skylakex "OPENBLAS_CORETYPE=SkylakeX")
endif()
foreach(core ${_blas_cores})
  foreach(t ${_blas_core_tests})
    add_test(NAME ${t}_blas_${core} COMMAND test_${t} WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR})
    set_tests_properties(${t}_blas_${core} PROPERTIES TIMEOUT 300 ENVIRONMENT "OMP_NUM_THREADS=2;${_blas_env_${core}}")
  endforeach()
endforeach()
# Refused caps: a value that is no level, and a level above this CPU's own
# where there is one (avx512 on an AVX2 machine): named by every GEMM.
add_test(NAME cpu_dispatch_isa_bogus COMMAND test_cpu_dispatch WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR})
set_tests_properties(cpu_dispatch_isa_bogus PROPERTIES ENVIRONMENT "OMP_NUM_THREADS=2;ACCEL_CPU_ISA=avx3")
if(NOT _cpu_flags MATCHES " avx512f ")
  add_test(NAME cpu_dispatch_isa_above COMMAND test_cpu_dispatch WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR})
  set_tests_properties(cpu_dispatch_isa_above PROPERTIES ENVIRONMENT "OMP_NUM_THREADS=2;ACCEL_CPU_ISA=avx512")
endif()
if(TARGET accel_cli)
  # `accel env` shows the cap in force, or why it was refused
  add_test(NAME cli_env_isa_cap COMMAND accel_cli env)
  set_tests_properties(cli_env_isa_cap PROPERTIES ENVIRONMENT "ACCEL_CPU_ISA=baseline"
                       PASS_REGULAR_EXPRESSION "- ISA: none\n- ISA cap: baseline \\(ACCEL_CPU_ISA")
  # OpenBLAS's core (openblas_core.c): named on every machine, and the one
  # the user forced said to be forced (Haswell's kernels run on any AVX2 CPU)
  add_test(NAME cli_env_blas_core COMMAND accel_cli env)
  set_tests_properties(cli_env_blas_core PROPERTIES PASS_REGULAR_EXPRESSION "- BLAS core: [A-Za-z0-9_]+ \\(")
  if(_blas_coretype_forces AND _cpu_flags MATCHES " avx2 " AND _cpu_flags MATCHES " fma ")
    add_test(NAME cli_env_blas_core_forced COMMAND accel_cli env)
    set_tests_properties(cli_env_blas_core_forced PROPERTIES ENVIRONMENT "OPENBLAS_CORETYPE=Haswell"
                         PASS_REGULAR_EXPRESSION "- BLAS core: Haswell \\(AVX2 kernels, [^\n]*OPENBLAS_CORETYPE[= ][^\n]*set")
  endif()
  # set but empty: refused, as every variable (it was read as unset)
  add_test(NAME cli_env_isa_cap_empty COMMAND accel_cli env)
  set_tests_properties(cli_env_isa_cap_empty PROPERTIES ENVIRONMENT "ACCEL_CPU_ISA="
                       PASS_REGULAR_EXPRESSION "- ISA cap: refused \\(ACCEL_CPU_ISA=: expected baseline, avx2 or avx512\\)")
  add_test(NAME cli_env_isa_cap_refused COMMAND accel_cli env)
  set_tests_properties(cli_env_isa_cap_refused PROPERTIES ENVIRONMENT "ACCEL_CPU_ISA=sse9"
                       PASS_REGULAR_EXPRESSION "- ISA cap: refused \\(ACCEL_CPU_ISA=sse9: expected baseline, avx2 or avx512\\)")
  # The measured choice's tuning switches (docs/cpu.md): a value they do not
  # take is said and the default kept; set but empty alike (both were read
  # as unset without a word).
  foreach(v junk empty)
    set(_value ${v})
    if(v STREQUAL "empty")
      set(_value "")
    endif()
    add_test(NAME cli_env_gemm_measure_${v} COMMAND accel_cli env)
    set_tests_properties(cli_env_gemm_measure_${v} PROPERTIES
                         ENVIRONMENT "ACCEL_GEMM_MEASURE=${_value};ACCEL_GEMM_CACHE=off"
                         PASS_REGULAR_EXPRESSION "warning: ACCEL_GEMM_MEASURE=${_value} is neither 0 nor 1; measuring as by default")
  endforeach()
  add_test(NAME cli_env_gemm_cache_empty COMMAND accel_cli env)
  set_tests_properties(cli_env_gemm_cache_empty PROPERTIES ENVIRONMENT "ACCEL_GEMM_CACHE="
                       PASS_REGULAR_EXPRESSION "warning: ACCEL_GEMM_CACHE is set but empty[^\n]*\n(.*\n)*- GEMM choices: 0 measured, not cached")
endif()
# Two ranks whose GEMM choice caches disagree multiply on rank 0's choices
# (test_gemm_choice.c ranks_main; each rank makes its own cache directory).
if(TARGET accel_cli AND ACCEL_HAVE_DNNL)
  add_test(NAME gemm_choice_ranks_2
           COMMAND $<TARGET_FILE:accel_cli> launch --num_processes 2 $<TARGET_FILE:test_gemm_choice> ranks
           WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR})
  set_tests_properties(gemm_choice_ranks_2 PROPERTIES TIMEOUT 120
                       ENVIRONMENT "OMP_NUM_THREADS=2;ACCEL_DIST_TIMEOUT=60")
endif()
