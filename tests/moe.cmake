# Mixtures of experts through the launcher (tests/test_accelerator_moe.c):
# Mixtral, Qwen3-MoE, Qwen2-MoE and Mixtral with its load-balancing loss train as DDP
# by hand while a layer runs every expert on one rank and leaves some out on
# another, under DDP, ZeRO-1, ZeRO-2, ZeRO-3 / FSDP (activation
# checkpointing too), bf16 and accumulation; save_state / load_state mid-run
# resume bit for bit; ZeRO-3 units inside an expert are refused by name.
if(TARGET accel_cli)
  set(_moe "$<TARGET_FILE:accel_cli>;launch;--main_process_port;0")
  set(_moep $<TARGET_FILE:test_accelerator_moe>)
  # name:world:stage:mp:accum:ckpt:clip:launcher arguments (commas between them); clip from ACCEL_GRADIENT_CLIPPING
  foreach(t ddp_2:2:0:no:1:0:0:
            ddp_accum_2:2:0:no:2:0:0:--gradient_accumulation_steps,2
            ddp_bf16_2:2:0:bf16:1:0:0:--mixed_precision,bf16
            zero1_2:2:1:no:1:0:0:--use_deepspeed,--zero_stage,1
            zero2_2:2:2:no:1:0:0:--use_deepspeed,--zero_stage,2
            zero2_bf16_accum_2:2:2:bf16:2:0:0:--use_deepspeed,--zero_stage,2,--mixed_precision,bf16,--gradient_accumulation_steps,2
            fsdp_2:2:3:no:1:0:0:--use_fsdp
            fsdp_bf16_2:2:3:bf16:1:0:0:--use_fsdp,--mixed_precision,bf16
            zero3_accum_2:2:3:no:2:0:0:--use_deepspeed,--zero_stage,3,--gradient_accumulation_steps,2
            fsdp_actckpt_2:2:3:no:1:1:0:--use_fsdp,--fsdp_activation_checkpointing,true
            fsdp_3:3:3:no:1:0:0:--use_fsdp
            ddp_clip_2:2:0:no:1:0:0.05:
            zero2_clip_2:2:2:no:1:0:0.05:--use_deepspeed,--zero_stage,2
            fsdp_clip_2:2:3:no:1:0:0.05:--use_fsdp)
    string(REPLACE ":" ";" f "${t}")
    list(GET f 0 name)
    list(GET f 1 world)
    list(GET f 2 stage)
    list(GET f 3 mp)
    list(GET f 4 accum)
    list(GET f 5 ckpt)
    list(GET f 6 clip)
    list(LENGTH f nf)
    set(args "")
    if(nf GREATER 7)
      list(GET f 7 args)
      string(REPLACE "," ";" args "${args}")
    endif()
    add_test(NAME accelerator_moe_${name} COMMAND ${_moe} --num_processes ${world} ${args} ${_moep})
    set_tests_properties(accelerator_moe_${name} PROPERTIES TIMEOUT 180
      ENVIRONMENT "OMP_NUM_THREADS=1;ACCEL_DIST_TIMEOUT=60;ACCEL_GRADIENT_CLIPPING=${clip}"
      PASS_REGULAR_EXPRESSION "moe world=${world} stage=${stage} mp=${mp} accum=${accum} ckpt=${ckpt} clip=${clip}\n"
      FAIL_REGULAR_EXPRESSION "FAIL|[1-9][0-9]* failed|error:")
  endforeach()
endif()
