/*
 * nccl_ep public C API. The only installed header of libnccl_ep; C99-clean.
 *
 * Every function returns ncclResult_t; on failure ncclEpGetLastError() explains it. No call asserts, exits,
 * aborts or lets an exception escape.
 */
#ifndef NCCL_EP_H_
#define NCCL_EP_H_

#include <cuda_runtime.h>
#include <nccl.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define NCCL_EP_API __attribute__((visibility("default")))
#else
#define NCCL_EP_API
#endif
/* An enum is an int. In C++ its underlying type is int too, so that any int a C caller stores, an unknown value
 * included, is a value of the type that the library reads and refuses (C++ leaves other enums' values outside their
 * enumerators undefined). */
#if defined(__cplusplus)
#define NCCL_EP_ENUM enum : int
#else
#define NCCL_EP_ENUM enum
#endif

#define NCCL_EP_MAJOR 0
#define NCCL_EP_MINOR 1
#define NCCL_EP_PATCH 0
/* major * 10000 + minor * 100 + patch */
#define NCCL_EP_VERSION_CODE (NCCL_EP_MAJOR * 10000 + NCCL_EP_MINOR * 100 + NCCL_EP_PATCH)

/* The library's version code (NCCL_EP_VERSION_CODE of the build). Local; never blocks. */
NCCL_EP_API ncclResult_t ncclEpGetVersion(int* version);

/* The NCCL loaded in this process and the release whose headers compiled the part of this library that serves it
 * (either pointer may be NULL; built is 0 when no part does). One build serves several NCCL release families (the
 * device communicator's structs are laid out per family; everything else is the same binary): returns
 * ncclInvalidUsage, with a message naming the loaded release and the supported ones, when it does not serve the
 * loaded one. Local; never blocks. */
NCCL_EP_API ncclResult_t ncclEpCheckNcclRuntime(int* builtVersion, int* loadedVersion);

/* Text of the last failure of a ncclEp* call on the calling thread; "" if none. Valid until the next call. */
NCCL_EP_API const char* ncclEpGetLastError(void);

/* ------------------------------------------------------------------------------------------------------------
 * MoE dispatch / combine. Names follow NVIDIA's nccl_ep where that serves users; docs/COMPATIBILITY.md lists every
 * difference. Structs passed by pointer start with {size, magic}; initialise them with the *_INIT macros. Fields
 * are only ever appended, and a library takes every earlier layout of a struct it reads (the *_V<n>_SIZE sizes):
 * the fields the caller's layout lacks read as zero (NCCL_EP_AUTO). Any other size is refused.
 * A field left at NCCL_EP_AUTO is the only one an environment variable can set: a value given wins.
 * ------------------------------------------------------------------------------------------------------------ */
#define NCCL_EP_MAGIC 0x65703031u /* 'ep01' */
#define NCCL_EP_MAX_TENSOR_DIMS 4
#define NCCL_EP_AUTO 0  /* the library's choice: the environment variable the field names, else its default */
#define NCCL_EP_OFF (-1)

typedef struct ncclEpGroup* ncclEpGroup_t;
typedef struct ncclEpHandle* ncclEpHandle_t;

typedef NCCL_EP_ENUM { NCCL_EP_ALGO_LOW_LATENCY = 0, NCCL_EP_ALGO_HIGH_THROUGHPUT = 1 } ncclEpAlgorithm_t;

/* Receive layouts. FLAT (HT): one row per (token, destination rank), grouped by source rank in rank order, tokens
 * in source order. EXPERT_MAJOR: one row per (token, local expert), grouped by local expert, inside a zone by
 * (source rank, token); HT: each expert's zone starts at a multiple of the handle's alignment (pad rows zero); LL:
 * zone e is rows [e * R * M, (e + 1) * R * M) (M = max_tokens_per_rank), its first expert_counters[e] rows valid.
 * RANK_MAJOR (LL only): rows [s * M, s * M + src_rank_counters[s]) hold, in source order, the tokens of source s
 * with an expert on this rank. LL rows past the counts are not written. */
typedef NCCL_EP_ENUM {
  NCCL_EP_LAYOUT_UNSET = 0,
  NCCL_EP_LAYOUT_EXPERT_MAJOR = 1,
  NCCL_EP_LAYOUT_RANK_MAJOR = 2,
  NCCL_EP_LAYOUT_FLAT = 3
} ncclEpLayout_t;

typedef NCCL_EP_ENUM { NCCL_EP_ZERO_COPY_AUTO = 0, NCCL_EP_ZERO_COPY_OFF = 1, NCCL_EP_ZERO_COPY_ON = 2 } ncclEpZeroCopyMode_t;

/* Output sizing. WORST_CASE: outputs hold the most rows any routing can produce (see ncclEpHandleGetMaxRecvRows);
 * nothing waits on the host, so handle creation, dispatch and combine can be captured in a CUDA graph. EXACT: handle
 * creation waits for the receive count and ncclEpHandleGetRecvRows reports it. */
