# ZeRO-3 / FSDP FULL_SHARD through the launcher: FULL_SHARD training equals
# DDP by hand (losses and final weights) on 2, 3 and 4 processes, with
# accumulation, clipping, bf16 autocast and each prefetch/reshard setting.
if(TARGET accel_cli)
  set(_z3 "$<TARGET_FILE:accel_cli>;launch;--main_process_port;0")
  set(_z3p $<TARGET_FILE:test_accelerator_zero3>)
  add_test(NAME accelerator_zero3_fsdp_2 COMMAND ${_z3} --num_processes 2 --use_fsdp ${_z3p})
  add_test(NAME accelerator_zero3_ds_accum_3
           COMMAND ${_z3} --num_processes 3 --deepspeed_config_file ${CMAKE_CURRENT_SOURCE_DIR}/data/zero/ds_zero3_accum.json ${_z3p})
  add_test(NAME accelerator_zero3_flag_3
           COMMAND ${_z3} --num_processes 3 --use_deepspeed --zero_stage 3 --gradient_accumulation_steps 2 ${_z3p})
  add_test(NAME accelerator_zero3_bf16_clip_4
           COMMAND ${_z3} --num_processes 4 --use_fsdp --fsdp_sharding_strategy FULL_SHARD --mixed_precision bf16 ${_z3p})
  add_test(NAME accelerator_zero3_noreshard_2 COMMAND ${_z3} --num_processes 2 --use_fsdp ${_z3p})
  # Accelerate's fsdp_config YAML keys reach the library through the launcher
  add_test(NAME accelerator_zero3_cfg_2
           COMMAND ${_z3} --config_file ${CMAKE_CURRENT_SOURCE_DIR}/data/zero/fsdp_full_shard.yaml ${_z3p})
  # fsdp_activation_checkpointing: the decoder layers recompute in backward,
  # equal to DDP and bit-identical to FULL_SHARD without it (f32, bf16)
  add_test(NAME accelerator_zero3_actckpt_2
           COMMAND ${_z3} --num_processes 2 --use_fsdp --fsdp_activation_checkpointing true ${_z3p})
  add_test(NAME accelerator_zero3_actckpt_bf16_2
           COMMAND ${_z3} --num_processes 2 --use_fsdp --fsdp_activation_checkpointing true --mixed_precision bf16 ${_z3p})
  set(_z3env "OMP_NUM_THREADS=1;ACCEL_DIST_TIMEOUT=60")
  # name:world:mp:accum:clip:wrap:fwd_prefetch:bwd_prefetch:reshard:activation_checkpointing:extra environment
  foreach(t fsdp_2:2:no:1:0:0:0:1:1:0: ds_accum_3:3:no:2:0:0:0:1:1:0: flag_3:3:no:2:0:0:0:1:1:0:
            bf16_clip_4:4:bf16:1:0.05:0:1:1:1:0:ACCEL_GRADIENT_CLIPPING=0.05,ACCEL_FSDP_FORWARD_PREFETCH=true
            noreshard_2:2:no:1:0:0:0:0:0:0:ACCEL_FSDP_RESHARD_AFTER_FORWARD=false,ACCEL_FSDP_BACKWARD_PREFETCH=NO_PREFETCH
            cfg_2:2:no:1:0:1:1:0:0:0: actckpt_2:2:no:1:0:0:0:1:1:1: actckpt_bf16_2:2:bf16:1:0:0:0:1:1:1:)
    string(REPLACE ":" ";" f "${t}")
    list(GET f 0 name)
    list(GET f 1 world)
    list(GET f 2 mp)
    list(GET f 3 accum)
    list(GET f 4 clip)
    list(GET f 5 wrap)
    list(GET f 6 fwd)
    list(GET f 7 bwd)
    list(GET f 8 reshard)
    list(GET f 9 ckpt)
    list(GET f 10 extra)
    string(REPLACE "," ";" extra "${extra}")
    set_tests_properties(accelerator_zero3_${name} PROPERTIES TIMEOUT 180
      ENVIRONMENT "${_z3env};${extra}"
      PASS_REGULAR_EXPRESSION "zero3 world=${world} mp=${mp} accum=${accum} clip=${clip} wrap=${wrap} fwd_prefetch=${fwd} bwd_prefetch=${bwd} reshard=${reshard} persist=0 ckpt=${ckpt} shard_world=${world}\n"
      FAIL_REGULAR_EXPRESSION "FAIL|[1-9][0-9]* failed|error:")
  endforeach()
