# Checkpoints: the kill-at-every-point test compiles the save/load code itself
# (save_state, save_model, the atomic file writer, the staged directories), with its fault-injection
# points on (the library is built without them).
add_executable(checkpoint_kill_points ${CMAKE_CURRENT_SOURCE_DIR}/checkpoint_kill_points.c
               ${CMAKE_SOURCE_DIR}/src/accelerator/checkpoint.c ${CMAKE_SOURCE_DIR}/src/accelerator/save.c
               ${CMAKE_SOURCE_DIR}/src/core/afile.c ${CMAKE_SOURCE_DIR}/src/core/staged_dir.c)
target_include_directories(checkpoint_kill_points PRIVATE ${CMAKE_SOURCE_DIR}/src ${CMAKE_CURRENT_SOURCE_DIR})
target_compile_definitions(checkpoint_kill_points PRIVATE ACCEL__CKPT_KILL_POINTS ACCEL__INSIDE_LIBRARY)
target_link_libraries(checkpoint_kill_points PRIVATE accel PkgConfig::JANSSON)
add_test(NAME accelerator_checkpoint_kill_points COMMAND checkpoint_kill_points)
set_tests_properties(accelerator_checkpoint_kill_points PROPERTIES TIMEOUT 120 ENVIRONMENT "OMP_NUM_THREADS=1")

# Bit flips in every file of a checkpoint are caught (test_checkpoint_integrity.c):
# plainly (the glob) and on 2 processes, where rank 0 flips and every rank must
# name the file; merge-weights runs the `accel` binary.
if(TARGET accel_cli)
  add_dependencies(test_checkpoint_integrity accel_cli)
  add_test(NAME checkpoint_integrity_2
           COMMAND $<TARGET_FILE:accel_cli> launch --main_process_port 0 --num_processes 2
                   $<TARGET_FILE:test_checkpoint_integrity>)
  set_tests_properties(checkpoint_integrity_2 PROPERTIES TIMEOUT 300
                       ENVIRONMENT "OMP_NUM_THREADS=1;ACCEL_DIST_TIMEOUT=60")
endif()

# The directories around a checkpoint (test_checkpoint_dirs.c) on 2 processes
# too: ranks given different directories are told so.
if(TARGET accel_cli)
  add_dependencies(test_checkpoint_dirs accel_cli)
  add_test(NAME checkpoint_dirs_2
           COMMAND $<TARGET_FILE:accel_cli> launch --main_process_port 0 --num_processes 2
                   $<TARGET_FILE:test_checkpoint_dirs>)
  set_tests_properties(checkpoint_dirs_2 PROPERTIES TIMEOUT 120
                       ENVIRONMENT "OMP_NUM_THREADS=1;ACCEL_DIST_TIMEOUT=60")
endif()

# save_model on a full disk: tmpfs sizes from 8 KiB up in a private mount
# namespace (root only; skipped otherwise), the previous model always intact.
add_test(NAME accelerator_save_model_enospc
         COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/run_save_model_enospc.sh ${CMAKE_CURRENT_BINARY_DIR}/save_model_tmpfs
                 $<TARGET_FILE:checkpoint_kill_points>)
set_tests_properties(accelerator_save_model_enospc PROPERTIES TIMEOUT 120 SKIP_RETURN_CODE 77
                     PASS_REGULAR_EXPRESSION "enospc-ok" ENVIRONMENT "OMP_NUM_THREADS=1")

# save_model and save_state into a mount point (a tmpfs in a private mount
# namespace; root only, skipped otherwise) fail at once naming it; io's weight
# writers write it in place; a mount inside the directory is refused by all.
add_test(NAME accelerator_save_mount_point
         COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/run_save_mount_point.sh ${CMAKE_CURRENT_BINARY_DIR}/save_mount_point
                 $<TARGET_FILE:checkpoint_kill_points>)
set_tests_properties(accelerator_save_mount_point PROPERTIES TIMEOUT 60 SKIP_RETURN_CODE 77
                     PASS_REGULAR_EXPRESSION "mount-point-ok" ENVIRONMENT "OMP_NUM_THREADS=1")
