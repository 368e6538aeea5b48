"""Shared by nccl.ep and nccl.m2n: loading the C libraries, errors, communicators, tensors (private).

The layer is ctypes over the C ABI: no compiled extension and no libtorch, so one wheel serves every torch version.
torch is imported only by the parts that take torch objects (tensors, process groups, streams).
"""
