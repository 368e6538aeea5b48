# The wheel (pip install . / pip wheel .): libnccl_ep.so and libnccl_m2n.so go into the `nccl` package, next to the
# Python modules that load them with ctypes (python/nccl/_ext/_loader.py).
#
# NCCL: a Device API kernel runs only on the NCCL release it was compiled against, and a torch process already has
# one libnccl.so.2 loaded (the `nvidia-nccl-cu13` wheel). The libraries find it by rpath relative to the package
# ($ORIGIN/../../nvidia/nccl/lib) or through the loader's preload; the `[cu13]` extra pins that wheel to the release
# this build used, which is checked here so that a wheel never promises an NCCL it was not built for.
set(NCCL_EXT_WHEEL_NCCL_PIN "2.28.9" CACHE STRING "nvidia-nccl-cu13 version the [cu13] extra of pyproject.toml pins")
if(NOT NCCL_VERSION VERSION_EQUAL NCCL_EXT_WHEEL_NCCL_PIN AND NOT DEFINED ENV{NCCL_EXT_ALLOW_OTHER_NCCL})
  message(FATAL_ERROR "the wheel's [cu13] extra pins nvidia-nccl-cu13==${NCCL_EXT_WHEEL_NCCL_PIN} but this build "
                      "found NCCL ${NCCL_VERSION} (${NCCL_SOURCE}). Build against NCCL ${NCCL_EXT_WHEEL_NCCL_PIN} "
                      "(NCCL_HOME), change the pin in pyproject.toml and here together, or set "
                      "NCCL_EXT_ALLOW_OTHER_NCCL=1 to build a wheel whose extra does not match (the import then "
                      "refuses any other NCCL release)")
endif()
set(_rpath "$ORIGIN" "$ORIGIN/../../nvidia/nccl/lib" "$ORIGIN/../../nvidia/cu13/lib")
set_target_properties(nccl_ep nccl_m2n PROPERTIES INSTALL_RPATH "${_rpath}")
install(TARGETS nccl_ep nccl_m2n LIBRARY DESTINATION nccl/_lib)
configure_file(${CMAKE_SOURCE_DIR}/python/nccl/_ext/_build_info.py.in ${CMAKE_BINARY_DIR}/_build_info.py @ONLY)
install(FILES ${CMAKE_BINARY_DIR}/_build_info.py DESTINATION nccl/_ext)
