# The cuda plug-in, lib/accel/libaccel-cuda.so: the CUDA backend
# (src/backends/cuda) and the NCCL process-group backend (src/dist/nccl.c).
# Included by the top-level CMakeLists.txt after cmake/AccelPlugins.cmake.
#
# ACCEL_CUDA defaults to ON when the CUDA toolkit (nvcc, cudart, cuBLASLt) is
# found; -DACCEL_CUDA=OFF builds no plug-in. libaccel.so, the CLI and the
# programs never link the CUDA runtime: the core loads the plug-in the first
# time a CUDA device is asked for (src/backends/plugin.h), and on a machine
# without a GPU (or without the NVIDIA driver) it registers no device.
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

if(ACCEL_CUDA)
  if(NOT ACCEL_CUDA_FOUND)
    message(FATAL_ERROR "ACCEL_CUDA=ON but no CUDA toolkit (nvcc, cudart, cuBLASLt) was found")
  endif()
  set(CMAKE_CUDA_ARCHITECTURES "${ACCEL_CUDA_ARCHITECTURES}")
  enable_language(CUDA)
  find_library(ACCEL_NCCL_LIB nccl HINTS ${CUDAToolkit_LIBRARY_DIR})
  find_path(ACCEL_NCCL_INCLUDE nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS})

  file(GLOB ACCEL_CUDA_C_SOURCES CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/src/backends/cuda/*.c)
  file(GLOB ACCEL_CUDA_KERNELS CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/src/backends/cuda/*.cu)
  set(ACCEL_CUDA_LIBS CUDA::cudart_static CUDA::cublasLt stdc++ dl)
  set(ACCEL_CUDA_DEFS ACCEL_HAVE_CUDA)
  if(ACCEL_NCCL_LIB AND ACCEL_NCCL_INCLUDE)
    list(APPEND ACCEL_CUDA_C_SOURCES ${CMAKE_SOURCE_DIR}/src/dist/nccl.c ${CMAKE_SOURCE_DIR}/src/dist/nccl_stage.c)
    list(APPEND ACCEL_CUDA_LIBS ${ACCEL_NCCL_LIB})
    list(APPEND ACCEL_CUDA_DEFS ACCEL_HAVE_NCCL)
  else()
    message(STATUS "accel: CUDA backend on, NCCL not found (no nccl process-group backend)")
  endif()

  # The kernels: nvcc's own flags, not the C compiler's warning list (nvcc
  # does not take -Wall; it passes host-compiler warnings with -Xcompiler).
  # No device link step (no separable compilation).
  add_library(accel_cuda_kernels OBJECT ${ACCEL_CUDA_KERNELS})
  set_target_properties(accel_cuda_kernels PROPERTIES
    COMPILE_OPTIONS "-Xcompiler=-Wall,-Wextra,-Wno-unused-parameter;-Werror=all-warnings"
    CUDA_STANDARD 17 POSITION_INDEPENDENT_CODE ON CUDA_VISIBILITY_PRESET hidden)
  target_include_directories(accel_cuda_kernels PRIVATE ${CMAKE_SOURCE_DIR}/include ${CMAKE_SOURCE_DIR}/src)

  # cudart static: the plug-in needs only the driver (libcuda), cuBLASLt and
  # NCCL at run time, and loads them only when it is loaded.
  accel_add_plugin(cuda ${ACCEL_CUDA_C_SOURCES} $<TARGET_OBJECTS:accel_cuda_kernels>)
  target_include_directories(accel-cuda PRIVATE ${ACCEL_NCCL_INCLUDE})
  target_compile_definitions(accel-cuda PRIVATE ${ACCEL_CUDA_DEFS})
  target_link_libraries(accel-cuda PRIVATE ${ACCEL_CUDA_LIBS})
  set_target_properties(accel-cuda PROPERTIES LINKER_LANGUAGE C)

  if(ACCEL_BACKENDS_STATIC)
    accel_link_backend_static(cuda ${ACCEL_CUDA_C_SOURCES})
    target_include_directories(accel_static_cuda PRIVATE ${ACCEL_NCCL_INCLUDE})
    target_compile_definitions(accel_static_cuda PRIVATE ${ACCEL_CUDA_DEFS})
    target_link_libraries(accel_static_cuda PRIVATE CUDA::cudart_static)
    target_sources(accel PRIVATE $<TARGET_OBJECTS:accel_cuda_kernels>)
    target_link_libraries(accel PRIVATE ${ACCEL_CUDA_LIBS})
    # accel.pc's Libs.private: what a static link needs besides.
    set(ACCEL_CUDA_PC_LIBS ${CUDA_cudart_static_LIBRARY} ${CUDA_cublasLt_LIBRARY} stdc++ dl)
    if(ACCEL_NCCL_LIB AND ACCEL_NCCL_INCLUDE)
      list(APPEND ACCEL_CUDA_PC_LIBS ${ACCEL_NCCL_LIB})
    endif()
  endif()
  # The GPU tests read the backend's internals (cuda_hooks.h) and skip
  # with its reason; they include no CUDA header.
  set(ACCEL_TEST_CUDA_DEFS ${ACCEL_CUDA_DEFS})
  message(STATUS "accel: CUDA plug-in on (nvcc ${CMAKE_CUDA_COMPILER_VERSION}, architectures ${ACCEL_CUDA_ARCHITECTURES})")
else()
  message(STATUS "accel: CUDA plug-in off")
endif()
