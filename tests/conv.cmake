# conv: Accelerate's cv_example as examples/cv_example.c (a small ResNet of
# Conv2d, BatchNorm2d, pooling), trained on 1 and 2 processes until the
# gathered eval accuracy is well above chance.
if(TARGET accel_cli)
  add_test(NAME example_cv_2
           COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/test_cv_example.sh $<TARGET_FILE:accel_cli> $<TARGET_FILE:cv_example>)
  set_tests_properties(example_cv_2 PROPERTIES TIMEOUT 300 ENVIRONMENT "OMP_NUM_THREADS=1;ACCEL_DIST_TIMEOUT=120"
                       PASS_REGULAR_EXPRESSION "cv-example-ok")
endif()
