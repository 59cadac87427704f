# bert: Accelerate's nlp_example as examples/nlp_example.c, trained on 1 and 2
# processes until the gathered eval accuracy is well above chance.
if(TARGET accel_cli)
  add_test(NAME example_nlp_2
           COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/test_nlp_example.sh $<TARGET_FILE:accel_cli> $<TARGET_FILE:nlp_example>
                   ${CMAKE_CURRENT_SOURCE_DIR}/data)
  set_tests_properties(example_nlp_2 PROPERTIES TIMEOUT 300 ENVIRONMENT "OMP_NUM_THREADS=1;ACCEL_DIST_TIMEOUT=120"
                       PASS_REGULAR_EXPRESSION "nlp-example-ok")
endif()
# save_model of a BERT sharded by FSDP FULL_SHARD on 2 processes: the gathered
# full weights and BERT's config.json, loaded back to the fixture's logits.
if(TARGET accel_cli)
  add_test(NAME bert_save_model_fsdp_2
           COMMAND $<TARGET_FILE:accel_cli> launch --main_process_port 0 --num_processes 2 --use_fsdp
                   --fsdp_sharding_strategy FULL_SHARD $<TARGET_FILE:test_bert_save_model>
                   ${CMAKE_CURRENT_BINARY_DIR}/bert_save_model_fsdp_2
           WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR})
  set_tests_properties(bert_save_model_fsdp_2 PROPERTIES TIMEOUT 300
                       ENVIRONMENT "OMP_NUM_THREADS=1;ACCEL_DIST_TIMEOUT=60")
endif()
