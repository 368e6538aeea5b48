# The NCCL release families this build serves (common/nccl_abi.h): one object library per family, compiled from
# common/nccl_abi_shim.cu against that family's headers, and common's table of them (nccl_abi_list.cc).
#
#   NCCL_EXT_NCCL_RELEASES   empty (make's default): the NCCL that FindNCCL found, alone; it serves its own release
#                            and the later patch releases of its family.
#                            "all" (pip install . / pip wheel .): NCCL_EXT_NCCL_MATRIX below.
#                            a list ("2.29.2;2.30.3"): those releases' headers, at most one release per family; each
#                            serves its release and the later patch releases of its family.
#   NCCL_EXT_NCCL_HEADERS    "VERSION=DIR;..." headers the user names (DIR/include or DIR itself); the others come
#                            from the found NCCL when it is that release, else from PyPI's nvidia-nccl-cu13 wheel of
#                            that version (tools/nccl_headers.py: headers only, about 0.1 MB each, cached in
#                            NCCL_EXT_HEADER_CACHE or ~/.cache/nccl-ext/nccl-headers).
# With several releases, every other source compiles against the oldest one's nccl.h, so that the libraries call
# nothing an older supported libnccl lacks (they link against the found one, which must be at least that release).
#
# Outputs: NCCL_EXT_ABI_OBJECTS (the object libraries), NCCL_EXT_ABI_LIST_SOURCE (the generated table),
#          NCCL_EXT_ABI_RELEASES (e.g. "2.28.9;2.29.2"; also cached as NCCL_EXT_ABI_RELEASES_BUILT).

# The oldest patch release of each family whose Device API structs every later patch of the family accepts (from
# 2.29.2 on NCCL accepts the older versions it lists); 2.28.9 for 2.28, whose 2.28.7 wheel lacks headers that
# nccl_device.h includes (doca_gpunetio).
set(NCCL_EXT_NCCL_MATRIX "2.28.9;2.29.2;2.30.3;2.31.2;2.32.3" CACHE STRING
    "The NCCL releases NCCL_EXT_NCCL_RELEASES=all builds for")
set(NCCL_EXT_NCCL_RELEASES "" CACHE STRING "NCCL releases to build for: empty (the found NCCL), all, or a list")
set(NCCL_EXT_NCCL_HEADERS "" CACHE STRING "VERSION=DIR;... folders with those releases' headers")
set(NCCL_EXT_HEADER_CACHE "" CACHE PATH "where fetched NCCL headers are kept (empty: tools/nccl_headers.py's default)")

if(NCCL_EXT_NCCL_RELEASES STREQUAL "")
  set(_releases "${NCCL_VERSION}")
elseif(NCCL_EXT_NCCL_RELEASES STREQUAL "all")
  set(_releases ${NCCL_EXT_NCCL_MATRIX})
else()
  set(_releases ${NCCL_EXT_NCCL_RELEASES})
endif()
list(SORT _releases COMPARE NATURAL)

