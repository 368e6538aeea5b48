/*
 * nccl_m2n public C API. The only installed header of libnccl_m2n; C99-clean.
 *
 * Every function returns ncclResult_t; on failure ncclM2nGetLastError() explains it. No call asserts, exits,
 * aborts or lets an exception escape.
 */
#ifndef NCCL_M2N_H_
#define NCCL_M2N_H_

#include <nccl.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define NCCL_M2N_API __attribute__((visibility("default")))
#else
#define NCCL_M2N_API
#endif
/* An enum is an int. In C++ its underlying type is int too, so that any int a C caller stores, an unknown value
 * included, is a value of the type that the library reads and refuses (C++ leaves other enums' values outside their
 * enumerators undefined). */
#if defined(__cplusplus)
#define NCCL_M2N_ENUM enum : int
#else
#define NCCL_M2N_ENUM enum
#endif

#define NCCL_M2N_MAJOR 0
#define NCCL_M2N_MINOR 1
#define NCCL_M2N_PATCH 0
/* major * 10000 + minor * 100 + patch */
#define NCCL_M2N_VERSION_CODE (NCCL_M2N_MAJOR * 10000 + NCCL_M2N_MINOR * 100 + NCCL_M2N_PATCH)

/* The library's version code (NCCL_M2N_VERSION_CODE of the build). Local; never blocks. */
NCCL_M2N_API ncclResult_t ncclM2nGetVersion(int* version);

/* The NCCL loaded in this process and the release whose headers compiled the part of this library that serves it
 * (either pointer may be NULL; built is 0 when no part does). One build serves several NCCL release families (the
 * device communicator's structs are laid out per family; everything else is the same binary): returns
 * ncclInvalidUsage, with a message naming the loaded release and the supported ones, when it does not serve the
 * loaded one. Local; never blocks. */
NCCL_M2N_API ncclResult_t ncclM2nCheckNcclRuntime(int* builtVersion, int* loadedVersion);

/* Text of the last failure of a ncclM2n* call on the calling thread; "" if none. Valid until the next call. */
NCCL_M2N_API const char* ncclM2nGetLastError(void);

/* ------------------------------------------------------------------------------------------------------------
 * Layouts. A layout says which part of a global tensor each rank holds:
 *   mesh        an N-D array (1..NCCL_M2N_MAX_MESH_DIMS axes) of communicator ranks, listed row-major; any subset
 *               of the communicator, in any order, no rank twice. Source and destination meshes may be disjoint
 *               (trainer -> inference) or overlap (co-located).
 *   placements  one per mesh axis: NCCL_M2N_REPLICATE or NCCL_M2N_SHARD(dim). Shards follow torch.chunk: the
 *               chunk is ceil(n / parts) and trailing shards may be short or empty. Several axes may shard, the
 *               same dim included; they apply in mesh-axis order (as DTensor does).
 *   boxes       instead of placements, an explicit (offset, shape) per mesh position; identical boxes are
 *               replicas. Destination boxes may overlap (each rank receives its whole box). Source boxes may
 *               overlap or leave gaps, but every element of every destination box must lie in some source box:
 *               else ncclM2nHostPlanCreate fails with ncclInvalidArgument (it would never be written).
 *   localStrides NULL (each rank's local tensor is row-major over its own box) or meshSize x ndims element
 *               strides, position-major: non-contiguous local tensors. Destination strides must not alias.
 * All arrays are borrowed for the duration of the call.
 * ------------------------------------------------------------------------------------------------------------ */
#define NCCL_M2N_MAX_TENSOR_DIMS 8
#define NCCL_M2N_MAX_MESH_DIMS 8
#define NCCL_M2N_REPLICATE (-1)
#define NCCL_M2N_SHARD(dim) (dim)
#define NCCL_M2N_MAGIC 0x6d326e31u /* 'm2n1' */

typedef struct {
  size_t size;        /* sizeof(ncclM2nMesh_t) */
  unsigned int magic; /* NCCL_M2N_MAGIC */
  int ndims;
  const int* dims;    /* ndims axis sizes */
  const int* ranks;   /* prod(dims) communicator ranks, row-major */
} ncclM2nMesh_t;
#define NCCL_M2N_MESH_INITIALIZER {sizeof(ncclM2nMesh_t), NCCL_M2N_MAGIC, 0, NULL, NULL}