typedef NCCL_EP_ENUM { NCCL_EP_SIZING_WORST_CASE = 0, NCCL_EP_SIZING_EXACT = 1 } ncclEpSizing_t;

/* What becomes of the rows past a High-Throughput group's receive cap (ncclEpGroupConfig_t::max_recv_rows_per_rank).
 * Either way they are not delivered and nothing is written past the cap; ERROR also makes every rank's next call
 * after its handle's kernels ran (under EXACT sizing, handle creation itself, on every rank) fail with
 * ncclInvalidArgument naming the rank and the rows; DROP counts them (ncclEpLayoutInfo_t::recv_dropped_counter) and
 * combine leaves them out of the sum (ncclEpCombineOutputs_t::missing_experts). */
typedef NCCL_EP_ENUM { NCCL_EP_RECV_OVERFLOW_ERROR = 0, NCCL_EP_RECV_OVERFLOW_DROP = 1 } ncclEpRecvOverflow_t;

/* A tensor: dense row-major, up to 4 dims. `data` is required (a device pointer) unless some size is 0 (an empty
 * tensor: ranks with zero tokens take part with empty tensors). `win_hdl`/`win_offset` optionally say that the
 * memory lies in an NCCL window (reserved for zero-copy). */
typedef struct {
  unsigned int ndim;
  ncclDataType_t datatype;
  void* data;
  ncclWindow_t win_hdl;
  size_t win_offset;
  int64_t sizes[NCCL_EP_MAX_TENSOR_DIMS];
} ncclEpTensor_t;
#define NCCL_EP_TENSOR_INIT {0, ncclBfloat16, NULL, NULL, 0, {0, 0, 0, 0}}

typedef int (*ncclEpAllocFn_t)(void** ptr, size_t bytes, void* context); /* returns 0 on success */
typedef int (*ncclEpFreeFn_t)(void* ptr, void* context);
typedef struct {
  ncclEpAllocFn_t alloc_fn; /* both NULL: cudaMalloc / cudaFree */
  ncclEpFreeFn_t free_fn;
  void* context;
} ncclEpAllocConfig_t;

typedef struct {
  unsigned int size;  /* sizeof(ncclEpGroupConfig_t) */
  unsigned int magic; /* NCCL_EP_MAGIC */
  ncclEpAlgorithm_t algorithm;
  int num_experts;              /* total experts, a multiple of the number of ranks; <= 1024 */
  int max_tokens_per_rank;      /* largest token count of any dispatch; <= 16384 (LL: <= 1024) */
  int max_token_bytes;          /* largest row of any dispatch/combine, bytes, a multiple of 16 */
  int max_topk;                 /* largest top-k of any handle, 1..32 */
  int num_sms;                  /* SMs the dispatch/combine kernels occupy (one CTA per SM, filling it);
                                   NCCL_EP_AUTO: 64 (capped by the GPU); more only where nothing that
                                   waits on the peers runs beside the calls. A whole Low-Latency call on
                                   more than 64 is launched cooperatively (it starts once all are free) */
  uint64_t timeout_ns;          /* budget of every device wait; NCCL_EP_AUTO: NCCL_EXT_TIMEOUT_S (100 s) */
  ncclEpZeroCopyMode_t zero_copy; /* AUTO: a dispatch whose outputs.tokens is ncclEpGroupGetDispatchWindow's
                                   tensor lands in place, others copy; ON: every dispatch must (High-Throughput,
                                   max_recv_rows_per_rank, FLAT handles); OFF: every dispatch copies (no window) */
  ncclEpAllocConfig_t alloc;    /* for the library's non-window device buffers */
  int lsa_domain_size;          /* NCCL_EP_AUTO: NCCL's LSA team; k splits it (several domains: Low-Latency only) */
  int enable_mask;              /* LL: 1 = a mask of active ranks (ncclEpMaskQuery/Update/Clean): a peer that does
                                   not arrive within timeout_ns is masked instead of failing the group */
  int rail_round_tokens;        /* High-Throughput across NVLink domains: a call moves its rows to each rank of
                                   another domain in rounds of this many (a send half, then the rail; the
                                   hierarchical HT: its rail rows to each other domain), so that the rail's staging
                                   holds this many rows a peer whatever max_tokens_per_rank;
                                   NCCL_EP_AUTO: NCCL_EXT_RAIL_ROUND_TOKENS, else 1024; at most max_tokens_per_rank
                                   (one round) */
  size_t rail_staging_bytes_max; /* across NVLink domains: the most device memory the rail's staging may hold
                                   (ncclEpGroupInfo_t::rail_staging_bytes), as DeepEP's num_rdma_bytes. High-
                                   Throughput: its rounds take the most rows a peer (at most rail_round_tokens's) that
                                   fit; Low-Latency's staging is fixed by the group's sizes. ncclInvalidArgument when
                                   even one row a peer (LL: the fixed staging) does not fit. 0: no limit */
  /* Appended after the first layout (NCCL_EP_GROUP_CONFIG_V1_SIZE ends before them). */
  int ht_hierarchical;          /* High-Throughput across NVLink domains of several ranks: 1 = the hierarchical
                                   exchange (one rail row per (token, destination domain) each way, expanded or
                                   reduced by the rank of the sender's index there; experimental), NCCL_EP_OFF = the
                                   flat one (a rail row per (token, destination rank)). NCCL_EP_AUTO:
                                   NCCL_EXT_HT_HIERARCHICAL, else flat */
  int rail_overlap;             /* High-Throughput across NVLink domains: 1 = a call's NVLink part (the flat
                                   exchange's rows to my domain, the hierarchical one's send half) runs on a stream
                                   of the group's beside the rail rounds, NCCL_EP_OFF = one stream. NCCL_EP_AUTO:
                                   NCCL_EXT_RAIL_OVERLAP, else one stream */
  /* Appended after the second layout (NCCL_EP_GROUP_CONFIG_V2_SIZE ends before them). */
  int max_recv_rows_per_rank;   /* High-Throughput: the most rows (one per (token, this rank)) a dispatch delivers
                                   to a rank, so that the window's dispatch staging and a handle's FLAT output hold
                                   this many rows instead of n_ranks x max_tokens_per_rank, and its combine staging
                                   max_tokens_per_rank x min(n_ranks, max_topk). Rows past it (the last sources'
                                   last tokens, in the FLAT order) go by recv_overflow. Across NVLink domains the
                                   flat exchange only (not ht_hierarchical); the rail staging then holds an inbox
                                   beside each outbox (rail_staging_bytes 1.5x). NCCL_EP_AUTO: no cap */
  ncclEpRecvOverflow_t recv_overflow; /* rows past max_recv_rows_per_rank (see ncclEpRecvOverflow_t) */
} ncclEpGroupConfig_t;
#define NCCL_EP_GROUP_CONFIG_V1_SIZE offsetof(ncclEpGroupConfig_t, ht_hierarchical)
#define NCCL_EP_GROUP_CONFIG_V2_SIZE offsetof(ncclEpGroupConfig_t, max_recv_rows_per_rank)
#define NCCL_EP_GROUP_CONFIG_INIT                                                                            \
  {sizeof(ncclEpGroupConfig_t), NCCL_EP_MAGIC, NCCL_EP_ALGO_HIGH_THROUGHPUT, 0, 0, 0, 8, NCCL_EP_AUTO, 0, \
   NCCL_EP_ZERO_COPY_AUTO, {NULL, NULL, NULL}, NCCL_EP_AUTO, 0, NCCL_EP_AUTO, 0, NCCL_EP_AUTO, NCCL_EP_AUTO, \
   NCCL_EP_AUTO, NCCL_EP_RECV_OVERFLOW_ERROR}

