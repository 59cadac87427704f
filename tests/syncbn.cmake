# SyncBatchNorm on 2 processes under the real launcher, the ranks' slices of
# unequal sizes (tests/test_sync_batch_norm.c; its plain run is 1 process).
# A short group timeout: eval's "no collective" check would wait that long.
if(TARGET accel_cli)
  add_test(NAME sync_batch_norm_2
           COMMAND $<TARGET_FILE:accel_cli> launch --main_process_port 0 --num_processes 2
                   $<TARGET_FILE:test_sync_batch_norm>
           WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR})
  set_tests_properties(sync_batch_norm_2 PROPERTIES TIMEOUT 120
                       ENVIRONMENT "OMP_NUM_THREADS=1;ACCEL_DIST_TIMEOUT=20")
endif()