typedef struct {
  int64_t offset[NCCL_M2N_MAX_TENSOR_DIMS];
  int64_t shape[NCCL_M2N_MAX_TENSOR_DIMS];
} ncclM2nBox_t;

typedef struct {
  size_t size;        /* sizeof(ncclM2nLayout_t) */
  unsigned int magic; /* NCCL_M2N_MAGIC */
  int ndims;                    /* tensor rank, 1..NCCL_M2N_MAX_TENSOR_DIMS */
  const int64_t* globalShape;   /* ndims entries */
  ncclDataType_t dtype;
  const ncclM2nMesh_t* mesh;
  const int* placements;        /* mesh->ndims entries; ignored when boxes != NULL */
  const ncclM2nBox_t* boxes;    /* NULL, or one per mesh position */
  const int64_t* localStrides;  /* NULL, or meshSize * ndims */
} ncclM2nLayout_t;
#define NCCL_M2N_LAYOUT_INITIALIZER {sizeof(ncclM2nLayout_t), NCCL_M2N_MAGIC, 0, NULL, ncclBfloat16, NULL, NULL, NULL, NULL}

/* One tensor of a batch: the same global shape on both sides, and the same dtype or one the executor converts to
 * (fp32 -> bf16, bf16 -> fp32; converted where the source is read). Byte counts below are of destination-typed
 * elements, as the wire carries them.
 * fp8: a bf16 or fp32 source with an ncclFloat8e4m3 destination is quantised with one fp32 scale per block of 128
 * columns of the last dim, and of fp8BlockRows rows of the dim before it (the config's: 1, or 128 for 128 x 128
 * weight blocks as DeepSeek-V3's checkpoints have them): the block's largest magnitude / 448, at least 1e-4 / 448;
 * values divided by it, rounded to nearest even, saturating. The next entry of the batch must then have src and dst
 * both NULL: its scales, a destination tensor of the shape in blocks ([..., ceil(R / rows), ceil(C / 128)]) fp32 on
 * the destination's mesh, each rank's part the blocks of its part, dense (its execute pointers: src NULL, dst the
 * scales). Every part of both layouts must hold whole blocks (from a multiple of the block to a multiple of it or
 * the dim's end), else plan creation fails naming the part. The source ranks quantise their parts before the
 * moves; the values then travel at one byte each. */
typedef struct {
  const char* name;             /* for messages; may be NULL */
  const ncclM2nLayout_t* src;
  const ncclM2nLayout_t* dst;
} ncclM2nTensorSpec_t;

typedef struct {
  size_t size;        /* sizeof(ncclM2nPlanConfig_t) */
  unsigned int magic; /* NCCL_M2N_MAGIC */
  int nRanks;               /* communicator size, 1..2^20; every mesh rank is below it */
  int ranksPerDomain;       /* NVLink domain of rank r = r / ranksPerDomain; 0 = one domain */
  const int* domainOfRank;  /* NULL, or nRanks entries (wins over ranksPerDomain) */
  int fp8BlockRows;         /* rows of an fp8 scale block (see ncclM2nTensorSpec_t): 1 (0 too) or 128 */
} ncclM2nPlanConfig_t;
#define NCCL_M2N_PLAN_CONFIG_INITIALIZER {sizeof(ncclM2nPlanConfig_t), NCCL_M2N_MAGIC, 0, 0, NULL, 0}

/* Checks one layout; ncclInvalidArgument with a message naming the problem. nRanks 0: ranks unbounded. Local. */
NCCL_M2N_API ncclResult_t ncclM2nLayoutValidate(const ncclM2nLayout_t* layout, int nRanks);

/* The part of the global tensor that `rank` holds in a (valid) layout: offset[d] and shape[d] for d < ndims, in
 * global elements (its local tensor's extent); *holds 0 (offset and shape zero) when the rank is not in the mesh.
 * A shard may be empty (trailing torch.chunk shards): shape then has a zero. Local. */