typedef struct {
  unsigned int size;
  unsigned int magic;
  int dispatch_output_per_expert_alignment; /* EXPERT_MAJOR zone alignment in rows, any of 1..1024 (e.g. a
                                               grouped GEMM's M tile: 128, or 224 on sm_100); 0 or 1: none */
  ncclEpSizing_t sizing;
} ncclEpHandleConfig_t;
#define NCCL_EP_HANDLE_CONFIG_INIT {sizeof(ncclEpHandleConfig_t), NCCL_EP_MAGIC, 1, NCCL_EP_SIZING_WORST_CASE}

/* Optional device outputs of handle creation (int32; leave data NULL for any not wanted). */
typedef struct {
  unsigned int size;
  unsigned int magic;
  ncclEpTensor_t expert_counters;    /* [local experts]: rows each local expert receives (unpadded) */
  ncclEpTensor_t src_rank_counters;  /* [ranks]: rows received from each source rank */
  ncclEpTensor_t expert_offsets;     /* [local experts]: EXPERT_MAJOR zone starts (rows) */
  ncclEpTensor_t recv_total_counter; /* [1]: rows received (EXPERT_MAJOR: pads included) */
  /* Appended after the first layout (NCCL_EP_LAYOUT_INFO_V1_SIZE ends before it). */
  ncclEpTensor_t recv_dropped_counter; /* HT with max_recv_rows_per_rank: [1], rows for this rank past the cap (not
                                          delivered, not in the counts above); 0 without a cap */
} ncclEpLayoutInfo_t;
#define NCCL_EP_LAYOUT_INFO_V1_SIZE offsetof(ncclEpLayoutInfo_t, recv_dropped_counter)
#define NCCL_EP_LAYOUT_INFO_INIT                                                                              \
  {sizeof(ncclEpLayoutInfo_t), NCCL_EP_MAGIC, NCCL_EP_TENSOR_INIT, NCCL_EP_TENSOR_INIT, NCCL_EP_TENSOR_INIT, \
   NCCL_EP_TENSOR_INIT, NCCL_EP_TENSOR_INIT}

