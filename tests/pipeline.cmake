# Pipeline parallelism (test_pipeline.c): pp = 2 and 4 with each schedule,
# untied and tied embeddings, pp x dp = 2 x 2, and 2 x 2 with gradient
# accumulation over 2 batches, and an explicit split (3 layers on stage 0),
# and tp x pp = 2 x 2 with each schedule, tied and untied, and with sequence
# parallelism (a 7th field: tp, an 8th: sequence parallelism; 1 and 0 when
# absent), and interleaved 1F1B with 2 and 3 virtual stages per stage at pp =
# 2, 2 at pp = 4, at pp x dp = 2 x 2 and at tp x pp = 2 x 2 with sequence
# parallelism, tied and untied (a 9th field: the virtual stages, 1 when
# absent; a layer per chunk), and pp x dp = 2 x 2 under ZeRO-1 and ZeRO-2
# over each stage's dp ranks with 1F1B, GPipe and interleaved 1F1B (a 10th
# field: the ZeRO stage, 0 when absent; ZeRO-3 refused at prepare), against
# one process; and dp x tp x pp = 2 x 2 x 2 on 8 processes (1F1B tied, GPipe
# with sequence parallelism untied, interleaved 1F1B with 2 virtual stages and
# sequence parallelism).
# ACCEL_SHM_CHUNK_KB=4: the hidden states (6 KiB a micro-batch) cross the
# stages in several chunks, so a send waits for its receiver.
if(TARGET accel_cli)
  foreach(cfg "2;1;1f1b;0;1;0" "2;1;gpipe;1;1;0" "4;1;1f1b;1;1;0" "4;1;gpipe;0;1;0" "2;2;1f1b;1;1;0"
              "2;2;gpipe;0;1;0" "2;2;1f1b;1;2;0" "2;1;1f1b;1;1;3" "2;1;1f1b;1;1;0;2" "2;1;1f1b;0;1;0;2"
              "2;1;gpipe;1;1;0;2" "2;1;gpipe;0;1;0;2" "2;1;1f1b;1;1;0;2;1" "2;1;gpipe;0;2;0;2;1"
              "2;1;interleaved;1;1;0;1;0;2" "2;1;interleaved;0;1;0;1;0;3" "2;1;interleaved;0;1;0;1;0;2"
              "2;1;interleaved;1;1;0;1;0;3" "4;1;interleaved;1;1;0;1;0;2" "2;2;interleaved;0;2;0;1;0;2"
              "2;1;interleaved;1;1;0;2;1;2" "2;2;1f1b;1;1;0;1;0;1;1" "2;2;1f1b;1;2;0;1;0;1;2"
              "2;2;gpipe;0;1;0;1;0;1;2" "2;2;interleaved;0;1;0;1;0;2;1" "2;2;interleaved;1;1;0;1;0;2;2"
              "2;2;1f1b;1;1;0;2" "2;2;gpipe;0;1;0;2;1" "2;2;interleaved;1;1;0;2;1;2")
    list(GET cfg 0 pp)
    list(GET cfg 1 dp)
    list(GET cfg 2 sched)
    list(GET cfg 3 tied)
    list(GET cfg 4 accum)
    list(GET cfg 5 first)
    set(tp 1)
    set(sp 0)
    set(virt 1)
    set(zero 0)
    set(name pipeline_pp${pp}_dp${dp}_${sched}_tied${tied}_accum${accum}_first${first})
    list(LENGTH cfg fields)
    if(fields GREATER 6)
      list(GET cfg 6 tp)
      set(name pipeline_pp${pp}_dp${dp}_tp${tp}_${sched}_tied${tied}_accum${accum}_first${first})
    endif()
    if(fields GREATER 7)
      list(GET cfg 7 sp)
      set(name pipeline_pp${pp}_dp${dp}_tp${tp}_sp_${sched}_tied${tied}_accum${accum}_first${first})
    endif()
    if(fields GREATER 8)
      list(GET cfg 8 virt)
      set(name pipeline_pp${pp}_dp${dp}_tp${tp}_sp${sp}_${sched}_v${virt}_tied${tied}_accum${accum})
    endif()
    if(fields GREATER 9)
      list(GET cfg 9 zero)
      set(name pipeline_pp${pp}_dp${dp}_zero${zero}_${sched}_v${virt}_tied${tied}_accum${accum})
    endif()
    math(EXPR n "${pp} * ${dp} * ${tp}")
    add_test(NAME ${name}
             COMMAND $<TARGET_FILE:accel_cli> launch --num_processes ${n} $<TARGET_FILE:test_pipeline>
                     ${pp} ${dp} ${sched} ${tied} ${accum} ${first} ${tp} ${sp} ${virt} ${zero}
             WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR})
    set_tests_properties(${name} PROPERTIES TIMEOUT 180
      ENVIRONMENT "OMP_NUM_THREADS=1;ACCEL_DIST_TIMEOUT=60;ACCEL_SHM_CHUNK_KB=4"
      PASS_REGULAR_EXPRESSION "pipeline pp=${pp} dp=${dp} tp=${tp} sp=${sp} ${sched} accum=${accum} zero=${zero} cp=1 allgather llama ok\n"
      FAIL_REGULAR_EXPRESSION "FAILED|CHECK failed")
  endforeach()