find_package(Python3 COMPONENTS Interpreter)
set(NCCL_EXT_ABI_OBJECTS "")
set(NCCL_EXT_ABI_RELEASES "")
set(_decls "")
set(_entries "")
set(_families "")
foreach(_v IN LISTS _releases)
  if(NOT _v MATCHES "^([0-9]+)\\.([0-9]+)\\.([0-9]+)$")
    message(FATAL_ERROR "NCCL_EXT_NCCL_RELEASES: '${_v}' is not a release like 2.30.3")
  endif()
  set(_maj ${CMAKE_MATCH_1})
  set(_min ${CMAKE_MATCH_2})
  set(_pat ${CMAKE_MATCH_3})
  if(_v VERSION_LESS 2.28.7)
    message(FATAL_ERROR "NCCL ${_v}: the oldest release this project builds for is 2.28.7 (2.28.3's device "
                        "communicator is laid out otherwise)")
  endif()
  if("${_maj}.${_min}" IN_LIST _families)
    message(FATAL_ERROR "NCCL_EXT_NCCL_RELEASES: two releases of the ${_maj}.${_min} family (${_releases}): the "
                        "oldest serves them all")
  endif()
  list(APPEND _families "${_maj}.${_min}")

  # Where this release's headers are.
  set(_inc "")
  foreach(_pair IN LISTS NCCL_EXT_NCCL_HEADERS)
    if(_pair MATCHES "^${_v}=(.+)$")
      set(_dir_arg --dir "${CMAKE_MATCH_1}")
    endif()
  endforeach()
  if(NOT _dir_arg AND _v VERSION_EQUAL NCCL_VERSION)
    set(_inc "${NCCL_INCLUDE_DIR}")
  else()
    if(NOT Python3_Interpreter_FOUND)
      message(FATAL_ERROR "NCCL ${_v}'s headers: tools/nccl_headers.py needs python3 (or name them in "
                          "NCCL_EXT_NCCL_HEADERS)")
    endif()
    set(_cache_arg "")
    if(NCCL_EXT_HEADER_CACHE)
      set(_cache_arg --cache "${NCCL_EXT_HEADER_CACHE}")
    endif()
    execute_process(COMMAND "${Python3_EXECUTABLE}" "${CMAKE_SOURCE_DIR}/tools/nccl_headers.py" ${_v} ${_dir_arg}
                            ${_cache_arg}
                    OUTPUT_VARIABLE _inc ERROR_VARIABLE _err RESULT_VARIABLE _rc OUTPUT_STRIP_TRAILING_WHITESPACE)
    if(NOT _rc EQUAL 0)
      message(FATAL_ERROR "NCCL ${_v}'s headers: ${_err}Name a folder with them in NCCL_EXT_NCCL_HEADERS "
                          "(\"${_v}=/path\"), or leave the release out of NCCL_EXT_NCCL_RELEASES.")
    endif()
    if(_err)
      message(STATUS "${_err}")
    endif()
  endif()
  unset(_dir_arg)

  math(EXPR _code "${_maj} * 10000 + ${_min} * 100 + ${_pat}")
  math(EXPR _last "${_maj} * 10000 + ${_min} * 100 + 99")
  set(_name "ncclAbi_${_code}")
  set(_target "ncclext_abi_${_code}")
  add_library(${_target} OBJECT ${CMAKE_SOURCE_DIR}/common/nccl_abi_shim.cu)
  # Its own headers only (not NCCL::nccl's): -isystem ahead of everything else the target sees.
  target_include_directories(${_target} SYSTEM BEFORE PRIVATE "${_inc}")
  target_include_directories(${_target} PRIVATE ${CMAKE_SOURCE_DIR})
  target_compile_definitions(${_target} PRIVATE NCCL_EXT_ABI_NAME=${_name} NCCL_EXT_ABI_MIN=${_code}
                                                NCCL_EXT_ABI_MAX=${_last})
  target_link_libraries(${_target} PRIVATE CUDA::cudart)
  list(APPEND NCCL_EXT_ABI_OBJECTS ${_target})
  list(APPEND NCCL_EXT_ABI_RELEASES ${_v})
  string(APPEND _decls "extern const NcclAbi ${_name};\n")
  string(APPEND _entries "&${_name}, ")
  if(NOT _oldest_inc)
    set(_oldest_inc "${_inc}")
  endif()
  message(STATUS "NCCL ${_v} headers (${_inc}): serves NCCL ${_v} to ${_maj}.${_min}.99")
endforeach()

set(NCCL_EXT_ABI_RELEASES_BUILT "${NCCL_EXT_ABI_RELEASES}" CACHE INTERNAL "for tools/gpu_check_report.py")
set(NCCL_EXT_ABI_LIST_SOURCE ${CMAKE_BINARY_DIR}/generated/nccl_abi_list.cc)
file(CONFIGURE OUTPUT ${NCCL_EXT_ABI_LIST_SOURCE} CONTENT
"// Written by cmake/NcclAbi.cmake: the NCCL release families this build serves, oldest first.
#include \"common/nccl_abi.h\"

namespace ncclext {
${_decls}
const NcclAbi* const* builtNcclAbis() {
  static const NcclAbi* const abis[] = {${_entries}nullptr};
  return abis;
}

}  // namespace ncclext
")

# Several releases: everything else sees the oldest one's headers (see above).
list(LENGTH _releases _n)
if(_n GREATER 1)
  set_target_properties(NCCL::nccl PROPERTIES INTERFACE_SYSTEM_INCLUDE_DIRECTORIES "${_oldest_inc}"
                                              INTERFACE_INCLUDE_DIRECTORIES "${_oldest_inc}")
  list(GET _releases 0 _oldest)
  if(NCCL_VERSION VERSION_LESS _oldest)
    message(FATAL_ERROR "the libraries link against NCCL ${NCCL_VERSION} (${NCCL_SOURCE}), older than the oldest "
                        "release they are built for (${_oldest}): point NCCL_HOME at a newer one")
  endif()
endif()
unset(_oldest_inc)
