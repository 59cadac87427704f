# Accelerator and data layer: multi-process tests under the real launcher, and the
# examples' exact output lines (the project's seed examples 000/001).
# (test_accelerator_*.c and test_data_*.c also run plainly as one process via the glob.)
if(TARGET accel_cli)
  set(_accel_env "OMP_NUM_THREADS=1;ACCEL_DIST_TIMEOUT=60")
  foreach(n 2 3 4)
    add_test(NAME accelerator_ddp_${n}
             COMMAND $<TARGET_FILE:accel_cli> launch --main_process_port 0 --num_processes ${n} $<TARGET_FILE:test_accelerator_ddp>
             WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR})
    set_tests_properties(accelerator_ddp_${n} PROPERTIES TIMEOUT 120 ENVIRONMENT "${_accel_env}")
  endforeach()
  add_test(NAME accelerator_ddp_debug_2
           COMMAND $<TARGET_FILE:accel_cli> launch --main_process_port 0 --debug --num_processes 2 $<TARGET_FILE:test_accelerator_ddp>
           WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR})
  set_tests_properties(accelerator_ddp_debug_2 PROPERTIES TIMEOUT 120 ENVIRONMENT "${_accel_env}")
  # gather_for_metrics under tensor parallelism: over the data-parallel ranks, each sample once.
  add_test(NAME accelerator_metrics_tp_4
           COMMAND $<TARGET_FILE:accel_cli> launch --main_process_port 0 --num_processes 4 --use_parallelism_config
                   --parallelism_config_dp_replicate_size 2 --parallelism_config_tp_size 2
                   $<TARGET_FILE:test_accelerator_metrics> 2
           WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR})
  set_tests_properties(accelerator_metrics_tp_4 PROPERTIES TIMEOUT 120 ENVIRONMENT "${_accel_env}")
  foreach(t bn fp16 checkpoint metrics)
    add_test(NAME accelerator_${t}_2
             COMMAND $<TARGET_FILE:accel_cli> launch --main_process_port 0 --num_processes 2 $<TARGET_FILE:test_accelerator_${t}>
             WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR})
    set_tests_properties(accelerator_${t}_2 PROPERTIES TIMEOUT 120 ENVIRONMENT "${_accel_env}")
  endforeach()

  # The examples print exactly these lines, once (the main process prints).
  set(_loss_line "device=cpu final_loss=[0-9]+\\.[0-9][0-9][0-9][0-9]\n")
  add_test(NAME example_train_linear COMMAND $<TARGET_FILE:train_linear>)
  add_test(NAME example_train_linear_2
           COMMAND $<TARGET_FILE:accel_cli> launch --main_process_port 0 --num_processes 2 --mixed_precision no $<TARGET_FILE:train_linear>)
  add_test(NAME example_train_linear_bf16_2
           COMMAND $<TARGET_FILE:accel_cli> launch --main_process_port 0 --num_processes 2 --mixed_precision bf16 $<TARGET_FILE:train_linear>)
  foreach(t example_train_linear example_train_linear_2 example_train_linear_bf16_2)
    set_tests_properties(${t} PROPERTIES TIMEOUT 60 ENVIRONMENT "${_accel_env}"
                         PASS_REGULAR_EXPRESSION "^${_loss_line}$")
  endforeach()
  add_test(NAME example_prepare_forward COMMAND $<TARGET_FILE:prepare_forward>)
  set_tests_properties(example_prepare_forward PROPERTIES TIMEOUT 60
                       PASS_REGULAR_EXPRESSION "^device=cpu\nshape=\\[1, 1\\]\n$")
  # The README's other examples, as it runs them: each trains to a loss
  # under 0.1 (custom_module's logged steps; the two processes' halves of the
  # data; fp16 with its loss scale, no step skipped).
  set(_launch2 $<TARGET_FILE:accel_cli> launch --main_process_port 0 --num_processes 2)
  add_test(NAME example_custom_module COMMAND $<TARGET_FILE:custom_module>)
  add_test(NAME example_four_lines COMMAND $<TARGET_FILE:four_lines>)
  add_test(NAME example_four_lines_2 COMMAND ${_launch2} $<TARGET_FILE:four_lines>)
  add_test(NAME example_mixed_precision COMMAND $<TARGET_FILE:mixed_precision>)
  add_test(NAME example_mixed_precision_fp16_2 COMMAND ${_launch2} --mixed_precision fp16 $<TARGET_FILE:mixed_precision>)
  add_test(NAME example_grad_accumulation COMMAND $<TARGET_FILE:grad_accumulation>)
  add_test(NAME example_grad_accumulation_2 COMMAND ${_launch2} $<TARGET_FILE:grad_accumulation>)
  set(_example_out
      example_custom_module "step 300  loss 0\\.0[0-9]+\n.*fc2\\.bias +\\[1\\]\n"
      example_four_lines "^processes=1 mean_loss=[0-9]+\\.[0-9]+\n$"
      example_four_lines_2 "^processes=2 mean_loss=[0-9]+\\.[0-9]+\n$"
      example_mixed_precision "^mixed_precision=no steps=80 skipped=0 loss_scale=1 final_loss=0\\.0[0-9]+\n$"
      example_mixed_precision_fp16_2 "^mixed_precision=fp16 steps=40 skipped=0 loss_scale=65536 final_loss=0\\.0[0-9]+\n$"
      example_grad_accumulation "^accumulation_steps=4 micro_batches=120 optimizer_steps=30 lr=[0-9.]+ final_loss=0\\.0[0-9]+\n$"
      example_grad_accumulation_2 "^accumulation_steps=4 micro_batches=60 optimizer_steps=15 lr=[0-9.]+ final_loss=0\\.0[0-9]+\n$")
  while(_example_out)
    list(POP_FRONT _example_out _t _re)
    set_tests_properties(${_t} PROPERTIES TIMEOUT 60 ENVIRONMENT "${_accel_env}" PASS_REGULAR_EXPRESSION "${_re}")
  endwhile()
  add_test(NAME example_gather_2
           COMMAND $<TARGET_FILE:accel_cli> launch --main_process_port 0 --num_processes 2 $<TARGET_FILE:gather>)
  set_tests_properties(example_gather_2 PROPERTIES TIMEOUT 60 ENVIRONMENT "${_accel_env}"
                       PASS_REGULAR_EXPRESSION "^world=2\ndevice=cpu\ngathered=\\[1, 2, 3, 1, 2, 3\\]\n$")