typedef struct {
  unsigned int size;
  unsigned int magic;
  ncclEpTensor_t tokens;       /* [T, H]: bf16, fp16, fp32 or fp8 e4m3; HT also uint8 (opaque bytes, e.g. packed fp4) */
  ncclEpTensor_t topk_weights; /* [T, K] fp32; optional (EXPERT_MAJOR combine needs it) */
  ncclEpTensor_t scales;       /* forwarded byte-exact. fp8 tokens need them: LL [T, H/128] fp32; HT [T, S] fp32 or
                                  int32 laid out as the caller likes (S from 1 to max_token_bytes / 128: per token,
                                  per 128 columns, packed UE8M0, fp4 block scales four bytes a word), which HT tokens
                                  of any dtype may carry too (per-token side words). LL NVFP4 tokens (uint8
                                  [T, H/2]): [T, H/16] uint8 or e4m3 */
  /* Appended after the first layout (NCCL_EP_DISPATCH_INPUTS_V1_SIZE ends before it). */
  ncclEpTensor_t global_scale; /* LL NVFP4 quantisation (bf16 in, uint8 [N, H/2] out): [1] fp32 on the device, g.
                                  Each block of 16 columns gets scale s = e4m3(amax / 6 x g) and elements
                                  e2m1(x x g / s) (0 where s is 0; nearest, ties to even, saturating), two a byte,
                                  the first in the low nibble; x ~ q x s / g. Not taken otherwise */
} ncclEpDispatchInputs_t;
#define NCCL_EP_DISPATCH_INPUTS_V1_SIZE offsetof(ncclEpDispatchInputs_t, global_scale)
#define NCCL_EP_DISPATCH_INPUTS_INIT                                                                        \
  {sizeof(ncclEpDispatchInputs_t), NCCL_EP_MAGIC, NCCL_EP_TENSOR_INIT, NCCL_EP_TENSOR_INIT, NCCL_EP_TENSOR_INIT, \
   NCCL_EP_TENSOR_INIT}

typedef struct {
  unsigned int size;
  unsigned int magic;
  ncclEpTensor_t tokens;       /* [N, H], same dtype as the input (LL: e4m3 from bf16 quantises per 128 columns,
                                  uint8 [N, H/2] from bf16 to NVFP4, see global_scale); N >= the receive count */
  ncclEpTensor_t topk_weights; /* FLAT: [N, K] (0 where not local); EXPERT_MAJOR: [N] (0 on pads). Optional */
  ncclEpTensor_t topk_idx;     /* FLAT: [N, K] int32 local expert ids, -1 elsewhere. Optional; EXPERT_MAJOR: unused */
  ncclEpTensor_t scales;       /* with input scales: [N, their S], their dtype; LL fp8 [N, H/128] fp32, LL NVFP4
                                  [N, H/16] uint8 or e4m3 (block b's e4m3 scale at column b, no swizzle) */
  ncclEpTensor_t src_info;     /* LL, optional: [N] int32: RANK_MAJOR the row's token index at its source;
                                  EXPERT_MAJOR source rank * max_tokens_per_rank + token. HT: unused */
  /* Appended after the first layout (NCCL_EP_DISPATCH_OUTPUTS_V1_SIZE ends before it). */
  ncclEpTensor_t recv_wait_cycles; /* LL, optional: [n_ranks] int64, added to (on the stream, by the receive half):
                                      per source rank, the clock64 cycles this rank's receiving threads spun waiting
                                      for its header and rows, summed over the threads that waited (a warp a row); 0
                                      for what had arrived. Straggler diagnosis, as DeepEP's
                                      dispatch_wait_recv_cost_stats (same unit, another scale: compare sources and
                                      ranks of one group). HT: refused */
} ncclEpDispatchOutputs_t;
#define NCCL_EP_DISPATCH_OUTPUTS_V1_SIZE offsetof(ncclEpDispatchOutputs_t, recv_wait_cycles)
#define NCCL_EP_DISPATCH_OUTPUTS_INIT                                                                     \
  {sizeof(ncclEpDispatchOutputs_t), NCCL_EP_MAGIC, NCCL_EP_TENSOR_INIT, NCCL_EP_TENSOR_INIT, NCCL_EP_TENSOR_INIT, \
   NCCL_EP_TENSOR_INIT, NCCL_EP_TENSOR_INIT, NCCL_EP_TENSOR_INIT}

typedef struct {
  unsigned int size;
  unsigned int magic;
  int num_sms;                 /* NCCL_EP_AUTO: the group's */
  int round_scale;             /* LL fp8 quantisation (bf16 in, fp8 e4m3 out): 1 = scales rounded up to powers of 2 */
  int send_only;               /* LL: 1 = issue the sends and return; ncclEpComplete receives (see there) */
  /* Appended after the first layout (NCCL_EP_DISPATCH_CONFIG_V1_SIZE ends before it). */
  int global_expert_ids;       /* 1: outputs.topk_idx (HT FLAT, LL RANK_MAJOR) holds global expert ids (this rank's
                                  first expert + the local id), -1 elsewhere; 0: local ids */
} ncclEpDispatchConfig_t;
#define NCCL_EP_DISPATCH_CONFIG_INIT {sizeof(ncclEpDispatchConfig_t), NCCL_EP_MAGIC, NCCL_EP_AUTO, 0, 0, 0}
#define NCCL_EP_DISPATCH_CONFIG_V1_SIZE offsetof(ncclEpDispatchConfig_t, global_expert_ids)