endif()

# DeepSpeed's stage3_param_persistence_threshold: the Llama's norms stay gathered.
if(TARGET accel_cli)
  add_test(NAME accelerator_zero3_ds_persist_2
           COMMAND ${_z3} --num_processes 2 --deepspeed_config_file ${CMAKE_CURRENT_SOURCE_DIR}/data/zero/ds_zero3_persist.json ${_z3p})
  set_tests_properties(accelerator_zero3_ds_persist_2 PROPERTIES TIMEOUT 180 ENVIRONMENT "${_z3env}"
    PASS_REGULAR_EXPRESSION "zero3 world=2 mp=no accum=1 clip=0 wrap=0 fwd_prefetch=0 bwd_prefetch=1 reshard=1 persist=20 ckpt=0 shard_world=2\n"
    FAIL_REGULAR_EXPRESSION "FAIL|[1-9][0-9]* failed|error:")
endif()

# The prefetch schedule: DeepSpeed's stage3_prefetch_bucket_size (0: off; 2000
# elements: only the small units of test_prefetch_schedule; large: all) and
# FSDP's BACKWARD_POST (the next unit's gather once the current unit's
# gradients exist); each run equals DDP, and ZERO3_WANT_PREFETCH names the
# schedule the test must observe, so a setting the library ignored fails.
if(TARGET accel_cli)
  set(_z3data ${CMAKE_CURRENT_SOURCE_DIR}/data/zero)
  # name:launcher arguments (commas between them):expected schedule:post:bucket
  foreach(t bucket0_2:--deepspeed_config_file,${_z3data}/ds_zero3_bucket_0.json:pre,0:0:0
            bucket_small_2:--deepspeed_config_file,${_z3data}/ds_zero3_bucket_small.json:pre,2000:0:2000
            bucket_large_2:--deepspeed_config_file,${_z3data}/ds_zero3_bucket_large.json:pre,500000000:0:500000000
            bwd_post_2:--use_fsdp,--fsdp_backward_prefetch,BACKWARD_POST:post,-1:1:-1)
    string(REPLACE ":" ";" f "${t}")
    list(GET f 0 name)
    list(GET f 1 args)
    list(GET f 2 want)
    list(GET f 3 post)
    list(GET f 4 bucket)
    string(REPLACE "," ";" args "${args}")
    string(REPLACE "," ":" want "${want}")
    add_test(NAME accelerator_zero3_${name} COMMAND ${_z3} --num_processes 2 ${args} ${_z3p})
    set_tests_properties(accelerator_zero3_${name} PROPERTIES TIMEOUT 180
      ENVIRONMENT "${_z3env};ZERO3_WANT_PREFETCH=${want}"
      PASS_REGULAR_EXPRESSION "zero3 world=2 mp=no accum=1 clip=0 wrap=0 fwd_prefetch=0 bwd_prefetch=1 reshard=1 persist=0 ckpt=0 shard_world=2\nzero3 prefetch post=${post} bucket=${bucket}\n"
      FAIL_REGULAR_EXPRESSION "FAIL|[1-9][0-9]* failed|error:")
  endforeach()
endif()

