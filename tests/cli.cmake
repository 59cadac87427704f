# `accel test`: the distributed self-check on 1 and 2 processes.
file(WRITE ${CMAKE_CURRENT_BINARY_DIR}/accel_test_2proc.yaml
     "distributed_type: MULTI_CPU\nnum_processes: 2\nuse_cpu: true\nmixed_precision: 'no'\n")
add_test(NAME cli_accel_test_1 COMMAND $<TARGET_FILE:accel_cli> test)
add_test(NAME cli_accel_test_2 COMMAND $<TARGET_FILE:accel_cli> test
         --config_file ${CMAKE_CURRENT_BINARY_DIR}/accel_test_2proc.yaml)
set_tests_properties(cli_accel_test_1 cli_accel_test_2 PROPERTIES
  # the description whole: its last line (CPU kernels) before the verdict
  PASS_REGULAR_EXPRESSION "CPU kernels: .*Test is a success! You are ready for your distributed training!"
  ENVIRONMENT "HF_HOME=${CMAKE_CURRENT_BINARY_DIR}/hf_home_empty" TIMEOUT 120)
add_dependencies(test_cli_merge_weights accel_cli)
add_dependencies(test_cli_to_fsdp2 accel_cli)
# Python programs under accel launch: exits 77 (skipped) without python3 / torch / accelerate.
add_dependencies(test_cli_python accel_cli)
set_tests_properties(cli_python PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 600)