typedef struct {
  unsigned int size;
  unsigned int magic;
  ncclEpTensor_t tokens;       /* same shape and layout as the dispatch output: bf16, fp16 or fp32 (LL: bf16) */
  ncclEpTensor_t topk_weights; /* LL EXPERT_MAJOR, optional: [T, K] fp32, the owner's top-k weights. Given: every
                                  (token, expert) row returns as it is and the owner weights and sums them (DeepEP's
                                  API); absent: each rank weights its experts' rows with the weights dispatch carried
                                  (1 where it had none) and returns one row per (token, rank). HT: unused */
  /* Appended after the first layout (NCCL_EP_COMBINE_INPUTS_V1_SIZE ends before it). */
  ncclEpTensor_t bias;         /* HT, optional: [T, H] of the tokens' dtype or fp32, the owner's sum's first term */
} ncclEpCombineInputs_t;
#define NCCL_EP_COMBINE_INPUTS_V1_SIZE offsetof(ncclEpCombineInputs_t, bias)
#define NCCL_EP_COMBINE_INPUTS_INIT \
  {sizeof(ncclEpCombineInputs_t), NCCL_EP_MAGIC, NCCL_EP_TENSOR_INIT, NCCL_EP_TENSOR_INIT, NCCL_EP_TENSOR_INIT}

typedef struct {
  unsigned int size;
  unsigned int magic;
  ncclEpTensor_t tokens;       /* [T, H], same dtype as the input */
  ncclEpTensor_t missing_experts; /* optional: [T] int32, how many of the token's top-k experts' rows are not in
                                     the sum: LL with enable_mask, those on ranks masked when the combine began;
                                     HT with max_recv_rows_per_rank, those on ranks where the token's row was past
                                     the cap (0 for every token when nothing is missing) */
  /* Appended after the first layout (NCCL_EP_COMBINE_OUTPUTS_V1_SIZE ends before it). */
  ncclEpTensor_t recv_wait_cycles; /* LL, optional: [n_ranks] int64, as the dispatch output of that name: the cycles
                                      spun waiting for each rank's returned rows (DeepEP's
                                      combine_wait_recv_cost_stats). HT: refused */
} ncclEpCombineOutputs_t;
#define NCCL_EP_COMBINE_OUTPUTS_V1_SIZE offsetof(ncclEpCombineOutputs_t, recv_wait_cycles)
#define NCCL_EP_COMBINE_OUTPUTS_INIT \
  {sizeof(ncclEpCombineOutputs_t), NCCL_EP_MAGIC, NCCL_EP_TENSOR_INIT, NCCL_EP_TENSOR_INIT, NCCL_EP_TENSOR_INIT}

typedef struct {
  unsigned int size;
  unsigned int magic;
  int num_sms;                 /* NCCL_EP_AUTO: the group's */
  int send_only;               /* LL: 1 = issue the sends and return; ncclEpComplete receives (see there) */
} ncclEpCombineConfig_t;
#define NCCL_EP_COMBINE_CONFIG_INIT {sizeof(ncclEpCombineConfig_t), NCCL_EP_MAGIC, NCCL_EP_AUTO, 0}

typedef struct {
  unsigned int size;
  unsigned int magic;
} ncclEpCompleteConfig_t;
#define NCCL_EP_COMPLETE_CONFIG_INIT {sizeof(ncclEpCompleteConfig_t), NCCL_EP_MAGIC}

/* COLLECTIVE over `comm` (every rank, same config), blocking: sizes and registers the symmetric buffers once.
 * `comm` may span several nodes: the group derives the communicator of this rank's NVLink domain (NCCL's LSA team,
 * or blocks of `lsa_domain_size` / NCCL_EXT_LSA_DOMAIN_SIZE ranks) and the rail communicator (the ranks with this
 * rank's index in every domain) with ncclCommSplit, and keeps its windows on the domain communicator. Across several
 * domains both modes work: rows for another domain's ranks go by ncclSend/ncclRecv between a call's (and a
 * High-Throughput handle creation's) send and receive halves, fixed-size per peer (sized for max_tokens_per_rank
 * rows whatever the routing); no enable_mask there. The group's
 * calls (handle binding, dispatch, combine) run one after another on the GPU: issue them on one stream, or order
 * the streams with events, in the same order on every rank. Handles with different routings may alternate.
 * NCCL_EP_ALGO_LOW_LATENCY (decode): everything is sized here for max_tokens_per_rank (<= 1024); handle creation
 * allocates the handle's arrays once, and then handle updates, dispatch, combine and ncclEpComplete never allocate
 * or synchronise the host, and may be graph-captured. A group takes at most 64 ranks. */