NCCL_M2N_API ncclResult_t ncclM2nLayoutLocalBox(const ncclM2nLayout_t* layout, int rank, int64_t* offset,
                                                int64_t* shape, int* holds);

/* ------------------------------------------------------------------------------------------------------------
 * Host plans: the transfer plan of a batch of tensors as seen by one rank, computed on the host alone (local, no
 * communication, no GPU). Every rank that passes the same metadata computes the same global decisions (one
 * source replica per destination piece: the destination itself when it holds the data, else a replica in its
 * NVLink domain, then the least loaded); metadataHash and planHash let ranks check that they agree.
 * ------------------------------------------------------------------------------------------------------------ */
typedef struct ncclM2nHostPlan* ncclM2nHostPlan_t;

typedef NCCL_M2N_ENUM { ncclM2nSends = 0, ncclM2nRecvs = 1, ncclM2nLocalCopies = 2 } ncclM2nTransferKind_t;

/* One strided box: ndims (after merging contiguous dims; 0 = one element) extents, outermost first, with the
 * element strides of each side's local tensor. */
typedef struct {
  int tensor;                   /* index in the batch */
  int srcRank, dstRank;
  int64_t srcOffset, dstOffset; /* elements */
  int ndims;
  int64_t extent[NCCL_M2N_MAX_TENSOR_DIMS];
  int64_t srcStride[NCCL_M2N_MAX_TENSOR_DIMS];
  int64_t dstStride[NCCL_M2N_MAX_TENSOR_DIMS];
} ncclM2nTransfer_t;

typedef struct {
  uint64_t metadataHash;
  uint64_t planHash;
  int64_t counts[3];            /* transfers of this rank, by ncclM2nTransferKind_t */
  int64_t bytes[3];
  int64_t totalBytes;           /* over all ranks, local copies included */
  int64_t interDomainBytes;     /* over all ranks: bytes that leave their NVLink domain */
  double maxSourceLoad, meanSourceLoad; /* bytes sent per source rank */
} ncclM2nPlanInfo_t;

/* Plans `nTensors` tensors for `rank` (which need not be in any mesh). Local; may take a while for big batches.
 * A batch whose destinations receive more than 2^62 bytes in all (the plan's int64 byte counts) is refused; out of
 * host memory is ncclSystemError. */
NCCL_M2N_API ncclResult_t ncclM2nHostPlanCreate(ncclM2nHostPlan_t* plan, int rank, int nTensors,
                                                const ncclM2nTensorSpec_t* tensors,
                                                const ncclM2nPlanConfig_t* config);
NCCL_M2N_API ncclResult_t ncclM2nHostPlanGetInfo(ncclM2nHostPlan_t plan, ncclM2nPlanInfo_t* info);
/* The plan's list of one kind; *transfers stays valid until the plan is destroyed. */
NCCL_M2N_API ncclResult_t ncclM2nHostPlanGetTransfers(ncclM2nHostPlan_t plan, ncclM2nTransferKind_t kind,
                                                      const ncclM2nTransfer_t** transfers, int64_t* count);
NCCL_M2N_API ncclResult_t ncclM2nHostPlanDestroy(ncclM2nHostPlan_t plan);

