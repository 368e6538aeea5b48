# Locates NCCL for a Device API build and defines the imported target NCCL::nccl.
#
# Search order (the first candidate holding include/nccl.h + include/nccl_device.h and a libnccl.so[.2] wins):
#   1. NCCL_HOME (CMake variable or environment variable)
#   2. the CUDA toolkit (CUDAToolkit_INCLUDE_DIRS / CUDAToolkit_LIBRARY_DIR)
#   3. PyTorch's wheel: python3 -c 'import nvidia.nccl' (ships include/ and only lib/libnccl.so.2)
# NCCL older than 2.28 (the first release with the Device API) is refused.
#
# Outputs: NCCL_FOUND, NCCL_INCLUDE_DIR, NCCL_LIBRARY, NCCL_LIBRARY_DIR, NCCL_VERSION, NCCL_VERSION_CODE, NCCL_SOURCE.

set(_nccl_candidates "")
if(NCCL_HOME)
  list(APPEND _nccl_candidates "${NCCL_HOME}|NCCL_HOME")
elseif(DEFINED ENV{NCCL_HOME} AND NOT "$ENV{NCCL_HOME}" STREQUAL "")
  list(APPEND _nccl_candidates "$ENV{NCCL_HOME}|NCCL_HOME")
endif()
foreach(_inc IN LISTS CUDAToolkit_INCLUDE_DIRS)
  get_filename_component(_root "${_inc}" DIRECTORY)
  list(APPEND _nccl_candidates "${_root}|CUDA toolkit")
endforeach()
if(CUDAToolkit_LIBRARY_ROOT)
  list(APPEND _nccl_candidates "${CUDAToolkit_LIBRARY_ROOT}|CUDA toolkit")
endif()
find_program(_nccl_python NAMES python3 python)
if(_nccl_python)
  execute_process(
    COMMAND "${_nccl_python}" -c "import nvidia.nccl as m; print(list(m.__path__)[0])"
    OUTPUT_VARIABLE _nccl_wheel OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE _nccl_py_rc)
  if(_nccl_py_rc EQUAL 0 AND _nccl_wheel)
    list(APPEND _nccl_candidates "${_nccl_wheel}|PyTorch wheel nvidia.nccl")
  endif()
endif()

set(NCCL_FOUND FALSE)
foreach(_cand IN LISTS _nccl_candidates)
  string(REPLACE "|" ";" _pair "${_cand}")
  list(GET _pair 0 _root)
  list(GET _pair 1 _what)
  set(_inc "")
  foreach(_d "${_root}/include" "${_root}/targets/x86_64-linux/include" "${_root}/targets/sbsa-linux/include")
    if(EXISTS "${_d}/nccl.h" AND EXISTS "${_d}/nccl_device.h")
      set(_inc "${_d}")
      break()
    endif()
  endforeach()
  set(_lib "")
  foreach(_d "${_root}/lib64" "${_root}/lib" "${_root}/targets/x86_64-linux/lib" "${_root}/targets/sbsa-linux/lib")
    if(EXISTS "${_d}/libnccl.so.2")
      set(_lib "${_d}/libnccl.so.2")
      break()
    elseif(EXISTS "${_d}/libnccl.so")
      set(_lib "${_d}/libnccl.so")
      break()
    endif()
  endforeach()
  if(_inc AND _lib)
    set(NCCL_INCLUDE_DIR "${_inc}")
    set(NCCL_LIBRARY "${_lib}")
    set(NCCL_SOURCE "${_what} (${_root})")
    set(NCCL_FOUND TRUE)
    break()
  endif()
endforeach()

if(NOT NCCL_FOUND)
  message(FATAL_ERROR "NCCL >= 2.28 with the Device API headers (nccl_device.h) was not found. Looked in: "
                      "${_nccl_candidates}. Set NCCL_HOME to a folder with include/nccl.h and lib/libnccl.so.2.")
endif()

file(STRINGS "${NCCL_INCLUDE_DIR}/nccl.h" _maj REGEX "^#define NCCL_MAJOR +[0-9]+")
file(STRINGS "${NCCL_INCLUDE_DIR}/nccl.h" _min REGEX "^#define NCCL_MINOR +[0-9]+")
file(STRINGS "${NCCL_INCLUDE_DIR}/nccl.h" _pat REGEX "^#define NCCL_PATCH +[0-9]+")
string(REGEX REPLACE ".* ([0-9]+)$" "\\1" _maj "${_maj}")
string(REGEX REPLACE ".* ([0-9]+)$" "\\1" _min "${_min}")
string(REGEX REPLACE ".* ([0-9]+)$" "\\1" _pat "${_pat}")
set(NCCL_VERSION "${_maj}.${_min}.${_pat}")
if(NCCL_VERSION VERSION_LESS 2.28.0)
  message(FATAL_ERROR "NCCL ${NCCL_VERSION} at ${NCCL_INCLUDE_DIR} is too old: the Device API (symmetric memory "
                      "windows, LSA) needs NCCL >= 2.28. Point NCCL_HOME at a newer NCCL.")
endif()
math(EXPR NCCL_VERSION_CODE "${_maj} * 10000 + ${_min} * 100 + ${_pat}")
get_filename_component(NCCL_LIBRARY_DIR "${NCCL_LIBRARY}" DIRECTORY)

if(NOT TARGET NCCL::nccl)
  add_library(NCCL::nccl SHARED IMPORTED)
  set_target_properties(NCCL::nccl PROPERTIES
    IMPORTED_LOCATION "${NCCL_LIBRARY}"
    IMPORTED_SONAME "libnccl.so.2"
    INTERFACE_SYSTEM_INCLUDE_DIRECTORIES "${NCCL_INCLUDE_DIR}"
    INTERFACE_INCLUDE_DIRECTORIES "${NCCL_INCLUDE_DIR}"
    INTERFACE_LINK_LIBRARIES CUDA::cudart)  # nccl.h includes cuda_runtime.h
endif()
message(STATUS "NCCL ${NCCL_VERSION} from ${NCCL_SOURCE}: ${NCCL_LIBRARY}")
