# accel estimate-memory's per-rank figures against a measured ZeRO-3 step on
# 2 processes (f32 and bf16): each rank's step arena peak, shards and Adam
# state within 10% (tests/test_training_memory.c); the CLI's per-rank table
# and its refusals.
if(TARGET accel_cli)
  set(_tm "$<TARGET_FILE:accel_cli>;launch;--main_process_port;0")
  add_test(NAME training_memory_zero3_2
           COMMAND ${_tm} --num_processes 2 --use_fsdp $<TARGET_FILE:test_training_memory>)
  add_test(NAME training_memory_zero3_bf16_2
           COMMAND ${_tm} --num_processes 2 --use_fsdp --mixed_precision bf16 $<TARGET_FILE:test_training_memory>)
  set_tests_properties(training_memory_zero3_2 PROPERTIES PASS_REGULAR_EXPRESSION "training memory zero3 world=2 mp=no\n")
  set_tests_properties(training_memory_zero3_bf16_2 PROPERTIES PASS_REGULAR_EXPRESSION "training memory zero3 world=2 mp=bf16\n")
  set_tests_properties(training_memory_zero3_2 training_memory_zero3_bf16_2 PROPERTIES
    TIMEOUT 180 ENVIRONMENT "OMP_NUM_THREADS=1;ACCEL_DIST_TIMEOUT=60" FAIL_REGULAR_EXPRESSION "CHECK failed|error:")
  # one tp rank's step arena peak against accel_llama_activation_bytes (.tp_size, .sequence_parallel) for
  # every family of the architecture table (each has a tp plan), plain and checkpointed, within 10% as one
  # process's: tp 2 and tp 4 (its 2 key/value heads replicated, one head a rank), f32 and bf16, each with
  # and without Megatron's sequence parallelism
  foreach(cfg "2;no;" "2;no;sp" "2;bf16;" "2;bf16;sp" "4;no;" "4;no;sp" "4;bf16;" "4;bf16;sp")
    list(GET cfg 0 n)
    list(GET cfg 1 mp)
    list(GET cfg 2 sp)
    set(name training_memory_tp${n})
    if(mp STREQUAL "bf16")
      set(name ${name}_bf16)
    endif()
    set(sp_flag 0)
    if(sp)
      set(name ${name}_sp)
      set(sp_flag 1)
    endif()
    add_test(NAME ${name} COMMAND ${_tm} --num_processes ${n} --use_parallelism_config --parallelism_config_tp_size
             ${n} --mixed_precision ${mp} $<TARGET_FILE:test_training_memory> tp 0 1000 ${sp}
             WORKING_DIRECTORY ${CMAKE_SOURCE_DIR}/tests)
    set_tests_properties(${name} PROPERTIES PASS_REGULAR_EXPRESSION
      "training memory tp=${n} sp=${sp_flag} mp=${mp} families=[1-9][0-9]*\n" TIMEOUT 300
      ENVIRONMENT "OMP_NUM_THREADS=1;ACCEL_DIST_TIMEOUT=60" FAIL_REGULAR_EXPRESSION "CHECK failed|error:")
    # bf16 once more on AVX2's path (gemm.cmake's _isa_levels: where this machine has it): the GEMMs on
    # OpenBLAS with each operand widened once to f32 (accel__mm_operand), what a CPU without bf16 units runs
    if(mp STREQUAL "bf16" AND "avx2" IN_LIST _isa_levels)
      add_test(NAME ${name}_isa_avx2 COMMAND ${_tm} --num_processes ${n} --use_parallelism_config
               --parallelism_config_tp_size ${n} --mixed_precision ${mp} $<TARGET_FILE:test_training_memory> tp 0 1000 ${sp}
               WORKING_DIRECTORY ${CMAKE_SOURCE_DIR}/tests)
      set_tests_properties(${name}_isa_avx2 PROPERTIES PASS_REGULAR_EXPRESSION
        "training memory tp=${n} sp=${sp_flag} mp=${mp} families=[1-9][0-9]*\n" TIMEOUT 300
        ENVIRONMENT "OMP_NUM_THREADS=1;ACCEL_DIST_TIMEOUT=60;ACCEL_CPU_ISA=avx2" FAIL_REGULAR_EXPRESSION "CHECK failed|error:")
    endif()
  endforeach()
  # one rank of context parallelism (cp 2: its T / 2 positions, the all-gather's or the all-to-all's
  # attention) against accel_llama_activation_bytes (.cp_size, .cp_alltoall) for every family whose cp step
  # it models (not GPT-2's, nor explicit scores: it names those), plain and checkpointed, within 10% as one
  # process's, f32 and bf16; and cp 2 x tp 2 (its key/value head repeated under the all-to-all)
  foreach(cfg "1;no;allgather" "1;bf16;allgather" "1;no;alltoall" "1;bf16;alltoall" "2;no;allgather"
              "2;bf16;alltoall")
    list(GET cfg 0 tp)
    list(GET cfg 1 mp)
    list(GET cfg 2 st)
    math(EXPR n "2 * ${tp}")
    set(name training_memory_cp2)
    if(tp GREATER 1)
      set(name ${name}_tp${tp})
    endif()
    set(name ${name}_${st})
    if(mp STREQUAL "bf16")
      set(name ${name}_bf16)
    endif()
    set(cmd ${_tm} --num_processes ${n} --use_parallelism_config --parallelism_config_cp_size 2
        --parallelism_config_cp_comm_strategy ${st} --parallelism_config_tp_size ${tp} --mixed_precision ${mp}
        $<TARGET_FILE:test_training_memory> tp 0 1000)
    set(expect "training memory tp=${tp} sp=0 cp=2 ${st} mp=${mp} families=[1-9][0-9]*\n")
    add_test(NAME ${name} COMMAND ${cmd} WORKING_DIRECTORY ${CMAKE_SOURCE_DIR}/tests)
    set_tests_properties(${name} PROPERTIES PASS_REGULAR_EXPRESSION "${expect}" TIMEOUT 300
      ENVIRONMENT "OMP_NUM_THREADS=1;ACCEL_DIST_TIMEOUT=60" FAIL_REGULAR_EXPRESSION "CHECK failed|error:")
    # bf16 on AVX2's path too, as the tp tests
    if(mp STREQUAL "bf16" AND "avx2" IN_LIST _isa_levels)
      add_test(NAME ${name}_isa_avx2 COMMAND ${cmd} WORKING_DIRECTORY ${CMAKE_SOURCE_DIR}/tests)
      set_tests_properties(${name}_isa_avx2 PROPERTIES PASS_REGULAR_EXPRESSION "${expect}" TIMEOUT 300
        ENVIRONMENT "OMP_NUM_THREADS=1;ACCEL_DIST_TIMEOUT=60;ACCEL_CPU_ISA=avx2"
        FAIL_REGULAR_EXPRESSION "CHECK failed|error:")
    endif()
  endforeach()
