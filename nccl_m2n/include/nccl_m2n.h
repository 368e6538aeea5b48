/*
 * nccl_m2n public C API. The only installed header of libnccl_m2n; C99-clean.
 *
 * Every function returns ncclResult_t; on failure ncclM2nGetLastError() explains it. No call asserts, exits,
 * aborts or lets an exception escape.
 */
#ifndef NCCL_M2N_H_
#define NCCL_M2N_H_

#include <nccl.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define NCCL_M2N_API __attribute__((visibility("default")))
#else
#define NCCL_M2N_API
#endif

#define NCCL_M2N_MAJOR 0
#define NCCL_M2N_MINOR 1
#define NCCL_M2N_PATCH 0
/* major * 10000 + minor * 100 + patch */
#define NCCL_M2N_VERSION_CODE (NCCL_M2N_MAJOR * 10000 + NCCL_M2N_MINOR * 100 + NCCL_M2N_PATCH)

/* The library's version code (NCCL_M2N_VERSION_CODE of the build). Local; never blocks. */
NCCL_M2N_API ncclResult_t ncclM2nGetVersion(int* version);

/* The NCCL version the library was compiled against and the one loaded in this process (either pointer may be
 * NULL). Returns ncclInvalidUsage when they are different releases: Device API kernels run only on the NCCL
 * release whose headers compiled them. Local; never blocks. */
NCCL_M2N_API ncclResult_t ncclM2nCheckNcclRuntime(int* builtVersion, int* loadedVersion);

/* Text of the last failure of a ncclM2n* call on the calling thread; "" if none. Valid until the next call. */
NCCL_M2N_API const char* ncclM2nGetLastError(void);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* NCCL_M2N_H_ */