NCCL_EP_API ncclResult_t ncclEpCreateGroup(ncclEpGroup_t* group, ncclComm_t comm, const ncclEpGroupConfig_t* config);
/* COLLECTIVE: waits for the group's work, then frees it. A group's handles go first: while any is alive this
 * returns ncclInvalidUsage and leaves the group as it was. NULL: nothing to do. Any call on a destroyed group or
 * handle (or on a pointer no create returned) returns ncclInvalidArgument; nothing is read through it. */
NCCL_EP_API ncclResult_t ncclEpGroupDestroy(ncclEpGroup_t group);
/* ncclSuccess, or ncclRemoteError with a message when a device wait of this group timed out. Local, never blocks. */
NCCL_EP_API ncclResult_t ncclEpGroupGetAsyncError(ncclEpGroup_t group);

/* What a group is, as created (local, never blocks): its NVLink domains and what a call moves to each rank of another
 * domain: these fixed sizes whatever the routing (the network bytes per call are rail_*_bytes x the ranks outside
 * this rank's domain, each way), but for the eager calls of an EXACT High-Throughput handle, which move only the rows
 * their routing fills; a High-Throughput handle's creation moves its count row too. */
typedef struct {
  unsigned int size;        /* sizeof(ncclEpGroupInfo_t) */
  unsigned int magic;       /* NCCL_EP_MAGIC */
  int n_domains;            /* NVLink domains the group spans */
  int domain_size;          /* ranks per domain */
  size_t window_bytes;      /* this rank's symmetric window */
  size_t rail_dispatch_bytes;       /* dispatch, per rank of another domain (0 with one domain) */
  size_t rail_combine_bytes;        /* combine, rows per (token, rank): HT, LL RANK_MAJOR / expert-side weights */
  size_t rail_combine_owner_bytes;  /* LL combine with inputs.topk_weights (rows per (token, expert)); 0 in HT */
  /* The rail's traffic per call to each other domain, each way (0 with one domain): the messages, and the bytes of
   * dispatch and of combine (LL: its rank-row combine) in all. One message per rank there, rail_*_bytes each (to the
   * rank itself, or, in the mixed test mode (nccl_ep_testing.h), all to the rank of my index there, which relays
   * them; HT's flat exchange: two per rank and round, one per staging region, received straight into the window),
   * or, for the hierarchical HT (ht_hierarchical on domains of several ranks), one per round of a fixed row per
   * token (rail_round_tokens of them). These are the fixed sizes (worst-case handles, captured calls); an EXACT
   * handle's eager HT calls move only the rows their routing fills (hierarchical: a row per token that hits the
   * domain), none where there are none. */
  int rail_messages_per_domain;
  size_t rail_dispatch_domain_bytes;
  size_t rail_combine_domain_bytes;
  int rail_relayed; /* 1: the messages go to the rank of my index in each other domain, which relays them inside its
                     * domain (the mixed test mode, or the hierarchical HT); 0: to each rank itself (or one domain) */
  size_t rail_staging_bytes; /* device memory this rank holds for the rail outside its window: the outboxes (one
                              * per rank of another domain; relayed: one per rank), LL's and relay mode's inboxes
                              * (the hierarchical HT's: the handle's count rows only), the hierarchical HT's rail
                              * rows of a round; 0 with one domain */
  int rail_round_tokens;     /* HT across domains: the rows a round moves to each peer (the hierarchical HT: to each
                              * other domain; rail_*_bytes are a whole call's, in max_tokens_per_rank / this many
                              * rounds at most); else max_tokens_per_rank */
  int rail_hierarchical;     /* 1: High-Throughput's hierarchical exchange (config.ht_hierarchical on domains of
                              * several ranks: a rail row per token and destination domain, relayed); else 0 */
  int rail_overlapped;       /* 1: High-Throughput's exchange runs a call's NVLink part on a stream of the group's
                              * beside the rail rounds (config.rail_overlap): the flat one's rows to my own domain,
                              * the hierarchical one's whole send half */
} ncclEpGroupInfo_t;
#define NCCL_EP_GROUP_INFO_INIT {sizeof(ncclEpGroupInfo_t), NCCL_EP_MAGIC, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}
NCCL_EP_API ncclResult_t ncclEpGroupGetInfo(ncclEpGroup_t group, ncclEpGroupInfo_t* info);
/* LOCAL, host arithmetic only (no GPU, no communicator, nothing allocated): what ncclEpGroupGetInfo would report for
 * a group made with `config` over `n_ranks` ranks whose NVLink (LSA) teams have `lsa_size` ranks (a divisor of
 * n_ranks; config.lsa_domain_size, else NCCL_EXT_LSA_DOMAIN_SIZE, splits them as ncclEpCreateGroup does), the
 * config's NCCL_EP_AUTO fields resolved as ncclEpCreateGroup resolves them (from this process's environment, else
 * the defaults; a config that sets them depends on no environment): for memory planning before the group exists
 * (window_bytes, rail_staging_bytes). The config is checked as ncclEpCreateGroup checks it (a rail_staging_bytes_max
 * that nothing fits fails alike); the one-GPU test modes are not queried. */