endif()
# every family's step against its estimate (the architecture table's rows in
# three runs of about the same length, the last open-ended so that a new row is
# covered: Phi-3's row runs its partial-rotary steps too), and BERT's
add_test(NAME training_memory_families_0 COMMAND test_training_memory families 0 4
         WORKING_DIRECTORY ${CMAKE_SOURCE_DIR}/tests)
add_test(NAME training_memory_families_4 COMMAND test_training_memory families 4 7
         WORKING_DIRECTORY ${CMAKE_SOURCE_DIR}/tests)
add_test(NAME training_memory_families_7 COMMAND test_training_memory families 7 1000
         WORKING_DIRECTORY ${CMAKE_SOURCE_DIR}/tests)
add_test(NAME training_memory_bert COMMAND test_training_memory bert WORKING_DIRECTORY ${CMAKE_SOURCE_DIR}/tests)
set_tests_properties(training_memory_families_0 training_memory_families_4 training_memory_families_7
                     training_memory_bert PROPERTIES
  TIMEOUT 600 ENVIRONMENT "OMP_NUM_THREADS=2")
# BERT's steps once more with the bf16 GEMMs on OpenBLAS, each operand widened once to f32 (accel__gemm_native
# false), the path of a CPU without bf16 units: every Linear has a bias, whose gradient then reads the GEMMs' own
# f32 output gradient (on this path only: an estimate that counted a copy of it was 5% to 8% over)
add_test(NAME training_memory_bert_gemm_openblas COMMAND test_training_memory bert
         WORKING_DIRECTORY ${CMAKE_SOURCE_DIR}/tests)
set_tests_properties(training_memory_bert_gemm_openblas PROPERTIES TIMEOUT 600
                     ENVIRONMENT "OMP_NUM_THREADS=2;ACCEL_GEMM=openblas")
