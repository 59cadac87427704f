# The GEMM providers (src/backends/cpu/gemm.h, docs/cpu.md): ACCEL_GEMM read
# from the environment (and refused when it names no mode), and the tests
# whose numerics run through the GEMM once more on each provider forced (weight_cache:
# the prepared weights bit-identical on both paths), so
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
  foreach(t llama_numerics llama_autocast llama_hf ops_matmul ops_nn nn_layers accelerator_fp16 no_malloc weight_cache)
    add_test(NAME ${t}_gemm_${m} COMMAND test_${t} WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR})
    set_tests_properties(${t}_gemm_${m} PROPERTIES TIMEOUT 300
                         ENVIRONMENT "OMP_NUM_THREADS=2;ACCEL_GEMM=${m}")
  endforeach()
endforeach()
# The weights in oneDNN's layout with the prepared-weight cache off from the
# environment: nothing reordered, the same results (test_gemm_packed.c).
add_test(NAME gemm_packed_no_cache COMMAND test_gemm_packed WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR})
set_tests_properties(gemm_packed_no_cache PROPERTIES TIMEOUT 300 ENVIRONMENT "OMP_NUM_THREADS=2;ACCEL_WEIGHT_CACHE=0")
