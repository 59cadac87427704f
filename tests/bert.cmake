# bert: Accelerate's nlp_example as examples/nlp_example.c, trained on 1 and 2
# processes until the gathered eval accuracy is well above chance.
if(TARGET accel_cli)
  add_test(NAME example_nlp_2
           COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/test_nlp_example.sh $<TARGET_FILE:accel_cli> $<TARGET_FILE:nlp_example>
                   ${CMAKE_CURRENT_SOURCE_DIR}/data)
  set_tests_properties(example_nlp_2 PROPERTIES TIMEOUT 300 ENVIRONMENT "OMP_NUM_THREADS=1;ACCEL_DIST_TIMEOUT=120"
                       PASS_REGULAR_EXPRESSION "nlp-example-ok")
endif()
