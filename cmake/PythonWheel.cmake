# The wheel (pip install . / pip wheel .): libnccl_ep.so and libnccl_m2n.so go into the `nccl` package, next to the
# Python modules that load them with ctypes (python/nccl/_ext/_loader.py).
#
# NCCL: one wheel serves every release family it was built for (pyproject.toml sets NCCL_EXT_NCCL_RELEASES=all;
# cmake/NcclAbi.cmake): the libraries use the libnccl.so.2 the process already has (torch's `nvidia-nccl-cu13`
# wheel) and pick the part built for its family at first use. They find it by rpath relative to the package
# ($ORIGIN/../../nvidia/nccl/lib) or through the loader's preload; the `[cu13]` extra asks for any supported release.
set(_rpath "$ORIGIN" "$ORIGIN/../../nvidia/nccl/lib" "$ORIGIN/../../nvidia/cu13/lib")
set_target_properties(nccl_ep nccl_m2n PROPERTIES INSTALL_RPATH "${_rpath}")
install(TARGETS nccl_ep nccl_m2n LIBRARY DESTINATION nccl/_lib)
string(REPLACE ";" " " NCCL_EXT_ABI_RELEASES_TEXT "${NCCL_EXT_ABI_RELEASES}")
string(REPLACE ";" " " NCCL_EXT_CUDA_ARCHS_TEXT "${CMAKE_CUDA_ARCHITECTURES}")
configure_file(${CMAKE_SOURCE_DIR}/python/nccl/_ext/_build_info.py.in ${CMAKE_BINARY_DIR}/_build_info.py @ONLY)
install(FILES ${CMAKE_BINARY_DIR}/_build_info.py DESTINATION nccl/_ext)