/* ------------------------------------------------------------------------------------------------------------
 * Execution plans: the executor that moves the bytes of a planned batch.
 *
 * ncclM2nPlanCreate is COLLECTIVE over `comm` and blocking: every rank of the communicator calls it (also ranks in
 * neither mesh) with the same batch. The ranks compare their metadata first; when it differs, every rank fails with
 * ncclInvalidArgument and the same message naming the first differing tensor and rank. It then plans this rank's
 * part, its schedule (docs/ARCHITECTURE.md, nccl_m2n) and allocates the staging (at most `stagingBytes`) and the
 * tables an execute reads. ncclM2nExecute is COLLECTIVE and stream-ordered: src[t] / dst[t] are this rank's local
 * pointers of tensor t (NULL where it holds no part of that side; its layout's strides and dtype), and the call
 * enqueues the local copies and the exchanges on `stream`. It may be captured in a CUDA graph and replayed.
 *
 * By default every byte between ranks goes by ncclSend/ncclRecv, inside an NVLink domain too (NCCL's own NVLink path).
 * With the config's `lsa` (and always for virtual ranks, nccl_m2n_testing.h), bytes between two ranks of one NVLink
 * domain (NCCL's LSA team, or blocks of NCCL_EXT_LSA_DOMAIN_SIZE ranks of it) go over LSA instead: the sender packs
 * into its symmetric window and the receiver unpacks from it by NVLink loads, chunk by chunk, with a barrier of the
 * domain between (every wait bounded by the timeout; a peer that never arrives fails the execute's barrier, and
 * ncclM2nPlanGetAsyncError and every later execute return ncclRemoteError). The LSA path has run on one GPU only, with
 * virtual ranks (docs/M2N.md). Between domains: ncclSend/ncclRecv (contiguous pieces straight between the tensors, the
 * rest through the staging) on a communicator split from `comm` (by the first plan on `comm`; shared by the plans
 * created while one lives). Those exchanges are watched: past the timeout that communicator is aborted
 * (ncclM2nPlanGetAsyncError). A plan may be destroyed before the CUDA graphs that captured its execute (not replayed
 * after). bf16 or fp32 -> fp8 e4m3 with one fp32 scale per 128 columns: see ncclM2nTensorSpec_t. Zero-copy inside an
 * NVLink domain (the config's zeroCopy, with lsa): see ncclM2nRegister.
 * ------------------------------------------------------------------------------------------------------------ */
typedef struct ncclM2nPlan* ncclM2nPlan_t;

typedef struct {
  size_t size;           /* sizeof(ncclM2nExecConfig_t) */
  unsigned int magic;    /* NCCL_M2N_MAGIC */
  size_t stagingBytes;   /* staging cap per rank (the window's slots included); 0: 256 MiB */
  double timeoutSeconds; /* budget of plan creation's host collectives, of connecting to the plan's peers and of each
                            execute's exchanges and barriers; 0: NCCL_EXT_TIMEOUT_S */
  int fp8BlockRows;      /* rows of an fp8 scale block (see ncclM2nTensorSpec_t): 1 (0 too) or 128 */
  int lsa;               /* 1: streams inside an NVLink domain over LSA (see above; all ranks alike); 0: by
                            ncclSend/ncclRecv there too */
  int zeroCopy;          /* with lsa (all ranks alike): NCCL_M2N_ZERO_COPY_OFF, _PULL or _PUSH (ncclM2nRegister) */
} ncclM2nExecConfig_t;
#define NCCL_M2N_EXEC_CONFIG_INITIALIZER {sizeof(ncclM2nExecConfig_t), NCCL_M2N_MAGIC, 0, 0, 0, 0, 0}

/* Zero-copy inside an NVLink domain. Between two ranks of one domain a plan with lsa = 1 normally stages every
 * stream in the sender's window. With zeroCopy = NCCL_M2N_ZERO_COPY_PULL the receiver instead reads the sender's
 * source tensor in place (no staging, no pack); with NCCL_M2N_ZERO_COPY_PUSH the sender writes the receiver's
 * destination tensor in place. Every execute then publishes each rank's tensors of that side to its domain, meets
 * a barrier of the domain, moves every such piece in one kernel and meets a final barrier (the execute ends only
 * when no peer still reads or writes this rank's tensors). Across domains nothing changes.
 * The published tensors (the sources with PULL, the destinations with PUSH) must lie, at every execute, in memory
 * registered with ncclM2nRegister on the plan's communicator; an execute with one outside is refused naming the
 * tensor. ncclM2nRegister: COLLECTIVE over comm's NVLink domain (the first registration on a communicator: over
 * comm; every rank registers its own buffer, in the same order, of the same size on every rank of the domain,
 * which NCCL 2.28's windows need: a different size is refused naming the ranks); the buffer must suit
 * ncclCommWindowRegister (ncclMemAlloc, or cuMem with the handle types NCCL needs). Deregister (collective likewise)
 * only when no execute or graph that uses it can run any more. Virtual ranks (nccl_m2n_testing.h) need no
 * registration: any device memory works. Not with fp8 tensors (refused at plan time). */
