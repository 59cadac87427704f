# Backend plug-ins (src/backends/plugin.h): each device backend other than the
# CPU is a shared object of its own, lib/accel/libaccel-<name>.so in the
# build tree and in the install, loaded by the core the first time its device
# type is asked for. A plug-in links no part of accel: the core functions it
# calls come through the table its init receives (src/backends/plugin_shims.c).
#
# ACCEL_BACKENDS_STATIC=ON also links the backends' code into libaccel.a
# (one binary with its backends; libaccel.so never carries them), where the
# loader calls their init directly.

option(ACCEL_BACKENDS_STATIC "Also link the backend plug-ins' code into the static library" OFF)
set(ACCEL_PLUGIN_DIR ${CMAKE_BINARY_DIR}/lib/accel)
set(ACCEL_PLUGIN_SOURCE_REGEX "/src/backends/cuda/|/src/dist/nccl(_stage)?\\.c$|/src/dist/mpi(_plugin)?\\.c$|/src/backends/hostless/hostless\\.c$|/src/backends/cpu/(gemm_dnnl|conv_dnnl|dnnl_plugin)\\.c$|/src/backends/plugin_shims\\.c$")

# The headers core and plug-ins share (every structure and table passed
# between them): the hash of their text is part of ACCEL__PLUGIN_LAYOUT
# (src/backends/plugin.h), so a plug-in built against other headers, even ones
# with a field reordered, is refused. Re-hashed whenever one changes.
file(GLOB ACCEL_PLUGIN_SHARED_HEADERS ${CMAKE_SOURCE_DIR}/include/accel/*.h)
foreach(h backends/plugin.h core/cpuinfo.h core/env.h core/dtype_elem.h core/backend.h core/kernels.h
          backends/vm_pool.h backends/fp8.h backends/cpu/cpu_kernels.h backends/cpu/gemm.h
          backends/cpu/dnnl_hooks.h backends/hostless/hostless.h backends/cuda/cuda_hooks.h backends/registry.h
          dist/backend.h dist/store.h)
  list(APPEND ACCEL_PLUGIN_SHARED_HEADERS ${CMAKE_SOURCE_DIR}/src/${h})
endforeach()
list(SORT ACCEL_PLUGIN_SHARED_HEADERS)
set(_text "")
foreach(h ${ACCEL_PLUGIN_SHARED_HEADERS})
  file(READ ${h} _one)
  string(APPEND _text "${h}\n${_one}")
endforeach()
string(SHA256 _hash "${_text}")
string(SUBSTRING ${_hash} 0 8 _hash)
set(ACCEL_PLUGIN_LAYOUT_DEF ACCEL__PLUGIN_HEADERS_HASH=0x${_hash}u)
set_property(DIRECTORY ${CMAKE_SOURCE_DIR} APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${ACCEL_PLUGIN_SHARED_HEADERS})

# accel_add_plugin(NAME SOURCES...): libaccel-NAME.so from SOURCES (+ the shims).
function(accel_add_plugin name)
  set(target accel-${name})
  add_library(${target} MODULE ${ARGN} ${CMAKE_SOURCE_DIR}/src/backends/plugin_shims.c)
  set_target_properties(${target} PROPERTIES PREFIX lib OUTPUT_NAME accel-${name}
    LIBRARY_OUTPUT_DIRECTORY ${ACCEL_PLUGIN_DIR} C_VISIBILITY_PRESET hidden
    LINK_DEPENDS ${CMAKE_SOURCE_DIR}/cmake/plugin.map)
  target_include_directories(${target} PRIVATE ${CMAKE_SOURCE_DIR}/include ${CMAKE_SOURCE_DIR}/src)
  target_compile_definitions(${target} PRIVATE ACCEL__PLUGIN_SHIMS ACCEL__INSIDE_LIBRARY ${ACCEL_PLUGIN_LAYOUT_DEF})
  if(ACCEL_HAVE_NO_SEMANTIC_INTERPOSITION)
    target_compile_options(${target} PRIVATE -fno-semantic-interposition)
  endif()
  target_link_libraries(${target} PRIVATE Threads::Threads m)
  target_link_options(${target} PRIVATE -Wl,--version-script=${CMAKE_SOURCE_DIR}/cmake/plugin.map)
  if(NOT ACCEL_SANITIZE)
    target_link_options(${target} PRIVATE -Wl,-z,defs) # every symbol it uses is its own or a linked library's
  endif()
  install(TARGETS ${target} LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}/accel)
  # Whatever builds the library builds its plug-ins: a program of this tree
  # finds them at run time in lib/accel.
  add_dependencies(accel ${target})
endfunction()

# accel_link_backend_static(NAME SOURCES...): ACCEL_BACKENDS_STATIC's half.
function(accel_link_backend_static name)
  if(ACCEL_BACKENDS_STATIC)
    string(TOUPPER ${name} up)
    add_library(accel_static_${name} OBJECT ${ARGN})
    target_include_directories(accel_static_${name} PRIVATE ${CMAKE_SOURCE_DIR}/include ${CMAKE_SOURCE_DIR}/src)
    target_compile_definitions(accel_static_${name} PRIVATE ACCEL__INSIDE_LIBRARY ${ACCEL_PLUGIN_LAYOUT_DEF})
    set_target_properties(accel_static_${name} PROPERTIES POSITION_INDEPENDENT_CODE ON)
    target_sources(accel PRIVATE $<TARGET_OBJECTS:accel_static_${name}>)
    set_property(GLOBAL APPEND PROPERTY ACCEL_STATIC_BACKEND_DEFS ACCEL_STATIC_${up})
  endif()
endfunction()

# After every plug-in is declared (CMakeLists.txt calls it): with
# ACCEL_BACKENDS_STATIC the loader is compiled twice, calling the built-in
# inits in libaccel.a and loading files in libaccel.so, which never carries a
# backend. ACCEL_SHARED_LOADER_OBJECTS: what libaccel.so adds to accel's objects.
function(accel_finish_plugins)
  set(ACCEL_SHARED_LOADER_OBJECTS "" PARENT_SCOPE)
  if(NOT ACCEL_BACKENDS_STATIC)
    return()
  endif()
  set(loader ${CMAKE_SOURCE_DIR}/src/backends/plugin.c)
  get_target_property(srcs accel SOURCES)
  list(REMOVE_ITEM srcs ${loader})
  set_target_properties(accel PROPERTIES SOURCES "${srcs}")
  get_property(defs GLOBAL PROPERTY ACCEL_STATIC_BACKEND_DEFS)
  foreach(kind static shared)
    add_library(accel_loader_${kind} OBJECT ${loader})
    target_include_directories(accel_loader_${kind} PRIVATE ${CMAKE_SOURCE_DIR}/include ${CMAKE_SOURCE_DIR}/src)
    target_compile_definitions(accel_loader_${kind} PRIVATE ACCEL__INSIDE_LIBRARY)
    set_target_properties(accel_loader_${kind} PROPERTIES POSITION_INDEPENDENT_CODE ON)
  endforeach()
  target_compile_definitions(accel_loader_static PRIVATE ${defs})
  target_sources(accel PRIVATE $<TARGET_OBJECTS:accel_loader_static>)
  set(ACCEL_SHARED_LOADER_OBJECTS $<TARGET_OBJECTS:accel_loader_shared> PARENT_SCOPE)
endfunction()

# The core library never holds a plug-in's sources.
get_target_property(ACCEL__SRCS accel SOURCES)
list(FILTER ACCEL__SRCS EXCLUDE REGEX "${ACCEL_PLUGIN_SOURCE_REGEX}")
set_target_properties(accel PROPERTIES SOURCES "${ACCEL__SRCS}")
# Where an installed library looks for its plug-ins besides its own directory.
set_property(SOURCE ${CMAKE_SOURCE_DIR}/src/backends/plugin.c APPEND PROPERTY
  COMPILE_DEFINITIONS "ACCEL_PLUGIN_INSTALL_DIR=\"${CMAKE_INSTALL_FULL_LIBDIR}/accel\"" ${ACCEL_PLUGIN_LAYOUT_DEF})

# mpi: the MPI process group (src/dist/mpi.c), when CMake finds MPI. The
# core keeps ACCEL_HAVE_MPI: it knows the plug-in exists (want_mpi, the
# list of backends) and links no MPI library.
if(MPI_C_FOUND)
  set(ACCEL_MPI_SOURCES ${CMAKE_SOURCE_DIR}/src/dist/mpi.c ${CMAKE_SOURCE_DIR}/src/dist/mpi_plugin.c)
  accel_add_plugin(mpi ${ACCEL_MPI_SOURCES})
  target_compile_definitions(accel-mpi PRIVATE ACCEL_HAVE_MPI)
  target_link_libraries(accel-mpi PRIVATE MPI::MPI_C)
  accel_link_backend_static(mpi ${ACCEL_MPI_SOURCES})
  if(ACCEL_BACKENDS_STATIC)
    target_compile_definitions(accel_static_mpi PRIVATE ACCEL_HAVE_MPI)
    target_link_libraries(accel_static_mpi PRIVATE MPI::MPI_C)
    target_link_libraries(accel PRIVATE MPI::MPI_C)
  endif()
endif()

# dnnl: oneDNN's GEMM provider and convolution (src/backends/cpu/gemm_dnnl.c,
# conv_dnnl.c, dnnl_hooks.h),
# when oneDNN is found; the core's dnnl_client.c forwards to it.
if(ACCEL_HAVE_DNNL)
  set(ACCEL_DNNL_SOURCES ${CMAKE_SOURCE_DIR}/src/backends/cpu/gemm_dnnl.c
    ${CMAKE_SOURCE_DIR}/src/backends/cpu/conv_dnnl.c
    ${CMAKE_SOURCE_DIR}/src/backends/cpu/dnnl_plugin.c)
  accel_add_plugin(dnnl ${ACCEL_DNNL_SOURCES})
  target_include_directories(accel-dnnl PRIVATE ${DNNL_INCLUDE_DIR})
  target_link_libraries(accel-dnnl PRIVATE ${DNNL_LIB} OpenMP::OpenMP_C)
  accel_link_backend_static(dnnl ${ACCEL_DNNL_SOURCES})
  if(ACCEL_BACKENDS_STATIC)
    target_include_directories(accel_static_dnnl PRIVATE ${DNNL_INCLUDE_DIR})
    target_link_libraries(accel_static_dnnl PRIVATE OpenMP::OpenMP_C)
    target_link_libraries(accel PRIVATE ${DNNL_LIB})
  endif()
endif()

# hostless: the test device (src/backends/hostless), a plug-in in every build
# so that every test run goes through the loading path.
set(ACCEL_HOSTLESS_SOURCES ${CMAKE_SOURCE_DIR}/src/backends/hostless/hostless.c)
accel_add_plugin(hostless ${ACCEL_HOSTLESS_SOURCES})
accel_link_backend_static(hostless ${ACCEL_HOSTLESS_SOURCES})