endif()
# Context parallelism under pipeline parallelism (test_pipeline.c's 11th to 13th
# fields: cp size, strategy allgather / alltoall or sp for Ulysses' sp_size,
# family llama, gemma2, gemma3_text, phi, gpt_neox, stablelm or starcoder2): cp 2 x pp 2 on 4 processes
# with each schedule and strategy, Llama and Gemma-2 (its sliding window of 4 bites at T = 12; Gemma 3's too,
# with its two RoPEs; Phi's parallel blocks, tied with its head's bias; GPT-NeoX's own tree; StableLM's
# parallel residual with per-head q/k norms; Starcoder2's window, biases, tied), StableLM and Starcoder2
# also at cp 1 (pp 2 alone: 1F1B, GPipe and interleaved 1F1B), and
# tp 2 x cp 2 x pp 2 (sequence parallel) and dp_shard 2 x cp 2 x pp 2 (DDP,
# and ZeRO-2 over dp_shard x cp) on 8. Fields: pp dp sched tied tp sp virt
# zero cp strategy family.
if(TARGET accel_cli)
  foreach(cfg "2;1;1f1b;1;1;0;1;0;2;allgather;llama" "2;1;1f1b;0;1;0;1;0;2;alltoall;llama"
              "2;1;gpipe;0;1;0;1;0;2;allgather;llama" "2;1;gpipe;1;1;0;1;0;2;alltoall;llama"
              "2;1;interleaved;1;1;0;2;0;2;allgather;llama" "2;1;interleaved;0;1;0;2;0;2;alltoall;llama"
              "2;1;1f1b;0;1;0;1;0;2;sp;llama" "2;1;1f1b;1;1;0;1;0;2;allgather;gemma2"
              "2;1;gpipe;0;1;0;1;0;2;sp;gemma2" "2;1;interleaved;1;1;0;2;0;2;alltoall;gemma2"
              "2;1;1f1b;1;2;1;1;0;2;alltoall;llama" "2;2;gpipe;0;1;0;1;0;2;allgather;llama"
              "2;2;interleaved;1;1;0;2;2;2;alltoall;gemma2" "2;1;1f1b;0;1;0;1;0;2;alltoall;gemma3_text"
              "2;1;1f1b;1;1;0;1;0;2;allgather;phi" "2;1;gpipe;0;1;0;1;0;2;sp;phi"
              "2;1;1f1b;1;1;0;1;0;2;allgather;gpt_neox" "2;1;gpipe;0;1;0;1;0;2;sp;gpt_neox"
              "2;1;1f1b;0;1;0;1;0;1;allgather;stablelm" "2;1;interleaved;1;1;0;2;0;1;allgather;stablelm"
              "2;1;gpipe;1;1;0;1;0;2;alltoall;stablelm" "2;1;gpipe;1;1;0;1;0;1;allgather;starcoder2"
              "2;1;1f1b;1;1;0;1;0;2;allgather;starcoder2" "2;1;interleaved;0;1;0;2;0;2;sp;starcoder2")
    list(GET cfg 0 pp)
    list(GET cfg 1 dp)
    list(GET cfg 2 sched)
    list(GET cfg 3 tied)
    list(GET cfg 4 tp)
    list(GET cfg 5 sp)
    list(GET cfg 6 virt)
    list(GET cfg 7 zero)
    list(GET cfg 8 cp)
    list(GET cfg 9 strategy)
    list(GET cfg 10 family)
    set(name pipeline_cp${cp}_${strategy}_pp${pp}_dp${dp}_tp${tp}_sp${sp}_zero${zero}_${sched}_v${virt}_tied${tied}_${family})
    math(EXPR n "${pp} * ${dp} * ${tp} * ${cp}")
    add_test(NAME ${name}
             COMMAND $<TARGET_FILE:accel_cli> launch --num_processes ${n} $<TARGET_FILE:test_pipeline>
                     ${pp} ${dp} ${sched} ${tied} 1 0 ${tp} ${sp} ${virt} ${zero} ${cp} ${strategy} ${family}
             WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR})
    set_tests_properties(${name} PROPERTIES TIMEOUT 300
      ENVIRONMENT "OMP_NUM_THREADS=1;ACCEL_DIST_TIMEOUT=60;ACCEL_SHM_CHUNK_KB=4"
      PASS_REGULAR_EXPRESSION "pipeline pp=${pp} dp=${dp} tp=${tp} sp=${sp} ${sched} accum=1 zero=${zero} cp=${cp} ${strategy} ${family} ok\n"
      FAIL_REGULAR_EXPRESSION "FAILED|CHECK failed")
  endforeach()