if(TARGET accel_cli)
  # the per-rank table with the step's activations (f32: the same figure on every CPU)
  add_test(NAME training_memory_cli
           COMMAND accel_cli estimate-memory data/llama_seed_config --num_processes 2 --batch_size 8 --seq_len 64
           WORKING_DIRECTORY ${CMAKE_SOURCE_DIR}/tests)
  set_tests_properties(training_memory_cli PROPERTIES ENVIRONMENT "OMP_NUM_THREADS=2" PASS_REGULAR_EXPRESSION
    "Training using Adam on 2 processes, per rank \\(batch 8 x 64, f32\\).*│Gathered units│Activations│ Total │.*│    DDP \\(NO_SHARD\\)    │325.08 MB│325.08 MB│650.16 MB│   0 bytes    │ 770.27 MB │2.02 GB│\n.*│ ZeRO-3 \\(FULL_SHARD\\)  │162.54 MB│162.54 MB│325.08 MB│   250.0 MB   │ 854.77 MB │1.71 GB│")
  add_test(NAME training_memory_cli_checkpointed
           COMMAND accel_cli estimate-memory data/llama_seed_config --num_processes 2 --batch_size 8 --seq_len 64
                   --activation_checkpointing --strategy FULL_SHARD
           WORKING_DIRECTORY ${CMAKE_SOURCE_DIR}/tests)
  set_tests_properties(training_memory_cli_checkpointed PROPERTIES ENVIRONMENT "OMP_NUM_THREADS=2" PASS_REGULAR_EXPRESSION
    "checkpointed\\).*│ZeRO-3 \\(FULL_SHARD\\)│162.54 MB│162.54 MB│325.08 MB│   250.0 MB   │ 285.81 MB │1.16 GB│")
  # another family's step (f32): Gemma2's own (was counted as Llama's); GPT-2's and BERT's: bigmodel.cmake
  add_test(NAME training_memory_cli_gemma2
           COMMAND accel_cli estimate-memory data/hf_arch_gemma2 --batch_size 2 --seq_len 16 --strategy NO_SHARD
           WORKING_DIRECTORY ${CMAKE_SOURCE_DIR}/tests)
  set_tests_properties(training_memory_cli_gemma2 PROPERTIES ENVIRONMENT "OMP_NUM_THREADS=2" PASS_REGULAR_EXPRESSION
    "│DDP \\(NO_SHARD\\)│57.12 KB│ 57.12 KB│114.25 KB│   0 bytes    │ 584.39 KB │812.89 KB│")
  # fp16, as bf16, adds the weights' autocast copies: P bytes of f32 panels on a CPU without f16 units, P/2 with
  add_test(NAME training_memory_cli_fp16_copies
           COMMAND accel_cli estimate-memory data/llama_seed_config --mixed_precision fp16 --strategy NO_SHARD
           WORKING_DIRECTORY ${CMAKE_SOURCE_DIR}/tests)
  set_tests_properties(training_memory_cli_fp16_copies PROPERTIES PASS_REGULAR_EXPRESSION
    "│Weight copies│ Total │.*│DDP \\(NO_SHARD\\)│325.08 MB│325.08 MB│650.16 MB│   0 bytes    │ *(325.08|162.54) MB *│(1.59|1.43) GB│")
  # bad input, named: a zero batch, a lone --batch_size, sizes past 2^62 bytes, past int64, unknown names
  function(training_memory_bad name expect)
    add_test(NAME training_memory_cli_bad_${name}
             COMMAND accel_cli estimate-memory data/llama_seed_config ${ARGN} WORKING_DIRECTORY ${CMAKE_SOURCE_DIR}/tests)
    set_tests_properties(training_memory_cli_bad_${name} PROPERTIES PASS_REGULAR_EXPRESSION "${expect}")
  endfunction()
  training_memory_bad(zero_batch "argument --batch_size: expected a count >= 1" --batch_size 0 --seq_len 4)
  training_memory_bad(lone_batch "--batch_size and --seq_len go together" --batch_size 8)
  training_memory_bad(overflow
    "the activations of batch 1099511627776 x seq_len 1099511627776 would take more than 2\\^62 bytes"
    --batch_size 1099511627776 --seq_len 1099511627776)
  training_memory_bad(int64 "argument --batch_size: expected a count >= 1 \\(at most 2\\^63 - 1\\)"
    --batch_size 99999999999999999999 --seq_len 2)
  training_memory_bad(short_seq "need batch_size >= 1 and seq_len >= 2" --batch_size 1 --seq_len 1)
  training_memory_bad(strategy "argument --strategy: invalid choice: 'zero4'" --strategy zero4)
  training_memory_bad(precision "argument --mixed_precision: invalid choice: 'fp8'" --mixed_precision fp8)
endif()