# fsdp_config values accel does not implement are refused by the library, named.
if(TARGET accel_cli)
  add_test(NAME accelerator_zero3_local_sd_refused
           COMMAND ${_z3} --quiet --num_processes 2 --use_fsdp --fsdp_state_dict_type LOCAL_STATE_DICT ${_z3p})
  set_tests_properties(accelerator_zero3_local_sd_refused PROPERTIES TIMEOUT 60 ENVIRONMENT "OMP_NUM_THREADS=1"
    PASS_REGULAR_EXPRESSION "fsdp_state_dict_type=LOCAL_STATE_DICT is not implemented by accel")
  add_test(NAME accelerator_zero2_sharded_sd_refused
           COMMAND ${_z3} --quiet --num_processes 2 --use_fsdp --fsdp_sharding_strategy SHARD_GRAD_OP
                   --fsdp_state_dict_type SHARDED_STATE_DICT ${_z3p})
  set_tests_properties(accelerator_zero2_sharded_sd_refused PROPERTIES TIMEOUT 60 ENVIRONMENT "OMP_NUM_THREADS=1"
    PASS_REGULAR_EXPRESSION "SHARDED_STATE_DICT shards the checkpoints of FULL_SHARD")
endif()

# Checkpoints under FULL_SHARD (tests/test_accelerator_zero3_checkpoint.c):
# SHARDED_STATE_DICT and FULL_STATE_DICT resume bit for bit on the same world
# size, save_model equals DDP's byte for byte, bad checkpoints are named; then
# a checkpoint saved on N processes resumes on M (resharded at load), and
# `accel merge-weights` turns it into a Hugging Face model.
if(TARGET accel_cli)
  set(_z3c $<TARGET_FILE:test_accelerator_zero3_checkpoint>)
  set(_z3cfail "FAIL|[1-9][0-9]* failed|error:")
  add_test(NAME accelerator_zero3_checkpoint_2
           COMMAND ${_z3} --num_processes 2 --use_fsdp --fsdp_state_dict_type SHARDED_STATE_DICT ${_z3c})
  add_test(NAME accelerator_zero3_checkpoint_3 COMMAND ${_z3} --num_processes 3 --use_fsdp ${_z3c})
  foreach(t 2:3 4:2)
    string(REPLACE ":" ";" f "${t}")
    list(GET f 0 from)
    list(GET f 1 to)
    set(_d ${CMAKE_CURRENT_BINARY_DIR}/zero3_ckpt_${from}_to_${to})
    add_test(NAME accelerator_zero3_ckpt_save_${from}_for_${to}
             COMMAND ${_z3} --num_processes ${from} --use_fsdp ${_z3c} save ${_d})
    add_test(NAME accelerator_zero3_ckpt_resume_${from}_on_${to}
             COMMAND ${_z3} --num_processes ${to} --use_fsdp ${_z3c} resume ${_d})
    add_test(NAME accelerator_zero3_ckpt_merge_${from}
             COMMAND accel_cli merge-weights ${_d}/ckpt ${_d}/merged)
    set_tests_properties(accelerator_zero3_ckpt_save_${from}_for_${to} PROPERTIES FIXTURES_SETUP z3ckpt_${from}_${to})
    set_tests_properties(accelerator_zero3_ckpt_resume_${from}_on_${to} accelerator_zero3_ckpt_merge_${from}
                         PROPERTIES FIXTURES_REQUIRED z3ckpt_${from}_${to})
    set_tests_properties(accelerator_zero3_ckpt_save_${from}_for_${to} PROPERTIES
      PASS_REGULAR_EXPRESSION "zero3 checkpoint world=${from} shard_world=${from}\n")
    set_tests_properties(accelerator_zero3_ckpt_resume_${from}_on_${to} PROPERTIES
      PASS_REGULAR_EXPRESSION "zero3 checkpoint world=${to} shard_world=${to}\n")
    set_tests_properties(accelerator_zero3_ckpt_merge_${from} PROPERTIES
      PASS_REGULAR_EXPRESSION "Weights merged into .*/merged/model.safetensors \\([0-9]+ tensors\\)")
  endforeach()
  set_tests_properties(accelerator_zero3_checkpoint_2 PROPERTIES PASS_REGULAR_EXPRESSION "zero3 checkpoint world=2 shard_world=2\n")
  set_tests_properties(accelerator_zero3_checkpoint_3 PROPERTIES PASS_REGULAR_EXPRESSION "zero3 checkpoint world=3 shard_world=3\n")
  set_tests_properties(accelerator_zero3_checkpoint_2 accelerator_zero3_checkpoint_3
    accelerator_zero3_ckpt_save_2_for_3 accelerator_zero3_ckpt_resume_2_on_3
    accelerator_zero3_ckpt_save_4_for_2 accelerator_zero3_ckpt_resume_4_on_2
    PROPERTIES TIMEOUT 180 ENVIRONMENT "OMP_NUM_THREADS=1;ACCEL_DIST_TIMEOUT=60" FAIL_REGULAR_EXPRESSION "${_z3cfail}")
