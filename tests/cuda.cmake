# The GPU tests (ctest -L gpu): the CUDA backend against the CPU reference.
# Built in every build; without a GPU (or without the CUDA backend) the test
# prints the reason and exits 77, which ctest reports as skipped.
set_tests_properties(cuda_kernels PROPERTIES LABELS gpu SKIP_RETURN_CODE 77)
if(ACCEL_CUDA)
  target_include_directories(test_cuda_kernels PRIVATE ${CUDAToolkit_INCLUDE_DIRS})
endif()
