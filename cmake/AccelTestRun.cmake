# How ctest runs the suite (docs/testing.md), for every test of tests/: included
# by tests/CMakeLists.txt after all of them are registered, so a new test gets
# the same treatment without an entry here.
#
# OMP_WAIT_POLICY=PASSIVE, as `accel launch` sets for its ranks
# (src/cli/cli_launch.c): libgomp's default spin after each parallel region kept
# a core busy that another test, or another rank of a forked multi-process
# test, needed (2 OpenMP threads a process, 2 tests at once, up to 8 ranks on
# a 2-core machine). Measured on 2 cores: test_tp_llama's CPU time 57 s -> 17 s,
# test_ops_matmul's 11.9 s -> 5.7 s. Only the waiting changes, not which code
# runs. A test that sets its own OMP_WAIT_POLICY keeps it.
get_property(_accel_tests DIRECTORY PROPERTY TESTS)
foreach(t ${_accel_tests})
  get_test_property(${t} ENVIRONMENT _env)
  if(NOT _env MATCHES "OMP_WAIT_POLICY=")
    set_property(TEST ${t} APPEND PROPERTY ENVIRONMENT "OMP_WAIT_POLICY=PASSIVE")
  endif()
endforeach()

# Longest first: on a fresh build tree ctest has no timings of its own
# (Testing/Temporary/CTestCostData.txt, which it writes after each run and
# prefers) and starts the tests in the order they were added, so a long test
# added late ran while the other job slot idled. COST: seconds of the ASan+UBSan
# run (the longer one; the _nosan tests' of the gcc run) on 2026-12-03, a loaded
# machine (docs/testing.md); only their order counts.
# Tests that this machine's configuration does not add are skipped.
set(_accel_test_costs
  training_memory_tp4_bf16_isa_avx2 85 training_memory_tp4_bf16 82 example_nlp_2 81
  training_memory_tp4_bf16_sp_isa_avx2 72 ops_matmul_isa_baseline 68 ops_matmul_isa_avx2 67
  ops_matmul_gemm_openblas 52 cuda_kernels_harness 52 checkpoint_integrity_2 52 training_memory_tp4_bf16_sp 50
  cli_python 50 training_memory_tp4_sp 49 ops_matmul_hostless 48 ops_matmul_gemm_dnnl 47 tp_llama 46
  bigmodel_hf_check_accel_nosan 46 training_memory_tp4 45 training_memory_tp2_bf16_isa_avx2 44
  accelerator_checkpoint_kill_points 43 training_memory_tp2_bf16 42 ops_matmul 42 many_members_large_nosan 39
  cp_attention 38)
while(_accel_test_costs)
  list(POP_FRONT _accel_test_costs t cost)
  if(TEST ${t})
    set_tests_properties(${t} PROPERTIES COST ${cost})
  endif()
endwhile()