endif()

# Kill a 2-process run after step 12 (last checkpoint at step 10), resume it, and
# compare its final line with an uninterrupted run's.
if(TARGET accel_cli)
  set(_cr "${CMAKE_CURRENT_BINARY_DIR}/checkpoint_resume_run")
  add_test(NAME example_checkpoint_resume_2
           COMMAND sh -c "rm -rf '${_cr}' && mkdir -p '${_cr}' && \
L='$<TARGET_FILE:accel_cli> launch --quiet --main_process_port 0 --num_processes 2' && P='$<TARGET_FILE:checkpoint_resume>' && \
{ $L $P '${_cr}/a' 20 12 >/dev/null 2>&1; test $? -ne 0; } && \
$L $P '${_cr}/a' 20 2>/dev/null | grep -v saved > '${_cr}/resumed.txt' && \
$L $P '${_cr}/b' 20 2>/dev/null | grep final_loss > '${_cr}/straight.txt' && \
grep -q 'resumed at step 10' '${_cr}/resumed.txt' && grep final_loss '${_cr}/resumed.txt' | cmp - '${_cr}/straight.txt' && \
cat '${_cr}/straight.txt'")
  set_tests_properties(example_checkpoint_resume_2 PROPERTIES TIMEOUT 60 ENVIRONMENT "OMP_NUM_THREADS=1"
                       PASS_REGULAR_EXPRESSION "step=20 final_loss=")
endif()

# The examples' arguments are read whole ("abc" was 0 steps, "12x" 12, "3x" 3 epochs; " 4" and "+20", which
# strtoll takes, are refused as by the CLI) and extra ones refused,
# before any file is read: prog|words of the error|args.
foreach(bad "checkpoint_resume|usage: checkpoint_resume|run;abc" "checkpoint_resume|usage: checkpoint_resume|run;20;12x"
            "grad_accumulation|usage: grad_accumulation|abc"
            "grad_accumulation|usage: grad_accumulation| 4" "grad_accumulation|usage: grad_accumulation|4 "
            "checkpoint_resume|usage: checkpoint_resume|run;+20"
            "finetune|STEPS must be an integer|M;I;O;12x" "finetune|STEPS must be an integer|M;I;O;5;1e-4x"
            "finetune|usage: finetune|M;I;O;5;1e-4;extra"
            "nlp_example|EPOCHS and BATCH must be integers|T;M;3x"
            "nlp_example|EPOCHS and BATCH must be integers|T;M;3;2e-5;16;4.5"
            "nlp_example|usage: nlp_example|T;M;3;2e-5;16;42;extra")
  string(REPLACE "|" ";" parts "${bad}")
  list(GET parts 0 prog)
  list(GET parts 1 words)
  list(SUBLIST parts 2 -1 args)
  string(JOIN "_" name ${args})
  string(REGEX REPLACE "[^A-Za-z0-9_]" "_" name "${name}")
  add_test(NAME example_${prog}_bad_args_${name}
           COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/expect_exit.sh 2 "${words}" $<TARGET_FILE:${prog}> ${args}
           WORKING_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR})
  set_tests_properties(example_${prog}_bad_args_${name} PROPERTIES TIMEOUT 60)