endif()
# examples/pipeline_llama.c: 2 stages (1F1B, GPipe and interleaved 1F1B) print the loss one
# process prints (interleaved: against one process's 1F1B, as it needs 2 stages)
if(TARGET accel_cli AND TARGET pipeline_llama)
  foreach(sched 1f1b gpipe interleaved)
    set(one_sched ${sched})
    if(sched STREQUAL "interleaved")
      set(one_sched 1f1b)
    endif()
    add_test(NAME pipeline_example_2_${sched}
             COMMAND bash -c "one=$($<TARGET_FILE:pipeline_llama> ${one_sched} | sed 's/.*loss=//') && two=$($<TARGET_FILE:accel_cli> launch --num_processes 2 $<TARGET_FILE:pipeline_llama> ${sched} | grep '^stages=2 schedule=${sched} stage0_layers=' | sed 's/.*loss=//') && echo \"1 process: $one, 2 stages: $two\" && [ -n \"$one\" ] && [ \"$one\" = \"$two\" ]"
             WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR})
    set_tests_properties(pipeline_example_2_${sched} PROPERTIES TIMEOUT 120
                         ENVIRONMENT "OMP_NUM_THREADS=1;ACCEL_DIST_TIMEOUT=60")
  endforeach()
  # a schedule it does not know is refused, not run as 1F1B
  add_test(NAME pipeline_example_bad_schedule
           COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/expect_exit.sh 2 "usage: pipeline_llama [1f1b|gpipe|interleaved]"
                   $<TARGET_FILE:pipeline_llama> zero_bubble)
  set_tests_properties(pipeline_example_bad_schedule PROPERTIES TIMEOUT 60)
endif()
# A model unprepared and prepared again between pipeline steps, its optimizer
# staying prepared (test_pipeline_reprepare.c): pp 2 under DDP, pp 2 x
# dp_shard 2 under ZeRO-1 and ZeRO-2; each stage's weights as without the cycles.
if(TARGET accel_cli)
  foreach(zero 0 1 2)
    set(n 2)
    if(zero GREATER 0)
      set(n 4)
    endif()
    add_test(NAME pipeline_reprepare_pp2_zero${zero}
             COMMAND $<TARGET_FILE:accel_cli> launch --main_process_port 0 --num_processes ${n}
                     $<TARGET_FILE:test_pipeline_reprepare> ${zero}
             WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR})
    set_tests_properties(pipeline_reprepare_pp2_zero${zero} PROPERTIES TIMEOUT 120
      ENVIRONMENT "OMP_NUM_THREADS=1;ACCEL_DIST_TIMEOUT=60"
      PASS_REGULAR_EXPRESSION "pipeline reprepare zero=${zero} ok\n"
      FAIL_REGULAR_EXPRESSION "FAILED|CHECK failed")
  endforeach()
endif()
