# save_model both ways on 2 processes through the example: transformers' folder
# layouts (pytorch_model-*.bin + index keeping the tied name, safetensors
# shards + index without it), config.json beside each.
if(TARGET accel_cli)
  set(_sm "${CMAKE_CURRENT_BINARY_DIR}/save_model_run")
  add_test(NAME example_save_model_2
           COMMAND sh -c "rm -rf '${_sm}' && \
$<TARGET_FILE:accel_cli> launch --quiet --main_process_port 0 --num_processes 2 $<TARGET_FILE:save_model> '${_sm}' 20KB && \
test -f '${_sm}/pytorch/config.json' && test -f '${_sm}/safetensors/config.json' && \
test -f '${_sm}/pytorch/pytorch_model-00001-of-00006.bin' && ! test -e '${_sm}/pytorch/model.safetensors' && \
grep -q '\"lm_head.weight\"' '${_sm}/pytorch/pytorch_model.bin.index.json' && \
! grep -q '\"lm_head.weight\"' '${_sm}/safetensors/model.safetensors.index.json' && echo layouts-ok")
  set_tests_properties(example_save_model_2 PROPERTIES TIMEOUT 60 ENVIRONMENT "OMP_NUM_THREADS=1"
                       PASS_REGULAR_EXPRESSION "layouts-ok")
endif()
