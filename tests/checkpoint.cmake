# Checkpoints: the kill-at-every-point test compiles the save/load code itself,
# with its fault-injection points on (the library is built without them).
add_executable(checkpoint_kill_points ${CMAKE_CURRENT_SOURCE_DIR}/checkpoint_kill_points.c
               ${CMAKE_SOURCE_DIR}/src/accelerator/checkpoint.c)
target_include_directories(checkpoint_kill_points PRIVATE ${CMAKE_SOURCE_DIR}/src ${CMAKE_CURRENT_SOURCE_DIR})
target_compile_definitions(checkpoint_kill_points PRIVATE ACCEL__CKPT_KILL_POINTS ACCEL__INSIDE_LIBRARY)
target_link_libraries(checkpoint_kill_points PRIVATE accel PkgConfig::JANSSON)
add_test(NAME accelerator_checkpoint_kill_points COMMAND checkpoint_kill_points)
set_tests_properties(accelerator_checkpoint_kill_points PROPERTIES TIMEOUT 120 ENVIRONMENT "OMP_NUM_THREADS=1")
