# The host staging pool on a GPU (ctest -L gpu): skipped (exit 77) without one.
# Its hostless half, run everywhere, is test_pinned_staging.
set_tests_properties(cuda_staging PROPERTIES LABELS gpu SKIP_RETURN_CODE 77)
if(ACCEL_CUDA)
  target_include_directories(test_cuda_staging PRIVATE ${CUDAToolkit_INCLUDE_DIRS})
endif()
