# Error paths of the launcher and the examples: the exit status and the message,
# and under the ASan build no leak (tests/expect_exit.sh: a sanitizer report
# exits 23, not the expected status).
set(_expect sh ${CMAKE_CURRENT_SOURCE_DIR}/expect_exit.sh)
set(_lsan "ASAN_OPTIONS=detect_leaks=1:intercept_tls_get_addr=0:exitcode=23") # the Makefile says why
if(TARGET accel_cli)
  add_test(NAME error_path_launch_needs_secret
           COMMAND ${_expect} 1 "--num_machines 2 needs ACCEL_JOB_SECRET" $<TARGET_FILE:accel_cli> launch
                   --num_machines 2 --machine_rank 0 --num_processes 2 --main_process_ip 127.0.0.1
                   --main_process_port 0 /bin/true)
  set_tests_properties(error_path_launch_needs_secret PROPERTIES
                       ENVIRONMENT "${_lsan};ACCEL_JOB_SECRET=;ACCEL_INSECURE_NO_SECRET=0")
  # prepare fails (no layer class "Nope" to wrap): everything made before is freed
  add_test(NAME error_path_train_linear_prepare COMMAND ${_expect} 1
           "train_linear: accel_accelerator_prepare: fsdp_transformer_layer_cls_to_wrap \"Nope\"" $<TARGET_FILE:train_linear>)
  set_tests_properties(error_path_train_linear_prepare PROPERTIES ENVIRONMENT
                       "${_lsan};ACCEL_ZERO_STAGE=3;ACCEL_FSDP_AUTO_WRAP_POLICY=TRANSFORMER_BASED_WRAP;ACCEL_FSDP_TRANSFORMER_CLS_TO_WRAP=Nope")
endif()
add_test(NAME error_path_generate_max_memory_size
         COMMAND ${_expect} 1 "generate: size 'lots' is not in a valid format" $<TARGET_FILE:generate>
                 ${CMAKE_SOURCE_DIR}/tests/data/hf_llama_basic --max-memory cpu=lots)
add_test(NAME error_path_generate_max_memory_usage
         COMMAND ${_expect} 2 "usage: generate DIR" $<TARGET_FILE:generate>
                 ${CMAKE_SOURCE_DIR}/tests/data/hf_llama_basic --max-memory cpu)
# budgets without a strategy to read them: refused, not dropped without a word
add_test(NAME error_path_generate_max_memory_no_strategy
         COMMAND ${_expect} 2 "generate: --max-memory sets the budgets of a --device-map strategy" $<TARGET_FILE:generate>
                 ${CMAKE_SOURCE_DIR}/tests/data/hf_llama_basic --max-memory cpu=1MB)
add_test(NAME error_path_generate_max_memory_explicit_map
         COMMAND ${_expect} 2 "an explicit map places every weight itself" $<TARGET_FILE:generate>
                 ${CMAKE_SOURCE_DIR}/tests/data/hf_llama_basic --device-map model:cpu,lm_head:cpu --max-memory cpu=1MB)
set_tests_properties(error_path_generate_max_memory_size error_path_generate_max_memory_usage
                     error_path_generate_max_memory_no_strategy error_path_generate_max_memory_explicit_map PROPERTIES
                     ENVIRONMENT "${_lsan}")
# cv_example's numbers read whole: atoi took "1e3" epochs as 1, atof "3e-3x" as 3e-3
add_test(NAME error_path_cv_example_epochs
         COMMAND ${_expect} 2 "usage: cv_example" $<TARGET_FILE:cv_example> 1e3)
add_test(NAME error_path_cv_example_lr
         COMMAND ${_expect} 2 "usage: cv_example" $<TARGET_FILE:cv_example> --sync_bn 1 3e-3x)
set_tests_properties(error_path_cv_example_epochs error_path_cv_example_lr PROPERTIES ENVIRONMENT "${_lsan}")