#define NCCL_M2N_ZERO_COPY_OFF 0
#define NCCL_M2N_ZERO_COPY_PULL 1
#define NCCL_M2N_ZERO_COPY_PUSH 2
typedef struct ncclM2nRegistration* ncclM2nRegistration_t;
NCCL_M2N_API ncclResult_t ncclM2nRegister(ncclComm_t comm, void* buffer, size_t bytes, ncclM2nRegistration_t* reg);
NCCL_M2N_API ncclResult_t ncclM2nDeregister(ncclM2nRegistration_t reg);

NCCL_M2N_API ncclResult_t ncclM2nPlanCreate(ncclM2nPlan_t* plan, ncclComm_t comm, int nTensors,
                                            const ncclM2nTensorSpec_t* tensors, const ncclM2nExecConfig_t* config);
NCCL_M2N_API ncclResult_t ncclM2nExecute(ncclM2nPlan_t plan, const void* const* src, void* const* dst,
                                         cudaStream_t stream);
/* Local: after every execute of the plan has finished (it frees device memory); for virtual ranks
 * (nccl_m2n_testing.h), collective over their domain (ncclRemoteError when a rank does not come within the
 * timeout). */
NCCL_M2N_API ncclResult_t ncclM2nPlanDestroy(ncclM2nPlan_t plan);
/* ncclSuccess, or ncclRemoteError with a message once an execute's exchanges outlived the config's timeoutSeconds
 * (a peer that died or never executes): the plans' exchange communicator was then aborted (the caller's is
 * untouched), the destinations may hold partial data, and every later execute of a plan on it fails the same way;
 * destroy those plans. Executes
 * captured in a CUDA graph are not watched. Local, never blocks. */
NCCL_M2N_API ncclResult_t ncclM2nPlanGetAsyncError(ncclM2nPlan_t plan);

/* The exchange communicator that plans on `comm` share is split by the first plan and lives while one of them
 * does. ncclM2nCommRetain (COLLECTIVE over comm, blocking, within the config's timeoutSeconds) keeps one alive
 * between plans too, so that plans made one after another on `comm` split nothing (ncclM2nReshard's cached plans
 * keep it alive as plans do). ncclM2nCommRelease (local) lets it go with the last plan on it and frees the plans
 * ncclM2nReshard cached on `comm` once their executes finished (at most twice their timeout each; a plan whose
 * execute does not finish is left to the process and the call returns the error); call it before destroying
 * `comm`. */
NCCL_M2N_API ncclResult_t ncclM2nCommRetain(ncclComm_t comm, const ncclM2nExecConfig_t* config);
NCCL_M2N_API ncclResult_t ncclM2nCommRelease(ncclComm_t comm);

/* One tensor, one call: COLLECTIVE over `comm`, asynchronous on `stream` (src / dst: this rank's local pointers,
 * NULL where it holds no part; stream-ordered like ncclM2nExecute). The plan of `spec` and `config` (both layouts
 * and the config's fields; the name aside) is kept per communicator: the first call with a pair plans it (as
 * ncclM2nPlanCreate plans a batch of one: collective and blocking on the host), later ones with the same pair only
 * enqueue its execute, behind that plan's previous execute on whatever stream it ran. The 8 most recently used
 * pairs are kept; a ninth frees the least recently used after its last execute (a host wait, at most twice the
 * config's timeoutSeconds). Every rank makes the same calls in the same order, so every rank plans and frees alike.
 * An earlier execute whose exchanges outlived the budget makes the next call with that pair return ncclRemoteError
 * (the plan is dropped). ncclM2nCommRelease frees the communicator's plans: call it before destroying `comm`. Not
 * for CUDA graph capture. `config` may be NULL. */
NCCL_M2N_API ncclResult_t ncclM2nReshard(ncclComm_t comm, const ncclM2nTensorSpec_t* spec, const void* src,
                                         void* dst, const ncclM2nExecConfig_t* config, cudaStream_t stream);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* NCCL_M2N_H_ */
