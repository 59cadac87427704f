# The API contract (docs/contract.md): issue #10's traps and every free order of
# the prepared objects, on 2 processes under the real launcher (they also run
# plainly as one process via the glob).
if(TARGET accel_cli)
  foreach(t contract_traps contract_free_order)
    add_test(NAME ${t}_2
             COMMAND $<TARGET_FILE:accel_cli> launch --main_process_port 0 --num_processes 2 $<TARGET_FILE:test_${t}>
             WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR})
    set_tests_properties(${t}_2 PROPERTIES TIMEOUT 120 ENVIRONMENT "OMP_NUM_THREADS=1;ACCEL_DIST_TIMEOUT=60")
  endforeach()
endif()
