/*
 * nccl_ep public C API. The only installed header of libnccl_ep; C99-clean.
 *
 * Every function returns ncclResult_t; on failure ncclEpGetLastError() explains it. No call asserts, exits,
 * aborts or lets an exception escape.
 */
#ifndef NCCL_EP_H_
#define NCCL_EP_H_

#include <nccl.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define NCCL_EP_API __attribute__((visibility("default")))
#else
#define NCCL_EP_API
#endif

#define NCCL_EP_MAJOR 0
#define NCCL_EP_MINOR 1
#define NCCL_EP_PATCH 0
/* major * 10000 + minor * 100 + patch */
#define NCCL_EP_VERSION_CODE (NCCL_EP_MAJOR * 10000 + NCCL_EP_MINOR * 100 + NCCL_EP_PATCH)

/* The library's version code (NCCL_EP_VERSION_CODE of the build). Local; never blocks. */
NCCL_EP_API ncclResult_t ncclEpGetVersion(int* version);

/* The NCCL version the library was compiled against and the one loaded in this process (either pointer may be
 * NULL). Returns ncclInvalidUsage when they are different releases: Device API kernels run only on the NCCL
 * release whose headers compiled them. Local; never blocks. */
NCCL_EP_API ncclResult_t ncclEpCheckNcclRuntime(int* builtVersion, int* loadedVersion);

/* Text of the last failure of a ncclEp* call on the calling thread; "" if none. Valid until the next call. */
NCCL_EP_API const char* ncclEpGetLastError(void);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* NCCL_EP_H_ */