NCCL_EP_API ncclResult_t ncclEpGroupInfoQuery(const ncclEpGroupConfig_t* config, int n_ranks, int lsa_size,
                                              ncclEpGroupInfo_t* info);

/* COLLECTIVE, stream-ordered: binds the routing `topk_idx` ([T, K] int32 or int64, -1 = no expert, no expert twice
 * in a row) once; dispatch, combine and the backward pass reuse it. T may be 0. EXACT sizing blocks until the
 * receive count is known; WORST_CASE never blocks and may be graph-captured. `layout_info` may be NULL.
 * Low-Latency groups: RANK_MAJOR or EXPERT_MAJOR, WORST_CASE sizing, alignment 0 or 1; the binding is local (no
 * exchange between ranks: the counts travel with dispatch) and `layout_info` is filled by each dispatch instead. */
NCCL_EP_API ncclResult_t ncclEpCreateHandle(ncclEpHandle_t* handle, ncclEpGroup_t group, ncclEpLayout_t layout,
                                            const ncclEpTensor_t* topk_idx, const ncclEpLayoutInfo_t* layout_info,
                                            const ncclEpHandleConfig_t* config, cudaStream_t stream);
/* COLLECTIVE: the same handle with new routing (same layout and config). */
NCCL_EP_API ncclResult_t ncclEpUpdateHandle(ncclEpHandle_t handle, const ncclEpTensor_t* topk_idx,
                                            const ncclEpLayoutInfo_t* layout_info, cudaStream_t stream);
/* Local. The handle must not be in use by queued work, nor hold an open send-only call (its receive half would
 * never run, and this rank's call numbers would fall behind its peers': their next calls time out). NULL: nothing
 * to do; a handle destroyed already: ncclInvalidArgument. */
NCCL_EP_API ncclResult_t ncclEpHandleDestroy(ncclEpHandle_t handle);
/* EXACT sizing: rows this rank receives (EXPERT_MAJOR: pads included). WORST_CASE: ncclInvalidUsage. */
NCCL_EP_API ncclResult_t ncclEpHandleGetRecvRows(ncclEpHandle_t handle, int64_t* rows);
/* Rows of a worst-case dispatch output for this handle's layout. Local. */
NCCL_EP_API ncclResult_t ncclEpHandleGetMaxRecvRows(ncclEpHandle_t handle, int64_t* rows);
/* LOCAL, zero-copy dispatch outputs (High-Throughput groups with max_recv_rows_per_rank, FLAT handles): `*tokens`
 * becomes a [rows, hidden] tensor of `datatype` in this rank's window (rows: max_recv_rows_per_rank, at most
 * n_ranks x max_tokens_per_rank; ncclEpHandleGetMaxRecvRows of a FLAT handle), where dispatch's senders
 * write each row at its FLAT position; given as outputs.tokens of a dispatch, no received row is copied again (the
 * other outputs have the handle's rows, ncclEpHandleGetRecvRows or GetMaxRecvRows, as usual). hidden x the dtype's
 * size must be max_token_bytes (the window's row stride).
 * Its rows hold a dispatch's until this rank's next High-Throughput call on the group begins (its combine, or its
 * next dispatch): no peer writes the window before (their next dispatch waits for it). So it is no combine input
 * (refused): combine the experts' outputs. Rows past the receive count hold earlier calls' data. */
NCCL_EP_API ncclResult_t ncclEpGroupGetDispatchWindow(ncclEpGroup_t group, ncclDataType_t datatype, int64_t hidden,
                                                      ncclEpTensor_t* tokens);

/* COLLECTIVE, stream-ordered, asynchronous: sends each token once to every rank hosting one of its experts.
 * Backward pass: the gradient of combine is a dispatch of the output gradient.
 * Low-Latency: bf16 tokens arrive as bf16, or as fp8 e4m3 when outputs.tokens is e4m3 (quantised by the sender:
 * one fp32 scale per 128 columns, amax / 448, powers of two with config->round_scale, into outputs.scales; int32
 * outputs.scales [N, H/512] take them as powers of two, UE8M0 exponent bytes four a word, H a multiple of 512); fp8
 * tokens with scales (any [T, S] fp32 or int32 of the caller's layout, S from 1 to max_token_bytes / 128: per
 * block, UE8M0 packed, per token) are forwarded bit for bit. The receive counts arrive with the rows:
 * `layout_info` (optional) gets them on the device (expert_counters, src_rank_counters, expert_offsets = e * R * M,
 * recv_total_counter). */
