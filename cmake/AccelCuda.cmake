# The CUDA backend (src/backends/cuda) and the NCCL process-group backend
# (src/dist/nccl.c). Included by the top-level CMakeLists.txt after the accel
# target exists.
#
# ACCEL_CUDA defaults to ON when the CUDA toolkit (nvcc, cudart, cuBLASLt) is
# found; -DACCEL_CUDA=OFF builds without it. The backend registers itself at
# start-up only when cudaGetDeviceCount() finds a GPU, so a CUDA build on a
# machine without one behaves as a build without CUDA.
#
# Kernels are compiled for sm_90 (SASS) plus compute_80 PTX, which the driver
# JIT-compiles on Ampere/Ada and newer GPUs: ACCEL_CUDA_ARCHITECTURES overrides
# (CMake's CUDA_ARCHITECTURES syntax).

include(CheckLanguage)
check_language(CUDA)
find_package(CUDAToolkit QUIET)
set(ACCEL_CUDA_FOUND OFF)
if(CMAKE_CUDA_COMPILER AND CUDAToolkit_FOUND AND TARGET CUDA::cublasLt)
  set(ACCEL_CUDA_FOUND ON)
endif()
option(ACCEL_CUDA "Build the CUDA backend and the NCCL process-group backend" ${ACCEL_CUDA_FOUND})
set(ACCEL_CUDA_ARCHITECTURES "90-real;80-virtual" CACHE STRING "CUDA_ARCHITECTURES of the CUDA kernels")

set(ACCEL__CUDA_SOURCE_REGEX "/src/backends/cuda/|/src/dist/nccl\\.c$")

if(ACCEL_CUDA)
  if(NOT ACCEL_CUDA_FOUND)
    message(FATAL_ERROR "ACCEL_CUDA=ON but no CUDA toolkit (nvcc, cudart, cuBLASLt) was found")
  endif()
  set(CMAKE_CUDA_ARCHITECTURES "${ACCEL_CUDA_ARCHITECTURES}")
  enable_language(CUDA)
  # The kernels need no device link step (no separable compilation): programs
  # linking accel link with the C compiler, as without CUDA.
  set(CMAKE_CUDA_LINKER_PREFERENCE_PROPAGATES 0)
  find_library(ACCEL_NCCL_LIB nccl HINTS ${CUDAToolkit_LIBRARY_DIR})
  find_path(ACCEL_NCCL_INCLUDE nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS})

  # The kernels: nvcc's own flags, not the C compiler's warning list (nvcc
  # does not take -Wall; it passes host-compiler warnings with -Xcompiler).
  file(GLOB ACCEL_CUDA_KERNELS CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/src/backends/cuda/*.cu)
  add_library(accel_cuda_kernels OBJECT ${ACCEL_CUDA_KERNELS})
  set_target_properties(accel_cuda_kernels PROPERTIES
    COMPILE_OPTIONS "-Xcompiler=-Wall,-Wextra,-Wno-unused-parameter;-Werror=all-warnings"
    CUDA_STANDARD 17 POSITION_INDEPENDENT_CODE ON)
  target_include_directories(accel_cuda_kernels PRIVATE ${CMAKE_SOURCE_DIR}/include ${CMAKE_SOURCE_DIR}/src)
  target_sources(accel PRIVATE $<TARGET_OBJECTS:accel_cuda_kernels>)
  # libaccel.so is made of accel's own objects: it needs the kernels' too.
  set(ACCEL_CUDA_OBJECTS $<TARGET_OBJECTS:accel_cuda_kernels>)
  # accel was created before CUDA was enabled: it did not pick the list up.
  set_target_properties(accel PROPERTIES CUDA_ARCHITECTURES "${ACCEL_CUDA_ARCHITECTURES}")

  # cudart static: the binaries need only the driver (libcuda) and cuBLASLt at run time.
  # ACCEL_PRIVATE_LIBS: libaccel.so links them too. ACCEL_CUDA_PC_LIBS: what a
  # static link needs besides (accel.pc's Libs.private; the kernels' host code
  # uses the C++ runtime).
  list(APPEND ACCEL_PRIVATE_LIBS CUDA::cudart_static CUDA::cublasLt)
  target_link_libraries(accel PRIVATE CUDA::cudart_static CUDA::cublasLt stdc++ dl)
  set(ACCEL_CUDA_PC_LIBS ${CUDA_cudart_static_LIBRARY} ${CUDA_cublasLt_LIBRARY} stdc++ dl)
  # PUBLIC: the CLI and the GPU test print what the backend finds.
  target_compile_definitions(accel PUBLIC ACCEL_HAVE_CUDA)
  if(ACCEL_NCCL_LIB AND ACCEL_NCCL_INCLUDE)
    target_include_directories(accel PRIVATE ${ACCEL_NCCL_INCLUDE})
    target_link_libraries(accel PRIVATE ${ACCEL_NCCL_LIB})
    list(APPEND ACCEL_PRIVATE_LIBS ${ACCEL_NCCL_LIB})
    list(APPEND ACCEL_CUDA_PC_LIBS ${ACCEL_NCCL_LIB})
    target_compile_definitions(accel PUBLIC ACCEL_HAVE_NCCL)
  else()
    get_target_property(ACCEL__SRCS accel SOURCES)
    list(FILTER ACCEL__SRCS EXCLUDE REGEX "/src/dist/nccl\\.c$")
    set_target_properties(accel PROPERTIES SOURCES "${ACCEL__SRCS}")
    message(STATUS "accel: CUDA backend on, NCCL not found (no nccl process-group backend)")
  endif()
  message(STATUS "accel: CUDA backend on (nvcc ${CMAKE_CUDA_COMPILER_VERSION}, architectures ${ACCEL_CUDA_ARCHITECTURES})")
else()
  get_target_property(ACCEL__SRCS accel SOURCES)
  list(FILTER ACCEL__SRCS EXCLUDE REGEX "${ACCEL__CUDA_SOURCE_REGEX}")
  set_target_properties(accel PROPERTIES SOURCES "${ACCEL__SRCS}")
  message(STATUS "accel: CUDA backend off")
endif()
