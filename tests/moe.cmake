# Mixtures of experts through the launcher (tests/test_accelerator_moe.c):
# Mixtral, Qwen3-MoE and Mixtral with its load-balancing loss train as DDP
# by hand while an expert runs on one rank and not on another, under DDP,
# ZeRO-1, ZeRO-2, ZeRO-3 / FSDP, bf16 and accumulation; save_state /
# load_state mid-run resume bit for bit.
if(TARGET accel_cli)
  set(_moe "$<TARGET_FILE:accel_cli>;launch;--main_process_port;0;--num_processes;2")
  set(_moep $<TARGET_FILE:test_accelerator_moe>)
  add_test(NAME accelerator_moe_ddp_2 COMMAND ${_moe} ${_moep})
  add_test(NAME accelerator_moe_ddp_accum_2 COMMAND ${_moe} --gradient_accumulation_steps 2 ${_moep})
  add_test(NAME accelerator_moe_zero1_2 COMMAND ${_moe} --use_deepspeed --zero_stage 1 ${_moep})
  add_test(NAME accelerator_moe_zero2_2 COMMAND ${_moe} --use_deepspeed --zero_stage 2 ${_moep})
  add_test(NAME accelerator_moe_zero2_bf16_accum_2
           COMMAND ${_moe} --use_deepspeed --zero_stage 2 --mixed_precision bf16 --gradient_accumulation_steps 2 ${_moep})
  add_test(NAME accelerator_moe_fsdp_2 COMMAND ${_moe} --use_fsdp ${_moep})
  add_test(NAME accelerator_moe_fsdp_bf16_2 COMMAND ${_moe} --use_fsdp --mixed_precision bf16 ${_moep})
  add_test(NAME accelerator_moe_zero3_accum_2
           COMMAND ${_moe} --use_deepspeed --zero_stage 3 --gradient_accumulation_steps 2 ${_moep})
  add_test(NAME accelerator_moe_ddp_bf16_2 COMMAND ${_moe} --mixed_precision bf16 ${_moep})
  # name:stage:mp:accum
  foreach(t ddp_2:0:no:1 ddp_accum_2:0:no:2 zero1_2:1:no:1 zero2_2:2:no:1 zero2_bf16_accum_2:2:bf16:2
            fsdp_2:3:no:1 fsdp_bf16_2:3:bf16:1 zero3_accum_2:3:no:2 ddp_bf16_2:0:bf16:1)
    string(REPLACE ":" ";" f "${t}")
    list(GET f 0 name)
    list(GET f 1 stage)
    list(GET f 2 mp)
    list(GET f 3 accum)
    set_tests_properties(accelerator_moe_${name} PROPERTIES TIMEOUT 180
      ENVIRONMENT "OMP_NUM_THREADS=1;ACCEL_DIST_TIMEOUT=60"
      PASS_REGULAR_EXPRESSION "moe world=2 stage=${stage} mp=${mp} accum=${accum}\n"
      FAIL_REGULAR_EXPRESSION "FAIL|[1-9][0-9]* failed|error:")
  endforeach()
endif()
