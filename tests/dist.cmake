# Multi-process tests of the dist layer, run under the real launcher.
# (test_dist_*.c and test_cli_*.c are also registered by the glob in
# tests/CMakeLists.txt: run plainly, test_dist_collectives is a group of one
# and test_cli_* drive build/bin/accel themselves.)
if(TARGET accel_cli)
  foreach(n 2 3 4)
    add_test(NAME dist_collectives_${n}
             COMMAND $<TARGET_FILE:accel_cli> launch --num_processes ${n} $<TARGET_FILE:test_dist_collectives>
             WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR})
    set_tests_properties(dist_collectives_${n} PROPERTIES TIMEOUT 120
                         ENVIRONMENT "OMP_NUM_THREADS=1;ACCEL_DIST_TIMEOUT=60")
  endforeach()
  add_test(NAME norm_all_reduce_2
           COMMAND $<TARGET_FILE:accel_cli> launch --num_processes 2 $<TARGET_FILE:test_norm_all_reduce>
           WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR})
  set_tests_properties(norm_all_reduce_2 PROPERTIES TIMEOUT 60 ENVIRONMENT "OMP_NUM_THREADS=1;ACCEL_DIST_TIMEOUT=30")
  add_test(NAME dist_collectives_debug_2
           COMMAND $<TARGET_FILE:accel_cli> launch --debug --num_processes 2 $<TARGET_FILE:test_dist_collectives>
           WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR})
  set_tests_properties(dist_collectives_debug_2 PROPERTIES TIMEOUT 120 ENVIRONMENT "OMP_NUM_THREADS=1")
  # the CLI tests exec the launcher and the fault worker: build them first
  add_dependencies(test_cli_launch accel_cli test_dist_faults)
  add_dependencies(test_cli_config accel_cli)
endif()
# A rank killed during the rendezvous must be named at once: the ranks run with
# ACCEL_DIST_TIMEOUT=600, so a regression shows as this TIMEOUT.
set_tests_properties(dist_rdv_dead PROPERTIES TIMEOUT 30)
# A rank that fails before the rendezvous must be named at once: the ranks run
# with ACCEL_DIST_TIMEOUT=600, so a regression shows as this TIMEOUT.
set_tests_properties(dist_failed_early PROPERTIES TIMEOUT 60)