endif()

# accel estimate-memory --num_processes: per-rank training memory of each
# sharding strategy (seed config: 85.2M parameters, largest unit 62.5 MB in f32).
if(TARGET accel_cli)
  add_test(NAME zero3_estimate_memory COMMAND accel_cli estimate-memory data/llama_seed_config --num_processes 4
           WORKING_DIRECTORY ${CMAKE_SOURCE_DIR}/tests)
  set_tests_properties(zero3_estimate_memory PROPERTIES PASS_REGULAR_EXPRESSION
    "Training using Adam on 4 processes, per rank.*│    DDP \\(NO_SHARD\\)    │325.08 MB│325.08 MB│650.16 MB│   0 bytes    │ 1.27 GB │\n│        ZeRO-1        │325.08 MB│325.08 MB│162.54 MB│   0 bytes    │ 812.7 MB│\n│ZeRO-2 \\(SHARD_GRAD_OP\\)│325.08 MB│406.35 MB│162.54 MB│   0 bytes    │893.97 MB│\n│ ZeRO-3 \\(FULL_SHARD\\)  │ 81.27 MB│ 81.27 MB│162.54 MB│   250.0 MB   │575.08 MB│")
  # argparse's --option=value spellings (they were "unrecognized arguments")
  add_test(NAME zero3_estimate_memory_equals COMMAND accel_cli estimate-memory data/llama_seed_config --num_processes=4
           --strategy=ZERO3 WORKING_DIRECTORY ${CMAKE_SOURCE_DIR}/tests)
  set_tests_properties(zero3_estimate_memory_equals PROPERTIES PASS_REGULAR_EXPRESSION
    "Training using Adam on 4 processes, per rank.*\n│ZeRO-3 \\(FULL_SHARD\\)│81.27 MB│ 81.27 MB│162.54 MB│   250.0 MB   │575.08 MB│\n└")
  # an on/off flag given a value by "=" is refused as argparse refuses it (the value was taken as the model)
  add_test(NAME zero3_estimate_memory_flag_value_msg COMMAND accel_cli estimate-memory data/llama_seed_config
           --trust_remote_code=1 WORKING_DIRECTORY ${CMAKE_SOURCE_DIR}/tests)
  set_tests_properties(zero3_estimate_memory_flag_value_msg PROPERTIES
    PASS_REGULAR_EXPRESSION "argument --trust_remote_code: ignored explicit argument '1'")
  add_test(NAME zero3_estimate_memory_flag_value_ckpt COMMAND accel_cli estimate-memory data/llama_seed_config
           --activation_checkpointing=true WORKING_DIRECTORY ${CMAKE_SOURCE_DIR}/tests)
  set_tests_properties(zero3_estimate_memory_flag_value_ckpt PROPERTIES
    PASS_REGULAR_EXPRESSION "argument --activation_checkpointing: ignored explicit argument 'true'")
  # --dtypes=int8 is the one value: what follows is positional (argparse's nargs="+" with "=")
  add_test(NAME zero3_estimate_memory_dtypes_equals COMMAND accel_cli estimate-memory data/llama_seed_config
           --dtypes=int8 float16 WORKING_DIRECTORY ${CMAKE_SOURCE_DIR}/tests)
  set_tests_properties(zero3_estimate_memory_dtypes_equals PROPERTIES
    PASS_REGULAR_EXPRESSION "error: unrecognized arguments: float16")
  add_test(NAME zero3_estimate_memory_dtypes_equals_model COMMAND accel_cli estimate-memory --dtypes=int8
           data/llama_seed_config WORKING_DIRECTORY ${CMAKE_SOURCE_DIR}/tests)
  set_tests_properties(zero3_estimate_memory_dtypes_equals_model PROPERTIES
    PASS_REGULAR_EXPRESSION "│ int8│   15.62 MB  │ 65.65 MB │")
  add_test(NAME zero3_estimate_memory_bad_count
           COMMAND accel_cli estimate-memory data/llama_seed_config --num_processes 0 WORKING_DIRECTORY ${CMAKE_SOURCE_DIR}/tests)
  set_tests_properties(zero3_estimate_memory_bad_count PROPERTIES
    PASS_REGULAR_EXPRESSION "argument --num_processes: expected a count >= 1")
