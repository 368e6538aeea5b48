# common/ is compiled into each library on its own (static, hidden symbols), tagged with the library's name so
# that log lines and last-error texts say which library wrote them. The same sources, tagged "test", back the
# host unit tests and the GPU tests.
set(NCCL_EXT_COMMON_SOURCES
  ${CMAKE_SOURCE_DIR}/common/status.cc
  ${CMAKE_SOURCE_DIR}/common/log.cc
  ${CMAKE_SOURCE_DIR}/common/env.cc
  ${CMAKE_SOURCE_DIR}/common/version.cc
  ${CMAKE_SOURCE_DIR}/common/nccl_abi.cc
  ${NCCL_EXT_ABI_LIST_SOURCE}
  ${CMAKE_SOURCE_DIR}/common/topology.cc
  ${CMAKE_SOURCE_DIR}/common/domain.cc
  ${CMAKE_SOURCE_DIR}/common/virtual_domain.cc
  ${CMAKE_SOURCE_DIR}/common/symmetric_memory.cc
  ${CMAKE_SOURCE_DIR}/common/device_status.cc
  ${CMAKE_SOURCE_DIR}/common/watchdog.cc)

function(ncclext_add_common target tag)
  set(_abi_objects "")
  foreach(_abi IN LISTS NCCL_EXT_ABI_OBJECTS)  # cmake/NcclAbi.cmake: one per NCCL release family
    list(APPEND _abi_objects $<TARGET_OBJECTS:${_abi}>)
  endforeach()
  add_library(${target} STATIC ${NCCL_EXT_COMMON_SOURCES} ${_abi_objects})
  target_include_directories(${target} PUBLIC ${CMAKE_SOURCE_DIR})
  target_compile_definitions(${target} PUBLIC NCCL_EXT_LIB_TAG="${tag}")
  target_link_libraries(${target} PUBLIC NCCL::nccl CUDA::cudart Threads::Threads ${CMAKE_DL_LIBS})
endfunction()

# Copies a public header into build/include so that build/ alone is a usable install tree.
function(ncclext_public_header target header)
  get_filename_component(_name ${header} NAME)
  add_custom_command(OUTPUT ${CMAKE_BINARY_DIR}/include/${_name}
    COMMAND ${CMAKE_COMMAND} -E copy_if_different ${header} ${CMAKE_BINARY_DIR}/include/${_name}
    DEPENDS ${header})
  get_filename_component(_stem ${header} NAME_WE)
  add_custom_target(${_stem}_header DEPENDS ${CMAKE_BINARY_DIR}/include/${_name})
  add_dependencies(${target} ${_stem}_header)
endfunction()
