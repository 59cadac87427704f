# A non-Llama family (Qwen2) fine-tuned under FSDP FULL_SHARD on 2 processes
# (and DDP): every step's loss on every rank equals transformers +
# Accelerate's (tests/test_fsdp_peer.c, tools/gen_fsdp_peer_losses.py).
if(TARGET accel_cli)
  set(_fp "$<TARGET_FILE:accel_cli>;launch;--main_process_port;0;--num_processes;2")
  add_test(NAME fsdp_peer_full_shard_2
           COMMAND ${_fp} --use_fsdp --fsdp_sharding_strategy FULL_SHARD
                   --fsdp_auto_wrap_policy TRANSFORMER_BASED_WRAP $<TARGET_FILE:test_fsdp_peer>
           WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR})
  add_test(NAME fsdp_peer_ddp_2 COMMAND ${_fp} $<TARGET_FILE:test_fsdp_peer>
           WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR})
  set_tests_properties(fsdp_peer_full_shard_2 PROPERTIES TIMEOUT 180
    ENVIRONMENT "OMP_NUM_THREADS=1;ACCEL_DIST_TIMEOUT=60"
    PASS_REGULAR_EXPRESSION "fsdp_peer world=2 zero_stage=3 steps=6\n"
    FAIL_REGULAR_EXPRESSION "FAIL|[1-9][0-9]* failed|error:")
  set_tests_properties(fsdp_peer_ddp_2 PROPERTIES TIMEOUT 180
    ENVIRONMENT "OMP_NUM_THREADS=1;ACCEL_DIST_TIMEOUT=60"
    PASS_REGULAR_EXPRESSION "fsdp_peer world=2 zero_stage=0 steps=6\n"
    FAIL_REGULAR_EXPRESSION "FAIL|[1-9][0-9]* failed|error:")
endif()