endforeach()
# A subnormal LR is a number > 0 (Python's float() reads it): read, the run goes on to the missing model
# (strtod's ERANGE on underflow refused it, saying the LR must be > 0)
add_test(NAME example_finetune_subnormal_lr
         COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/expect_exit.sh 1 "finetune: M: no such file" $<TARGET_FILE:finetune>
                 M I O 5 1e-320
         WORKING_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR})
set_tests_properties(example_finetune_subnormal_lr PROPERTIES TIMEOUT 60)

# A few Llama steps on 2 processes (byte-level, bf16): the progress bar, TensorBoard logs and the save.
if(TARGET accel_cli)
  add_test(NAME example_train_llama_2
           COMMAND $<TARGET_FILE:accel_cli> launch --main_process_port 0 --num_processes 2 --mixed_precision bf16
                   $<TARGET_FILE:train_llama> ${CMAKE_SOURCE_DIR}/docs/CONVENTIONS.md 3
           WORKING_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR})
  set_tests_properties(example_train_llama_2 PROPERTIES TIMEOUT 120 ENVIRONMENT "OMP_NUM_THREADS=1"
                       PASS_REGULAR_EXPRESSION "train: 100%\\|##########\\| 3/3 \\[[0-9:]+<00:00, [0-9.]+it/s, loss=[0-9.]+, tok/s=[0-9]+\\]\nfinal_loss=[0-9.]+ saved llama_out/\n$")
endif()

# The same program, unchanged, under tensor parallelism (with Megatron's sequence
# parallelism) and context parallelism, configured by launch flags only (each
# section with its --use_* flag: without it the section is ignored, as in
# Accelerate), ending at one process's loss; and under pipeline parallelism its
# accel_accelerator_backward is refused naming pipeline_step.
if(TARGET accel_cli)
  foreach(mesh "tp;--use_megatron_lm;--megatron_lm_tp_degree;2;--megatron_lm_sequence_parallelism;true"
               "cp;--use_parallelism_config;--parallelism_config_cp_size;2;--parallelism_config_cp_comm_strategy;alltoall")
    list(GET mesh 0 name)
    list(SUBLIST mesh 1 -1 flags)
    add_test(NAME example_train_llama_${name}_2
             COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/test_train_llama_mesh.sh $<TARGET_FILE:accel_cli>
                     $<TARGET_FILE:train_llama> ${CMAKE_SOURCE_DIR}/docs/CONVENTIONS.md
                     ${CMAKE_CURRENT_BINARY_DIR}/train_llama_${name} ${flags})
    set_tests_properties(example_train_llama_${name}_2 PROPERTIES TIMEOUT 120 ENVIRONMENT "OMP_NUM_THREADS=1"
                         PASS_REGULAR_EXPRESSION "train-llama-mesh-ok")
  endforeach()
  add_test(NAME example_train_llama_pp_refused_2
           COMMAND $<TARGET_FILE:accel_cli> launch --main_process_port 0 --num_processes 2 --use_megatron_lm
                   --megatron_lm_pp_degree 2 --megatron_lm_num_micro_batches 2
                   $<TARGET_FILE:train_llama> ${CMAKE_SOURCE_DIR}/docs/CONVENTIONS.md 3
           WORKING_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR})
  set_tests_properties(example_train_llama_pp_refused_2 PROPERTIES TIMEOUT 120 ENVIRONMENT "OMP_NUM_THREADS=1"
                       PASS_REGULAR_EXPRESSION "train_llama: accel_llama_forward: the model holds only pipeline stage [01] of 2 .*train it with accel_accelerator_pipeline_step")
endif()

# The Accelerator on a device the host cannot address (hostless:0, src/backends/hostless):
# DDP and ZeRO-1/2/3 on 2 and 3 processes equal to one cpu process, collectives,
# checkpoint resume, the refusal of parameter offload.
if(TARGET accel_cli)
  foreach(n 2 3)
    add_test(NAME accelerator_device_hostless_${n}
             COMMAND $<TARGET_FILE:accel_cli> launch --main_process_port 0 --num_processes ${n} $<TARGET_FILE:test_accelerator_device>
             WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR})
    set_tests_properties(accelerator_device_hostless_${n} PROPERTIES TIMEOUT 120
      ENVIRONMENT "OMP_NUM_THREADS=1;ACCEL_DIST_TIMEOUT=60;ACCEL_TEST_DEVICES=1;ACCEL_DEFAULT_DEVICE=hostless:0")
  endforeach()
  # ZeRO-3's schedule settings on the device: forward prefetch + BACKWARD_POST, and no reshard + no prefetch.
  foreach(t prefetch:ACCEL_FSDP_FORWARD_PREFETCH=true,ACCEL_FSDP_BACKWARD_PREFETCH=BACKWARD_POST
            noreshard:ACCEL_FSDP_RESHARD_AFTER_FORWARD=false,ACCEL_FSDP_BACKWARD_PREFETCH=NO_PREFETCH)
    string(REPLACE ":" ";" f "${t}")
    list(GET f 0 name)
    list(GET f 1 extra)
    string(REPLACE "," ";" extra "${extra}")
    add_test(NAME accelerator_device_hostless_${name}_2
             COMMAND $<TARGET_FILE:accel_cli> launch --main_process_port 0 --num_processes 2 $<TARGET_FILE:test_accelerator_device>
             WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR})
    set_tests_properties(accelerator_device_hostless_${name}_2 PROPERTIES TIMEOUT 120
      ENVIRONMENT "OMP_NUM_THREADS=1;ACCEL_DIST_TIMEOUT=60;ACCEL_TEST_DEVICES=1;ACCEL_DEFAULT_DEVICE=hostless:0;${extra}")
  endforeach()