endif()

# HYBRID_SHARD on two "machines" over loopback (2 processes each): units
# sharded over a machine's 2 ranks, gradients averaged across the machines;
# training equals DDP over all 4 (f32, and bf16 with bf16 gathers).
if(TARGET accel_cli)
  set(_z3two bash ${CMAKE_CURRENT_SOURCE_DIR}/run_two_machines.sh $<TARGET_FILE:accel_cli>)
  add_test(NAME accelerator_zero3_hybrid_2x2 COMMAND ${_z3two} --use_fsdp --fsdp_sharding_strategy HYBRID_SHARD ${_z3p})
  add_test(NAME accelerator_zero3_hybrid_bf16_2x2
           COMMAND ${_z3two} --use_fsdp --fsdp_sharding_strategy HYBRID_SHARD --mixed_precision bf16 ${_z3p})
  foreach(t hybrid_2x2:no hybrid_bf16_2x2:bf16)
    string(REPLACE ":" ";" f "${t}")
    list(GET f 0 name)
    list(GET f 1 mp)
    set_tests_properties(accelerator_zero3_${name} PROPERTIES TIMEOUT 240 ENVIRONMENT "ACCEL_DIST_TIMEOUT=60"
      PASS_REGULAR_EXPRESSION "zero3 world=4 mp=${mp} accum=1 clip=0 wrap=0 fwd_prefetch=0 bwd_prefetch=1 reshard=1 persist=0 ckpt=0 shard_world=2\n"
      FAIL_REGULAR_EXPRESSION "FAIL|[1-9][0-9]* failed|error:|machine [01] failed")
  endforeach()
endif()

# save_model under stage3_gather_16bit_weights_on_model_save (`--zero3_save_16bit_model`,
# the DeepSpeed JSON key): bf16 / fp16 weights under that mixed precision, the
# masters rounded, one tensor at a time; without it, or without mixed
# precision, the f32 masters. merge-weights of a sharded checkpoint rounded
# gives the same bytes.
if(TARGET accel_cli)
  set(_ds3 ${_z3} --num_processes 2 --use_deepspeed --zero_stage 3)
  # name:expected dtype:launcher arguments (commas between them)
  foreach(t bf16:BF16:--zero3_save_16bit_model,true,--mixed_precision,bf16
            fp16:F16:--zero3_save_16bit_model,true,--mixed_precision,fp16
            off_bf16:F32:--mixed_precision,bf16
            nomp:F32:--zero3_save_16bit_model,true)
    string(REPLACE ":" ";" f "${t}")
    list(GET f 0 name)
    list(GET f 1 dtype)
    list(GET f 2 args)
    string(REPLACE "," ";" args "${args}")
    add_test(NAME accelerator_zero3_save16_${name}_2
             COMMAND ${_ds3} ${args} ${_z3c} save16 ${CMAKE_CURRENT_BINARY_DIR}/zero3_save16_${name} ${dtype})
  endforeach()
  add_test(NAME accelerator_zero3_save16_json_2
           COMMAND ${_z3} --num_processes 2 --deepspeed_config_file ${CMAKE_CURRENT_SOURCE_DIR}/data/zero3/ds_zero3_save16_bf16.json
                   ${_z3c} save16 ${CMAKE_CURRENT_BINARY_DIR}/zero3_save16_json BF16)
  set_tests_properties(accelerator_zero3_save16_bf16_2 accelerator_zero3_save16_fp16_2 accelerator_zero3_save16_off_bf16_2
    accelerator_zero3_save16_nomp_2 accelerator_zero3_save16_json_2 PROPERTIES TIMEOUT 180
    ENVIRONMENT "OMP_NUM_THREADS=1;ACCEL_DIST_TIMEOUT=60" FAIL_REGULAR_EXPRESSION "${_z3cfail}"
    PASS_REGULAR_EXPRESSION "zero3 checkpoint world=2 shard_world=2\n")
