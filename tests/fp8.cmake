# fp8 across ranks: the amax reduction of TransformerEngine's recipe on the
# cpu reference, two ranks with different amaxes (test_fp8_amax.c).
if(TARGET accel_cli)
  add_test(NAME fp8_amax_2
           COMMAND $<TARGET_FILE:accel_cli> launch --main_process_port 0 --num_processes 2 $<TARGET_FILE:test_fp8_amax>
           WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR})
  set_tests_properties(fp8_amax_2 PROPERTIES TIMEOUT 120 ENVIRONMENT "OMP_NUM_THREADS=1;ACCEL_DIST_TIMEOUT=60")
endif()
