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
# More local processes than the launcher's open-file limit can watch: refused before
# any starts (it failed part-way, "pipe: Too many open files", thousands of workers started).
add_test(NAME cli_launch_too_many_processes
         COMMAND sh -c "ulimit -n 64 && exec sh ${CMAKE_CURRENT_SOURCE_DIR}/expect_exit.sh 1 \"100 processes on this machine need about 116 open files in the launcher (1 each), over its limit of 64 (ulimit -n)\" $<TARGET_FILE:accel_cli> launch --num_processes 100 /bin/true")
set_tests_properties(cli_launch_too_many_processes PROPERTIES TIMEOUT 60)
# A low limit that still holds the launcher's own descriptors (about 9, measured) and the worker's: runs (32 for
# the launcher refused every launch under ulimit -n 32, telling a single process to start fewer); under it,
# refused with the one thing to do
add_test(NAME cli_launch_low_open_file_limit
         COMMAND sh -c "ulimit -n 24 && exec sh ${CMAKE_CURRENT_SOURCE_DIR}/expect_exit.sh 0 launched $<TARGET_FILE:accel_cli> launch -q --num_processes 2 --tee 3 /bin/echo launched")
add_test(NAME cli_launch_open_file_limit_one_process
         COMMAND sh -c "ulimit -n 12 && exec sh ${CMAKE_CURRENT_SOURCE_DIR}/expect_exit.sh 1 \"1 processes on this machine need about 17 open files in the launcher (1 each), over its limit of 12 (ulimit -n): raise the limit\" $<TARGET_FILE:accel_cli> launch -q --num_processes 1 /bin/true")
set_tests_properties(cli_launch_low_open_file_limit cli_launch_open_file_limit_one_process PROPERTIES TIMEOUT 60)
add_dependencies(test_cli_merge_weights accel_cli)
add_dependencies(test_cli_to_fsdp2 accel_cli)
# Python programs under accel launch: exits 77 (skipped) without python3 / torch / accelerate.
add_dependencies(test_cli_python accel_cli)
set_tests_properties(cli_python PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 600)
add_dependencies(test_cli_test_scratch accel_cli)
# `accel config` without HOME: the home directory comes from the passwd
# entry, which this LD_PRELOAD shim's getpwuid gives as $ACCEL_TEST_PW_DIR.
add_library(passwd_shim MODULE ${CMAKE_CURRENT_SOURCE_DIR}/passwd_shim.c)
add_dependencies(test_cli_config passwd_shim)
set_property(TEST cli_config APPEND PROPERTY ENVIRONMENT "ACCEL_TEST_PASSWD_SHIM=$<TARGET_FILE:passwd_shim>")
