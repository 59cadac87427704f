# The GPU tests (ctest -L gpu): the CUDA backend against the CPU reference.
# Built in every build; without a GPU (or without the CUDA backend) the test
# prints the reason and exits 77, which ctest reports as skipped.
set_tests_properties(cuda_kernels PROPERTIES LABELS gpu SKIP_RETURN_CODE 77)
if(ACCEL_CUDA)
  target_include_directories(test_cuda_kernels PRIVATE ${CUDAToolkit_INCLUDE_DIRS})
endif()
# The same harness on the hostless test device (the CPU kernels behind
# non-host pointers): proves, without a GPU, that the comparison, the
# poisoning and the views of the GPU test work.
add_test(NAME cuda_kernels_harness COMMAND test_cuda_kernels WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR})
set_tests_properties(cuda_kernels_harness PROPERTIES TIMEOUT 300
  ENVIRONMENT "OMP_NUM_THREADS=2;ACCEL_TEST_KERNELS_ON=hostless")
# The NCCL process group through the Accelerator: one rank (a one-rank NCCL
# communicator on cuda:0) and one rank per GPU (skipped below 2 GPUs: NCCL
# allows one rank per GPU).
set_tests_properties(nccl PROPERTIES LABELS gpu SKIP_RETURN_CODE 77 TIMEOUT 180)
add_test(NAME nccl_multi COMMAND test_nccl multi WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR})
set_tests_properties(nccl_multi PROPERTIES LABELS gpu SKIP_RETURN_CODE 77 TIMEOUT 180)
if(ACCEL_CUDA)
  target_include_directories(test_nccl PRIVATE ${CUDAToolkit_INCLUDE_DIRS})
endif()
# The backend's handling of failed CUDA calls, through fakes in its call
# table (src/backends/cuda/cuda_calls.h): runs without a GPU.
# The backend lives in the plug-in, whose internals are hidden: the test
# compiles the backend's host code in, calling the core directly.
set_tests_properties(cuda_failures PROPERTIES SKIP_RETURN_CODE 77)
if(ACCEL_CUDA)
  target_sources(test_cuda_failures PRIVATE ${ACCEL_CUDA_C_SOURCES} $<TARGET_OBJECTS:accel_cuda_kernels>)
  target_compile_definitions(test_cuda_failures PRIVATE ${ACCEL_PLUGIN_LAYOUT_DEF})
  target_include_directories(test_cuda_failures PRIVATE ${CUDAToolkit_INCLUDE_DIRS} ${ACCEL_NCCL_INCLUDE})
  target_link_libraries(test_cuda_failures PRIVATE ${ACCEL_CUDA_LIBS})
  set_target_properties(test_cuda_failures PROPERTIES LINKER_LANGUAGE C)
endif()
# cuda_calls_table: no event or stream poll outside the call table
# (tests/check_cuda_calls.sh, grep on the sources: runs in every build).
add_test(NAME cuda_calls_table COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/check_cuda_calls.sh ${CMAKE_SOURCE_DIR})
