# conv: Accelerate's cv_example as examples/cv_example.c (a small ResNet of
# Conv2d, BatchNorm2d, pooling), trained on 1 and 2 processes until the
# gathered eval accuracy is well above chance.
if(TARGET accel_cli)
  add_test(NAME example_cv_2
           COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/test_cv_example.sh $<TARGET_FILE:accel_cli> $<TARGET_FILE:cv_example>)
  set_tests_properties(example_cv_2 PROPERTIES TIMEOUT 300 ENVIRONMENT "OMP_NUM_THREADS=1;ACCEL_DIST_TIMEOUT=120"
                       PASS_REGULAR_EXPRESSION "cv-example-ok")
endif()
# The convolution paths (docs/cpu.md "Convolutions"): the conv tests once
# more on each path ACCEL_CONV forces (the plain runs use auto: oneDNN's
# convolution where its plug-in loads), and ACCEL_CONV refused when it names
# no mode.
set(_conv_modes im2col)
if(ACCEL_HAVE_DNNL)
  list(APPEND _conv_modes dnnl)
endif()
foreach(m ${_conv_modes})
  foreach(t ops_conv nn_conv)
    add_test(NAME ${t}_conv_${m} COMMAND test_${t} WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR})
    set_tests_properties(${t}_conv_${m} PROPERTIES TIMEOUT 300 ENVIRONMENT "OMP_NUM_THREADS=2;ACCEL_CONV=${m}")
  endforeach()
endforeach()
add_test(NAME conv_dnnl_env_bogus COMMAND test_conv_dnnl WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR})
set_tests_properties(conv_dnnl_env_bogus PROPERTIES TIMEOUT 300 ENVIRONMENT "OMP_NUM_THREADS=2;ACCEL_CONV=bogus")