NCCL_EP_API ncclResult_t ncclEpDispatch(ncclEpHandle_t handle, const ncclEpDispatchInputs_t* inputs,
                                        const ncclEpDispatchOutputs_t* outputs, const ncclEpLayoutInfo_t* layout_info,
                                        const ncclEpDispatchConfig_t* config, cudaStream_t stream);
/* COLLECTIVE, stream-ordered, asynchronous: returns expert outputs to token owners and reduces them in fp32. FLAT:
 * one row per (token, rank), summed as given. EXPERT_MAJOR: each rank weights its local experts' rows with the
 * top-k weights of the last dispatch and sums them in top-k column order into one row per (token, rank), rounded
 * to the tokens' dtype (the owner's own too). High-Throughput owners sum in fp32, from inputs->bias (or 0), the
 * ranks' rows in the order of the last top-k column each rank hosts (DeepEP V2's order: the same bits as its combine;
 * the hierarchical HT rounds each domain's partial once more), and round once. inputs->bias must not overlap
 * outputs->tokens. Backward pass: the gradient of dispatch is a combine of the received-token gradients (FLAT).
 * Low-Latency, after a dispatch on the same handle: RANK_MAJOR takes one row per slot (the caller's sum over the
 * row's local experts) and the owner sums the ranks' rows in rank order; EXPERT_MAJOR a row per (token, rank) as
 * HT's, summed likewise in rank order, or, with inputs->topk_weights, one row per (token, expert) weighted and
 * summed by the owner in top-k column order; outputs->tokens must not overlap inputs->tokens. */
NCCL_EP_API ncclResult_t ncclEpCombine(ncclEpHandle_t handle, const ncclEpCombineInputs_t* inputs,
                                       const ncclEpCombineOutputs_t* outputs, const ncclEpCombineConfig_t* config,
                                       cudaStream_t stream);
/* COLLECTIVE, stream-ordered: the second half of the handle's send-only call (Low-Latency mode): waits for the
 * peers' rows and lays them out (dispatch) or reduces them (combine), with the outputs and config of that call,
 * which must stay valid until then. The staging is double-buffered: up to two send-only calls of each kind may be
 * open at once (on different handles: e.g. the dispatches of two micro-batches, then their completions), and
 * calls of the other kind may run in between; a kind's calls complete in the order they were issued, and a plain
 * call of a kind waits for no open one (both refused otherwise). ncclInvalidUsage when the handle has no send-only
 * call pending. High-Throughput calls complete on their own: a no-op there. */
NCCL_EP_API ncclResult_t ncclEpComplete(ncclEpHandle_t handle, const ncclEpCompleteConfig_t* config,
                                        cudaStream_t stream);

/* Fault tolerance (Low-Latency groups made with enable_mask; else ncclInvalidUsage). The mask holds one int per
 * rank, 1 = active. Dispatch and combine skip masked ranks when sending and receiving: a masked rank's tokens are
 * not delivered, and its rows are not waited for. A peer that does not arrive at a call within the group's
 * timeout (its counts at dispatch, or the end of its previous call) is masked by the waiting rank, and the call
 * goes on without it. A peer that stops in the middle of a call (its counts came, a row did not; or any row
 * of a combine) is masked too, and then that call's outputs are incomplete: the next call on the group, or
 * ncclEpGroupGetAsyncError, returns ncclRemoteError once, naming it. A rank masked in its own mask sends and
 * receives nothing. Change the mask only between a combine and the next dispatch.
 * Across NVLink domains (not in the mixed test mode): the rail exchange has no message to or from a rank that this
 * rank's ncclEpMaskUpdate marked inactive (none at all when it marks this rank), so every rank must make the same
 * update; a rank of another domain that stops calling leaves its rail messages unmatched, and the rail's watchdog
 * then fails the group (ncclRemoteError) instead of masking it; a captured call's exchange keeps the mask of its
 * capture (capture again after an update); ncclEpMaskClean meets the other domains' active ranks over the rail. */
/* Local, stream-ordered: copies the mask (nRanks int32) into `mask_dev` (device memory). */
NCCL_EP_API ncclResult_t ncclEpMaskQuery(ncclEpGroup_t group, int* mask_dev, cudaStream_t stream);
/* Local, stream-ordered: sets the mask from `mask_host` (nRanks ints in host memory, nonzero = active; read
 * before the call returns). */
NCCL_EP_API ncclResult_t ncclEpMaskUpdate(ncclEpGroup_t group, const int* mask_host, cudaStream_t stream);
/* COLLECTIVE over the ranks active in this rank's mask (and this rank), stream-ordered: a barrier among them (a rank that
 * does not arrive within the timeout is masked), then every Low-Latency flag and call number of the group is reset,
 * then a second barrier, so that ranks whose calls diverged (one that missed calls while masked, and is made
 * active again by every rank's ncclEpMaskUpdate) continue in step. No send-only call may be open. Ranks outside it
 * must not be running calls of the group. */
NCCL_EP_API ncclResult_t ncclEpMaskClean(ncclEpGroup_t group, cudaStream_t stream);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* NCCL_EP_H_ */
