# test_tracking and test_tracking_faults read TensorBoard records with the generated protobuf-c code.
foreach(t test_tracking test_tracking_faults)
  target_include_directories(${t} PRIVATE ${ACCEL_GEN_DIR})
  target_link_libraries(${t} PRIVATE PkgConfig::PROTOBUF_C)
endforeach()

if(TARGET accel_cli)
  # --log_with / --project_dir and the config keys reach a 2-process job.
  set(TRACKING_LAUNCH_DIR ${CMAKE_CURRENT_BINARY_DIR}/tracking_launch)
  file(WRITE ${CMAKE_CURRENT_BINARY_DIR}/tracking_launch.yaml
       "distributed_type: MULTI_CPU\nnum_processes: 2\nlog_with: csv\nproject_dir: ${TRACKING_LAUNCH_DIR}/cfg\n")
  add_test(NAME tracking_launch_flags
           COMMAND ${CMAKE_COMMAND} -E env HF_HOME=${CMAKE_CURRENT_BINARY_DIR}/hf_home_empty
                   $<TARGET_FILE:accel_cli> launch --num_processes 2 --log_with jsonl,csv
                   --project_dir ${TRACKING_LAUNCH_DIR}/flags $<TARGET_FILE:test_tracking> launched jsonl,csv)
  add_test(NAME tracking_launch_config
           COMMAND ${CMAKE_COMMAND} -E env HF_HOME=${CMAKE_CURRENT_BINARY_DIR}/hf_home_empty
                   $<TARGET_FILE:accel_cli> launch --config_file ${CMAKE_CURRENT_BINARY_DIR}/tracking_launch.yaml
                   $<TARGET_FILE:test_tracking> launched csv)
  set_tests_properties(tracking_launch_flags tracking_launch_config PROPERTIES TIMEOUT 120)
  add_dependencies(test_tracking accel_cli)
endif()
