# ZeRO-1/2 through the launcher: flags, a config file and DeepSpeed JSON files
# reach the library, which shards (the program prints the stage and shard it
# sees) and matches DDP done by hand. 66 parameters: padded to 128 on 2
# processes (shards of 64), 144 on 3 (48).
if(TARGET accel_cli)
  set(_z "$<TARGET_FILE:accel_cli>;launch;--main_process_port;0")
  set(_zd "${CMAKE_CURRENT_SOURCE_DIR}/data/zero")
  set(_zp $<TARGET_FILE:test_accelerator_zero>)
  add_test(NAME accelerator_zero2_2 COMMAND ${_z} --num_processes 2 --use_deepspeed --zero_stage 2 ${_zp})
  add_test(NAME accelerator_zero1_3 COMMAND ${_z} --num_processes 3 --use_deepspeed --zero_stage 1 ${_zp})
  add_test(NAME accelerator_zero2_3 COMMAND ${_z} --num_processes 3 --use_deepspeed --zero_stage 2 ${_zp})
  add_test(NAME accelerator_zero_fsdp_2
           COMMAND ${_z} --num_processes 2 --use_fsdp --fsdp_sharding_strategy SHARD_GRAD_OP ${_zp})
  add_test(NAME accelerator_zero_cfg_2 COMMAND ${_z} --config_file ${_zd}/zero1.yaml ${_zp})
  add_test(NAME accelerator_zero_dsjson_2
           COMMAND ${_z} --num_processes 2 --deepspeed_config_file ${_zd}/ds_zero2_accum.json ${_zp})
  add_test(NAME accelerator_zero_seed_json_2
           COMMAND ${_z} --num_processes 2 --config_file ${_zd}/ds_seed_workflow3.json ${_zp})
  set(_zfail "FAIL|[1-9][0-9]* failed|error:")
  foreach(t zero2_2:2:2:64:128:no:1:0 zero1_3:1:3:48:144:no:1:0 zero2_3:2:3:48:144:no:1:0
            zero_fsdp_2:2:2:64:128:no:1:0 zero_cfg_2:1:2:64:128:no:1:0 zero_dsjson_2:2:2:64:128:bf16:2:1
            zero_seed_json_2:2:2:64:128:bf16:1:0)
    string(REPLACE ":" ";" f "${t}")
    list(GET f 0 name)
    list(GET f 1 stage)
    list(GET f 2 world)
    list(GET f 3 shard)
    list(GET f 4 padded)
    list(GET f 5 mp)
    list(GET f 6 accum)
    list(GET f 7 clip)
    set_tests_properties(accelerator_${name} PROPERTIES TIMEOUT 120
      ENVIRONMENT "OMP_NUM_THREADS=1;ACCEL_DIST_TIMEOUT=60"
      PASS_REGULAR_EXPRESSION "zero_stage=${stage} world=${world} shard=${shard} padded=${padded} state_floats=[0-9]+/132 mp=${mp} accum=${accum} clip=${clip}\n.*0 failed"
      FAIL_REGULAR_EXPRESSION "${_zfail}")
  endforeach()
  # HYBRID_SHARD_ZERO2 on two "machines" over loopback (2 processes each):
  # shards of 64 (this machine's 2 ranks), not 32 (all 4); equal to DDP.
  add_test(NAME accelerator_zero_hybrid_2x2
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/run_two_machines.sh $<TARGET_FILE:accel_cli>
                   --use_fsdp --fsdp_sharding_strategy HYBRID_SHARD_ZERO2 ${_zp})
  set_tests_properties(accelerator_zero_hybrid_2x2 PROPERTIES TIMEOUT 180 ENVIRONMENT "ACCEL_DIST_TIMEOUT=60"
    PASS_REGULAR_EXPRESSION "zero_stage=2 world=4 shard=64 padded=128 state_floats=[0-9]+/132 mp=no accum=1 clip=0\n"
    FAIL_REGULAR_EXPRESSION "${_zfail}|machine [01] failed")
  # ... with one process a machine: shards over one rank (the whole buffer),
  # only replicas: the gradients averaged in place, no shard kept beside them.
  add_test(NAME accelerator_zero_hybrid_2x1
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/run_two_machines.sh $<TARGET_FILE:accel_cli>
                   --use_fsdp --fsdp_sharding_strategy HYBRID_SHARD_ZERO2 ${_zp})
  set_tests_properties(accelerator_zero_hybrid_2x1 PROPERTIES TIMEOUT 180
    ENVIRONMENT "ACCEL_DIST_TIMEOUT=60;TWO_MACHINES_PROCESSES=2"
    PASS_REGULAR_EXPRESSION "zero_stage=2 world=2 shard=128 padded=128 state_floats=[0-9]+/132 mp=no accum=1 clip=0\n"
    FAIL_REGULAR_EXPRESSION "${_zfail}|machine [01] failed")
endif()

# The seed's workflow 3: bf16 + ZeRO-2 + accumulation 4 on 2 processes
# (100 parameters at 16-element alignment end at 145, padded to 160: shards of 80).
if(TARGET accel_cli)
  add_test(NAME example_zero_training_2
           COMMAND $<TARGET_FILE:accel_cli> launch --main_process_port 0 --num_processes 2 $<TARGET_FILE:zero_training>)
  set_tests_properties(example_zero_training_2 PROPERTIES TIMEOUT 60 ENVIRONMENT "OMP_NUM_THREADS=1"
    PASS_REGULAR_EXPRESSION "^zero_stage=2 mixed_precision=bf16 accumulation=4 shard=80/160 final_loss=0\\.[0-9][0-9][0-9][0-9]\n$")
endif()