endif()

# Checkpoints under HYBRID_SHARD on two "machines" over loopback (2 processes
# each): machine 0's ranks write the shards (the index says shard world 2);
# the whole checkpoint suite on that topology (bit-for-bit resumes, save_model
# and merge-weights equal DDP's, bad checkpoints named); a hybrid checkpoint
# resumed on 3 processes under FULL_SHARD and merged, and the 4-process
# FULL_SHARD checkpoint above resumed under HYBRID_SHARD.
if(TARGET accel_cli)
  set(_z3h ${_z3two} --use_fsdp --fsdp_sharding_strategy HYBRID_SHARD ${_z3c})
  set(_dh ${CMAKE_CURRENT_BINARY_DIR}/zero3_ckpt_hybrid_to_3)
  add_test(NAME accelerator_zero3_checkpoint_hybrid_2x2 COMMAND ${_z3h})
  add_test(NAME accelerator_zero3_ckpt_save_hybrid_for_3 COMMAND ${_z3h} save ${_dh})
  add_test(NAME accelerator_zero3_ckpt_resume_hybrid_on_3 COMMAND ${_z3} --num_processes 3 --use_fsdp ${_z3c} resume ${_dh})
  add_test(NAME accelerator_zero3_ckpt_merge_hybrid COMMAND accel_cli merge-weights ${_dh}/ckpt ${_dh}/merged)
  add_test(NAME accelerator_zero3_ckpt_resume_4_on_hybrid
           COMMAND ${_z3h} resume ${CMAKE_CURRENT_BINARY_DIR}/zero3_ckpt_4_to_2)
  set_tests_properties(accelerator_zero3_ckpt_save_hybrid_for_3 PROPERTIES FIXTURES_SETUP z3ckpt_hybrid_3)
  set_tests_properties(accelerator_zero3_ckpt_resume_hybrid_on_3 accelerator_zero3_ckpt_merge_hybrid
                       PROPERTIES FIXTURES_REQUIRED z3ckpt_hybrid_3)
  set_tests_properties(accelerator_zero3_ckpt_resume_4_on_hybrid PROPERTIES FIXTURES_REQUIRED z3ckpt_4_2)
  set_tests_properties(accelerator_zero3_checkpoint_hybrid_2x2 accelerator_zero3_ckpt_save_hybrid_for_3
    accelerator_zero3_ckpt_resume_4_on_hybrid PROPERTIES PASS_REGULAR_EXPRESSION "zero3 checkpoint world=4 shard_world=2\n")
  set_tests_properties(accelerator_zero3_ckpt_resume_hybrid_on_3 PROPERTIES
    PASS_REGULAR_EXPRESSION "zero3 checkpoint world=3 shard_world=3\n")
  set_tests_properties(accelerator_zero3_ckpt_merge_hybrid PROPERTIES
    PASS_REGULAR_EXPRESSION "Weights merged into .*/merged/model.safetensors \\([0-9]+ tensors\\)")
  set_tests_properties(accelerator_zero3_checkpoint_hybrid_2x2 accelerator_zero3_ckpt_save_hybrid_for_3
    accelerator_zero3_ckpt_resume_hybrid_on_3 accelerator_zero3_ckpt_resume_4_on_hybrid PROPERTIES TIMEOUT 300
    ENVIRONMENT "OMP_NUM_THREADS=1;ACCEL_DIST_TIMEOUT=60" FAIL_REGULAR_EXPRESSION "${_z3cfail}|machine [01] failed")
endif()

