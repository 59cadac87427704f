# `cmake --install build [--prefix P]` (and `make install PREFIX=P DESTDIR=D`):
#   include/accel/*.h
#   lib/libaccel.so.0 (+ libaccel.so), lib/libaccel.a
#   lib/pkgconfig/accel.pc            cc prog.c $(pkg-config --cflags --libs accel)
#   lib/cmake/accel/accelConfig.cmake find_package(accel): accel::accel (shared, CPU
#                                     only to link against), accel::accel_static
#   bin/accel                         the launcher / CLI
#   lib/accel/libaccel-<name>.so      the device backend plug-ins (cuda, hostless),
#                                     loaded at run time (src/backends/plugin.h)
# accel.pc finds its prefix from its own location (${pcfiledir}), so it stays
# right for any --prefix given at install time and under DESTDIR.
include(CMakePackageConfigHelpers)

install(TARGETS accel accel_shared EXPORT accelTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
if(TARGET accel_cli)
  install(TARGETS accel_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()
install(DIRECTORY ${CMAKE_SOURCE_DIR}/include/accel DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
  FILES_MATCHING PATTERN "*.h")

# ---- accel.pc

# Linker flags for a list of libraries given as full paths or names:
# -L<dir> (unless the compiler searches it anyway) -l<name>.
function(accel_pc_link_flags out)
  set(flags "")
  foreach(lib ${ARGN})
    if(IS_ABSOLUTE "${lib}")
      get_filename_component(dir "${lib}" DIRECTORY)
      get_filename_component(name "${lib}" NAME_WE)
      string(REGEX REPLACE "^lib" "" name "${name}")
      list(FIND CMAKE_C_IMPLICIT_LINK_DIRECTORIES "${dir}" implicit)
      if(implicit EQUAL -1 AND NOT "-L${dir}" IN_LIST flags)
        list(APPEND flags "-L${dir}")
      endif()
      list(APPEND flags "-l${name}")
    else()
      list(APPEND flags "-l${lib}")
    endif()
  endforeach()
  list(JOIN flags " " flags)
  set(${out} "${flags}" PARENT_SCOPE)
endfunction()

set(ACCEL_PC_REQUIRES_PRIVATE "jansson yaml-0.1 libprotobuf-c zlib libpcre2-8 libutf8proc nettle")
set(pc_libs ${OpenMP_C_LIBRARIES})
if(MPI_C_FOUND AND ACCEL_BACKENDS_STATIC)
  list(APPEND pc_libs ${MPI_C_LIBRARIES})
endif()
if(ACCEL_HAVE_DNNL AND ACCEL_BACKENDS_STATIC)
  list(APPEND pc_libs ${DNNL_LIB})
endif()
list(APPEND pc_libs ${ACCEL_CUDA_PC_LIBS} ${CMAKE_DL_LIBS} rt m)
accel_pc_link_flags(ACCEL_PC_LIBS_PRIVATE ${pc_libs})
string(STRIP "${ACCEL_PC_LIBS_PRIVATE} ${CMAKE_THREAD_LIBS_INIT}" ACCEL_PC_LIBS_PRIVATE)
file(RELATIVE_PATH ACCEL_PC_TO_PREFIX "/prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/prefix")
string(REGEX REPLACE "/$" "" ACCEL_PC_TO_PREFIX "${ACCEL_PC_TO_PREFIX}")
configure_file(${CMAKE_SOURCE_DIR}/accel.pc.in ${CMAKE_BINARY_DIR}/accel.pc @ONLY)
install(FILES ${CMAKE_BINARY_DIR}/accel.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

# ---- find_package(accel)

set(ACCEL_CONFIG_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/accel)
set(ACCEL_WITH_MPI OFF)
if(MPI_C_FOUND AND ACCEL_BACKENDS_STATIC)
  set(ACCEL_WITH_MPI ON)
endif()
install(EXPORT accelTargets NAMESPACE accel:: DESTINATION ${ACCEL_CONFIG_DIR})
configure_package_config_file(${CMAKE_SOURCE_DIR}/cmake/accelConfig.cmake.in
  ${CMAKE_BINARY_DIR}/accelConfig.cmake INSTALL_DESTINATION ${ACCEL_CONFIG_DIR})
# 0.x: a minor version may break the API.
write_basic_package_version_file(${CMAKE_BINARY_DIR}/accelConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/accelConfig.cmake ${CMAKE_BINARY_DIR}/accelConfigVersion.cmake
  DESTINATION ${ACCEL_CONFIG_DIR})
