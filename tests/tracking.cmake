# test_tracking reads TensorBoard records with the generated protobuf-c code.
target_include_directories(test_tracking PRIVATE ${ACCEL_GEN_DIR})
target_link_libraries(test_tracking PRIVATE PkgConfig::PROTOBUF_C)