# FULL_SHARD on a device saves device memory (tests/test_zero3_device_memory.c):
# on hostless:0, between steps a rank holds its shards and no unit's full
# parameters or gradients, a step's peak a few units, the virtual memory's
# pool creates no physical memory after the first step, and steps after the
# first allocate nothing; with the hostless granule and with CUDA's 2 MiB
# (ACCEL_TEST_VM_GRANULE, the _2mib tests).
set_tests_properties(zero3_device_memory PROPERTIES PASS_REGULAR_EXPRESSION "zero3 device memory world=1 ")
add_test(NAME zero3_device_memory_2mib COMMAND test_zero3_device_memory)
set_tests_properties(zero3_device_memory_2mib PROPERTIES TIMEOUT 120
  ENVIRONMENT "OMP_NUM_THREADS=2;ACCEL_TEST_VM_GRANULE=2097152"
  PASS_REGULAR_EXPRESSION "zero3 device memory world=1 params=[0-9]+ B granule=2097152 ")
if(TARGET accel_cli)
  foreach(n 2 3)
    foreach(granule 65536 2097152)
      set(_z3dm zero3_device_memory_${n})
      if(granule EQUAL 2097152)
        set(_z3dm ${_z3dm}_2mib)
      endif()
      add_test(NAME ${_z3dm}
               COMMAND $<TARGET_FILE:accel_cli> launch --main_process_port 0 --num_processes ${n} --use_fsdp
                       $<TARGET_FILE:test_zero3_device_memory>)
      set_tests_properties(${_z3dm} PROPERTIES TIMEOUT 120
        ENVIRONMENT "OMP_NUM_THREADS=1;ACCEL_DIST_TIMEOUT=600;ACCEL_TEST_DEVICES=1;ACCEL_DEFAULT_DEVICE=hostless:0;ACCEL_TEST_VM_GRANULE=${granule}"
        PASS_REGULAR_EXPRESSION "zero3 device memory world=${n} params=[0-9]+ B granule=${granule} "
        FAIL_REGULAR_EXPRESSION "FAIL|[1-9][0-9]* failed|error:")
    endforeach()
  endforeach()
endif()

# FULL_SHARD on a device, the rest (tests/test_zero3_device_offload.c): on
# hostless:0, offload_param cpu/nvme and fsdp_offload_params equal the run
# without offload bit for bit with no shard on the device between steps; bf16
# forms go with their unit; a mapping failed on one rank fails every rank at
# once, naming it (plain: one process; launched: 2). The group's timeout
# (ACCEL_DIST_TIMEOUT) is longer than the test's: a rank that waits it out
# instead of failing at once fails the test.
set_tests_properties(zero3_device_offload PROPERTIES TIMEOUT 180 ENVIRONMENT "OMP_NUM_THREADS=1")
if(TARGET accel_cli)
  add_test(NAME zero3_device_offload_2
           COMMAND $<TARGET_FILE:accel_cli> launch --main_process_port 0 --num_processes 2 --use_fsdp
                   $<TARGET_FILE:test_zero3_device_offload>)
  set_tests_properties(zero3_device_offload_2 PROPERTIES TIMEOUT 240
    ENVIRONMENT "OMP_NUM_THREADS=1;ACCEL_DIST_TIMEOUT=600;ACCEL_TEST_DEVICES=1;ACCEL_DEFAULT_DEVICE=hostless:0"
    PASS_REGULAR_EXPRESSION "offload_param cpu bf16 world=2: "
    FAIL_REGULAR_EXPRESSION "FAIL|[1-9][0-9]* failed|error:")
endif()

# The same on cuda:0 (label gpu; tools/gpu_check.sh runs it, one process and
# two sharing the GPU): skipped (77), with the reason, without a GPU.
add_test(NAME zero3_device_memory_cuda COMMAND test_zero3_device_memory cuda)
set_tests_properties(zero3_device_memory_cuda PROPERTIES LABELS gpu SKIP_RETURN_CODE 77 TIMEOUT 120)
if(ACCEL_CUDA)
  target_include_directories(test_zero3_device_memory PRIVATE ${CUDAToolkit_INCLUDE_DIRS})
endif()