endif()

# TEST under `accel launch --num_processes 2`, 60 s, with ENV (one process group's settings);
# HOSTLESS: on the hostless test device (ACCEL_DEFAULT_DEVICE=hostless:0), else on the cpu;
# further arguments: more VAR=value settings.
function(accel_launch2_test name bin hostless)
  set(env "OMP_NUM_THREADS=1;ACCEL_DIST_TIMEOUT=30")
  if(ARGN)
    set(env "${env};${ARGN}")
  endif()
  if(hostless)
    set(env "${env};ACCEL_TEST_DEVICES=1;ACCEL_DEFAULT_DEVICE=hostless:0")
  endif()
  add_test(NAME ${name}
           COMMAND $<TARGET_FILE:accel_cli> launch --main_process_port 0 --num_processes 2 $<TARGET_FILE:${bin}>
           WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR})
  set_tests_properties(${name} PROPERTIES TIMEOUT 60 ENVIRONMENT "${env}")
endfunction()

if(TARGET accel_cli)
  # A model unprepared and prepared again under ZeRO 1/2/3: its optimizer is sharded again.
  accel_launch2_test(zero_reprepare_hostless_2 test_zero_reprepare ON)
  accel_launch2_test(zero_reprepare_cpu_2 test_zero_reprepare OFF)
  # Device placement failing on one rank alone: every rank's prepare fails, and a retry on every rank places the model.
  accel_launch2_test(placement_rankfail_hostless_2 test_placement_rankfail ON)
  # Another local step of prepare failing on one rank alone (the flat buffers, ZeRO's shards, the tp plan's cuts):
  # likewise.
  accel_launch2_test(prepare_rankfail_cpu_2 test_prepare_rankfail OFF)
  # A ZeRO-3 model freed between its forward and the backward, on 2 processes.
  accel_launch2_test(contract_tape_frees_2 test_contract_tape_frees OFF)
  # DDP's buffer broadcast (BatchNorm's stats and count, one message) staged through host memory; the
  # convolution on im2col + GEMM, the path a GPU without a direct convolution takes (hostless wraps the
  # cpu's kernels, the cpu's oneDNN convolution among them).
  accel_launch2_test(accelerator_bn_hostless_2 test_accelerator_bn ON "ACCEL_CONV=im2col")
  # A pipeline whose stages hold different buffers, its weights' broadcast staged (hostless): the staged
  # broadcast's agreements are each data-parallel group's, so prepare succeeds and a step runs.
  add_test(NAME pipeline_staged_hostless_4
           COMMAND $<TARGET_FILE:accel_cli> launch --main_process_port 0 --num_processes 4 $<TARGET_FILE:test_pipeline_staged>
           WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR})
  set_tests_properties(pipeline_staged_hostless_4 PROPERTIES TIMEOUT 90 ENVIRONMENT
                       "OMP_NUM_THREADS=1;ACCEL_DIST_TIMEOUT=30;ACCEL_TEST_DEVICES=1;ACCEL_DEFAULT_DEVICE=hostless:0")
endif()

# The fine-tune guide's example: a Hugging Face directory fine-tuned under DDP and FSDP, saved, generated from.
if(TARGET accel_cli)
  add_test(NAME example_finetune_2
           COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/test_finetune.sh $<TARGET_FILE:accel_cli> $<TARGET_FILE:finetune>
                   $<TARGET_FILE:save_model> $<TARGET_FILE:generate> ${CMAKE_CURRENT_BINARY_DIR}/finetune_run)
  set_tests_properties(example_finetune_2 PROPERTIES TIMEOUT 120 ENVIRONMENT "OMP_NUM_THREADS=1"
                       PASS_REGULAR_EXPRESSION "finetune-ok")
endif()
