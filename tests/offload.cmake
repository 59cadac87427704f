# ZeRO-Offload (tests/test_accelerator_offload.c, which also runs plainly as
# one cpu process): offload_optimizer cpu / nvme and fsdp_offload_params equal
# training without offload on 2 processes, on the cpu (ZeRO-1, -2, -3) and on
# hostless:0 (ZeRO-1, -2, -3; 1 and 2 processes), resume, bounded state memory and
# the named errors; offload_param nvme under ZeRO-3 (cpu); the launcher's flags
# reach the library; a full tmpfs.
if(TARGET accel_cli)
  set(_o "$<TARGET_FILE:accel_cli>;launch;--main_process_port;0")
  set(_op $<TARGET_FILE:test_accelerator_offload>)
  set(_oenv "OMP_NUM_THREADS=1;ACCEL_DIST_TIMEOUT=60")
  set(_ohostless "${_oenv};ACCEL_TEST_DEVICES=1;ACCEL_DEFAULT_DEVICE=hostless:0")
  set(_ofail "FAIL|[1-9][0-9]* failed|error:")
  add_test(NAME accelerator_offload_2 COMMAND ${_o} --num_processes 2 ${_op})
  add_test(NAME accelerator_offload_hostless_1 COMMAND ${_o} --num_processes 1 ${_op})
  add_test(NAME accelerator_offload_hostless_2 COMMAND ${_o} --num_processes 2 ${_op})
  set_tests_properties(accelerator_offload_2 PROPERTIES ENVIRONMENT "${_oenv}")
  set_tests_properties(accelerator_offload_hostless_1 accelerator_offload_hostless_2 PROPERTIES
                       ENVIRONMENT "${_ohostless}")
  set_tests_properties(accelerator_offload_2 accelerator_offload_hostless_1 accelerator_offload_hostless_2 PROPERTIES
                       TIMEOUT 240 PASS_REGULAR_EXPRESSION "0 failed" FAIL_REGULAR_EXPRESSION "${_ofail}")
  # Accelerate's flag names, through the launcher's environment (ZeRO-3 here)
  set(_od ${CMAKE_CURRENT_BINARY_DIR}/offload_flags)
  file(MAKE_DIRECTORY ${_od})
  add_test(NAME accelerator_offload_flags_2
           COMMAND ${_o} --num_processes 2 --use_deepspeed --zero_stage 3 --offload_optimizer_device nvme
                   --offload_optimizer_nvme_path ${_od} ${_op} flags ${_od})
  set_tests_properties(accelerator_offload_flags_2 PROPERTIES TIMEOUT 120 ENVIRONMENT "${_oenv}"
    PASS_REGULAR_EXPRESSION "offload zero_stage=3 state_file_in_dir=1\n" FAIL_REGULAR_EXPRESSION "${_ofail}")
  # offload_param nvme (ZeRO-3): the shard file under the launcher's --offload_param_nvme_path
  add_test(NAME accelerator_offload_param_flags_2
           COMMAND ${_o} --num_processes 2 --use_deepspeed --zero_stage 3 --offload_param_device nvme
                   --offload_param_nvme_path ${_od} ${_op} pflags ${_od})
  set_tests_properties(accelerator_offload_param_flags_2 PROPERTIES TIMEOUT 120 ENVIRONMENT "${_oenv}"
    PASS_REGULAR_EXPRESSION "offload zero_stage=3 shard_file_in_dir=1\n" FAIL_REGULAR_EXPRESSION "${_ofail}")
  # ... and the deepspeed_config: keys of a config file (ZeRO-2 here)
  file(WRITE ${CMAKE_CURRENT_BINARY_DIR}/offload_nvme.yaml
       "distributed_type: DEEPSPEED\nnum_processes: 2\nmixed_precision: 'no'\ndeepspeed_config:\n  zero_stage: 2\n"
       "  offload_optimizer_device: nvme\n  offload_optimizer_nvme_path: ${_od}\n  offload_param_device: none\n")
  add_test(NAME accelerator_offload_cfg_2 COMMAND ${_o} --config_file ${CMAKE_CURRENT_BINARY_DIR}/offload_nvme.yaml ${_op} flags ${_od})
  set_tests_properties(accelerator_offload_cfg_2 PROPERTIES TIMEOUT 120 ENVIRONMENT "${_oenv}"
    PASS_REGULAR_EXPRESSION "offload zero_stage=2 state_file_in_dir=1\n" FAIL_REGULAR_EXPRESSION "${_ofail}")
  add_test(NAME accelerator_offload_enospc
           COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/run_offload_enospc.sh ${CMAKE_CURRENT_BINARY_DIR}/offload_tmpfs ${_op})
  set_tests_properties(accelerator_offload_enospc PROPERTIES TIMEOUT 60 SKIP_RETURN_CODE 77 ENVIRONMENT "${_oenv}"
    PASS_REGULAR_EXPRESSION "0 failed" FAIL_REGULAR_EXPRESSION "${_ofail}")
endif()
