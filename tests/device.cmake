# The op tests and the Llama forward/backward fixtures run a second time on
# the hostless test device (src/backends/hostless): its pointers fault on the
# host, so any host access to tensor memory above src/backends/ shows up as a
# crash. Same binaries; ACCEL_DEFAULT_DEVICE makes every tensor the tests
# create live on hostless:0.
foreach(t ops_attention ops_attention_blocked ops_attention_strided sdpa_padded sdpa_packed ops_conv ops_pad ops_errors ops_fused ops_loss ops_matmul ops_nn ops_perf_paths
          ops_pointwise ops_reduce ops_shape ops_compare llama_numerics)
  add_test(NAME ${t}_hostless COMMAND test_${t} WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR})
  set_tests_properties(${t}_hostless PROPERTIES TIMEOUT 300
    ENVIRONMENT "OMP_NUM_THREADS=2;ACCEL_TEST_DEVICES=2;ACCEL_DEFAULT_DEVICE=hostless:0")
endforeach()

# The layers above ops under the same default device: sampling from device
# logits and generation (test_generate), batch collation on the cpu whatever
# the default device (test_data_loader). test_device_bigmodel registers two
# hostless devices itself (safetensors, dispatch, offload, generation, flat
# buffers on hostless:0/1 against the cpu).
foreach(t generate data_loader)
  add_test(NAME ${t}_hostless COMMAND test_${t} WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR})
  set_tests_properties(${t}_hostless PROPERTIES TIMEOUT 300
    ENVIRONMENT "OMP_NUM_THREADS=2;ACCEL_TEST_DEVICES=2;ACCEL_DEFAULT_DEVICE=hostless:0")
endforeach()
