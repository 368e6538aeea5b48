// GPU tests of nccl_ep Low-Latency (LL) dispatch/combine against the host reference model
// (tests/unit/ep_ll_reference.h), bit for bit.
//
// Every case: all ranks derive the same global routing from the case's seed; token rows are bf16 values exact in
// bf16 (small integers times a power of two per 128-column block) that name (source rank, token, column), fp8 rows
// hashed bytes; every output is poisoned (0xff) before the call, and only the rows the layout declares valid are
// compared (LL does not write the rest): RANK_MAJOR row s * M + j is the reference's slot (s, j), EXPERT_MAJOR row
// e * R * M + i its zone row (e, i). Tokens, fp8 scales, local expert ids and src_info compare byte for byte (fp8
// quantisation against common/numeric.h's fp8QuantizeRow), weights and the layout-info counters exactly. Combine
// inputs are bf16 values of 3 significant bits per (rank, row, column), rows past the counts poisoned with bf16 NaNs
// (a kernel that sums one shows it); combine output compares bit-exact with the reference's bf16, for RANK_MAJOR
// (summed in rank order) and both EXPERT_MAJOR paths (weights that travelled with dispatch, or the owner's
// inputs.topk_weights, different from dispatch's so that the two cannot be mixed up).
// Cases, each on both layouts: random routings at several sizes (M 1..256, top-k 1..8, E = R, 4R, 8R experts, H
// 128..2048 and one 7168), one hot expert that fills its zone, a rank nobody routes to, ranks with 0 and 1 tokens,
// mostly -1 slots, no dispatch weights, only the required outputs, fp8 quantised (round_scale 0 and 1), fp8
// forwarded, NVFP4 quantised under a global scale (against common/numeric.h's nvfp4QuantizeRow) and forwarded (packed
// bytes and e4m3 scale bytes as they are), a handle rebound with ncclEpUpdateHandle, send-only dispatch and combine each finished by
// ncclEpComplete; then CUDA graphs (global capture mode) of dispatch + combine (one of them send-only + complete)
// replayed 1000 times with fresh inputs written by a kernel between replays, every 100th and the last checked in
// full; argument checks that must return an error, not crash (FLAT, EXACT sizing, alignment 8, T > M, top-k above
// max_topk, fp8 output with H % 128 != 0 or without scales, RANK_MAJOR combine with weights, a second call of a
// kind while a send-only one is open, a combine or an update of a handle with an open call, ncclEpComplete with
// nothing open); double-buffered send-only calls of two handles interleaved as two micro-batches (dispatch A,
// dispatch B, complete A, combine A, complete B, combine B, complete A, complete B; completing out of order, a
// third open dispatch and a plain one while two are open refused); masks on a group with enable_mask and a short
// budget: every rank masks the last one (with one rank: itself), missing_experts against the reference's count,
// ncclEpMaskQuery; (2+ ranks) the last rank skips a dispatch + combine (the others mask it when its counts do not
// come: the reference with it masked, no error), then after ncclEpMaskClean it skips only a combine (the others
// get ncclRemoteError once, naming it), then after another clean everyone gives the full reference; (2+ ranks) a
// straggler on a group of its own: the last rank 200 ms late at a dispatch and a combine, the others'
// recv_wait_cycles for it above 10^7 cycles inside a domain (runStraggler); and (2+ ranks) the timeout path on a
// group of its own: one rank skips a dispatch, the others get ncclRemoteError and no call hangs; (1 rank, real
// GPU) a call on every SM beside a kernel that holds one SM longer than the budget waits for it and succeeds (the
// cooperative launch: runBesideHeldSm).
//
// With several domains (--one-gpu nodes: every rank a domain of its own) the same suite runs over the rail exchange,
// masks with the masked rank skipping a call instead of an active one skipping (see runMasked; the mixed mode: none,
// its relays do not mask); the timeout test then expects the rail's watchdog.
// Any CUDA error of the test's own calls, and any left at the end (tests/harness), fails the run.
//
// --one-gpu mixed: one-GPU nodes of 2 virtual ranks each, the groups made with virtual_rail (relayed exchanges).
// Usage: ep_ll_test [--nranks N] [--one-gpu off|nodes|virtual|mixed] [--seed S] [--timeout-s S] [--silent-peer-s S]
//                   [--sms N] [--quick] [--graph-only] [--back-to-back] [--soak CALLS] [--json FILE]
// --quick (the sanitizer runs): a few cases, 5 graph replays, all checked. --silent-peer-s: the timeout test's
// budget (default 1.5 s). --graph-only / --back-to-back: the mixed mode's replay experiment (gGraphOnly below).
// --soak CALLS: only the soak (Runner::runSoak, soakMain): CALLS checked dispatch + combine pairs with handle churn,
// device and host memory flat; its JSON line is test ep_ll_soak.
//                                                                              Exit: 0 pass, 1 fail, 77 no GPU.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/device_status.h"
#include "common/numeric.h"
#include "common/status.h"
#include "nccl_ep.h"
#include "tests/harness/cli.h"
#include "tests/harness/cuda_check.h"
#include "tests/harness/ep_testing.h"
#include "tests/harness/ep_tensor.h"
#include "tests/harness/silent_peer.h"
#include "tests/harness/soak.h"
#include "tests/harness/launcher.h"
#include "tests/unit/ep_ll_reference.h"

namespace {

using ncclep::llref::RankRecv;
using ncclep::llref::Routing;
using ncclext::harness::epTensor;

constexpr int kMaxTopk = 8;  // every group's max_topk
constexpr int kReplays = 1000;
constexpr int kCheckEvery = 100;  // graph replays checked in full: every 100th and the last
// The group's device-wait budget (--timeout-s; the sanitizer runs raise it, their kernels being far slower).
double gTimeoutSeconds = 3;
int gSms = 0;  // --sms: the groups' num_sms (0: the library's default)
// Experiments on the mixed mode's back-to-back replay hang (docs/ARCHITECTURE.md): --graph-only runs the graph-replay
// cases alone; --back-to-back launches mixed mode's replays without waiting for each (as the other modes do).
bool gGraphOnly = false;
int gSoak = 0;  // --soak CALLS: only the soak (Runner::runSoak)
bool gBackToBack = false;
double gSilentPeerSeconds = 1.5;  // the timeout test's budget (--silent-peer-s), on a group of its own

enum RoutingKind {
  kRandom,        // distinct random experts, 10% -1 slots, 0 or 1 tokens now and then, a full rank at times
  kOneExpert,     // every token of every (full) rank names one expert, the rest -1: its zone fills to R * M rows
  kOneRankEmpty,  // nobody names an expert of rank R / 2 (with one rank: every slot -1)
  kTinyRanks,     // ranks with 0 and with 1 token beside random ones
  kSparse,        // 70% of the slots -1
};
// What dispatch takes and returns: bf16; e4m3 quantised by the sender (scales per 128 columns, or powers of two) or
// forwarded; NVFP4 (uint8, two columns a byte, e4m3 scales per 16) quantised under a global scale or forwarded.
// kFp8Ue8m0 / kFp8ForwardedUe8m0: fp8 with int32 scales, four UE8M0 exponent bytes a word (one per 128 columns).
// kFp8ForwardedPerToken / kFp8ForwardedWords: forwarded fp8 with scale words of the caller's own layout, one fp32 a
// token or three int32 a token (neither the per-block count: the row's first slice moves them all).
enum Tokens {
  kBf16,
  kFp8Quantised,
  kFp8Pow2Scales,
  kFp8Forwarded,
  kFp4Quantised,
  kFp4Forwarded,
  kFp8Ue8m0,
  kFp8ForwardedUe8m0,
  kFp8ForwardedPerToken,
  kFp8ForwardedWords
};
bool isFp4(Tokens t) { return t == kFp4Quantised || t == kFp4Forwarded; }
bool isUe8m0(Tokens t) { return t == kFp8Ue8m0 || t == kFp8ForwardedUe8m0; }
bool fp8In(Tokens t) {
  return t == kFp8Forwarded || t == kFp8ForwardedUe8m0 || t == kFp8ForwardedPerToken || t == kFp8ForwardedWords;
}
bool int32Scales(Tokens t) { return isUe8m0(t) || t == kFp8ForwardedWords; }
// The NVFP4 global scale: 448 x 6 over the largest token magnitude tokenBits draws (127 x 2^4).
constexpr float kFp4GlobalScale = 448.0f * 6.0f / 2032.0f;
enum Combine { kByRank, kWeightsAtDispatch, kWeightsAtCombine, kBothPaths };
enum Kind { kDispatchCombine, kGraph, kValidation, kDoubleBuffered, kMasked };

struct Case {
  std::string name;
  Kind kind = kDispatchCombine;
  ncclEpLayout_t layout = NCCL_EP_LAYOUT_RANK_MAJOR;
  RoutingKind routing = kRandom;
  Tokens tokens = kBf16;
  Combine combine = kByRank;                // EXPERT_MAJOR: kBothPaths (a round each) unless one is named
  int maxTokens = 128, expertsPerRank = 4;  // M and E / R: the group the case runs on
  int topk = 8, hidden = 1024;
  bool dispatchWeights = true;  // inputs.topk_weights given to dispatch (else every weight is 1)
  bool idx64 = false;           // topk_idx as int64
  bool bare = false;            // only the required outputs (tokens, fp8 scales), no layout_info
  bool update = false;          // then ncclEpUpdateHandle to a second routing, and the rounds again
  bool sendOnly = false;        // dispatch and combine each send-only, then ncclEpComplete
  bool masked = false;          // on a group with enable_mask: combine also returns missing_experts
  bool quick = false;           // one of --quick's cases
};

// ---- Values: one definition for the fill kernel and the host reference. ----

__host__ __device__ inline uint32_t mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return (uint32_t)x;
}

__host__ __device__ inline uint64_t key(uint64_t seed, uint64_t salt, int a, int b, int c) {
  return seed * 0x9e3779b97f4a7c15ull ^ salt << 58 ^ (uint64_t)a << 48 ^ (uint64_t)b << 24 ^ (uint64_t)c;
}

// bf16 bits of token t of rank s at column col: an integer in [-127, 127] times a power of two in [2^-4, 2^4] drawn
// per 128-column block, exact in bf16. A block other than the first is all zeros now and then: fp8 scales then
// differ between rows and blocks and meet kFp8MinAmax.
__host__ __device__ inline uint16_t tokenBits(uint64_t seed, int s, int t, int col) {
  const int block = col / ncclext::kFp8BlockElems;
  const uint32_t b = mix(key(seed, 1, s, t, block));
  if (block > 0 && b % 16 == 0) return 0;
  const int v = (int)(mix(key(seed, 2, s, t, col)) % 255) - 127;
  const int e = (int)((b >> 4) % 9) - 4;
  return ncclext::floatToBf16((float)v * ncclext::bitsFloat((uint32_t)(127 + e) << 23));
}
// fp8 e4m3 input bytes (never a NaN) and their scales: forwarded as they are.
__host__ __device__ inline uint8_t fp8Byte(uint64_t seed, int s, int t, int col) {
  const uint8_t b = (uint8_t)mix(key(seed, 3, s, t, col));
  return (b & 0x7f) == 0x7f ? (uint8_t)(b ^ 1) : b;
}
__host__ __device__ inline float scaleOf(uint64_t seed, int s, int t, int i) {
  return 1.0f + (float)(mix(key(seed, 4, s, t, i)) % 1000) / 250.0f;
}
// Top-k weights in 1/16 steps: few bits, so that weighted sums stay meaningful.
__host__ __device__ inline float weightOf(uint64_t seed, int s, int t, int k) {
  return (float)(1 + mix(key(seed, 5, s, t, k)) % 16) / 16.0f;
}
// The owner's weights at combine: other values than dispatch's.
inline uint64_t combineWeightSeed(uint64_t seed) { return ~seed; }
// Combine input of rank d at row `row` of its dispatch layout: 3 significant bits.
__host__ __device__ inline uint16_t combineBits(uint64_t seed, int d, int row, int col) {
  return ncclext::floatToBf16((float)((int)(mix(key(seed, 6, d, row, col)) % 15) - 7) / 8.0f);
}

enum class Fill { kTokensBf16, kTokensFp8, kScales, kWeights, kCombineIn };

// Writes `n` elements of a [n / cols, cols] input of rank `rank`. kCombineIn: rows with valid[row] == 0 get bf16 NaNs.
__global__ void fillKernel(Fill what, void* out, int64_t n, int cols, uint64_t seed, int rank, const uint8_t* valid) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const int row = (int)(i / cols), col = (int)(i % cols);
    switch (what) {
      case Fill::kTokensBf16:
        static_cast<uint16_t*>(out)[i] = tokenBits(seed, rank, row, col);
        break;
      case Fill::kTokensFp8:
        static_cast<uint8_t*>(out)[i] = fp8Byte(seed, rank, row, col);
        break;
      case Fill::kScales:
        static_cast<float*>(out)[i] = scaleOf(seed, rank, row, col);
        break;
      case Fill::kWeights:
        static_cast<float*>(out)[i] = weightOf(seed, rank, row, col);
        break;
      case Fill::kCombineIn:
        static_cast<uint16_t*>(out)[i] = valid[row] ? combineBits(seed, rank, row, col) : (uint16_t)0xffff;
        break;
    }
  }
}

// ---- Routing and sizes. ----

// Top-k of a case: no expert twice in a row, so at most E.
int topkOf(const Case& c, int nRanks) { return std::min(c.topk, c.expertsPerRank * nRanks); }

Routing makeRouting(const Case& c, int nRanks, uint64_t seed) {
  Routing r;
  r.nRanks = nRanks;
  r.numExperts = c.expertsPerRank * nRanks;
  r.topk = topkOf(c, nRanks);
  r.maxTokens = c.maxTokens;
  const int M = c.maxTokens, E = r.numExperts, K = r.topk;
  std::mt19937_64 rng(seed);
  for (int s = 0; s < nRanks; s++) {
    int T = rng() % 7 == 0 ? (int)(rng() % 2) : 1 + (int)(rng() % M);
    if (c.routing == kRandom && s == nRanks - 1 && seed % 3 == 0) T = M;  // a full rank now and then
    if (c.routing == kOneExpert) T = M;
    if (c.routing == kTinyRanks) {
      // The shift by layout: with one rank, one layout's case has 0 tokens and the other's 1.
      const int k = (s + (c.layout == NCCL_EP_LAYOUT_EXPERT_MAJOR)) % 3;
      T = k == 0 ? 0 : k == 1 ? 1 : 1 + (int)(rng() % M);
    }
    r.numTokens.push_back(T);
    std::vector<int> idx((size_t)T * K, -1);
    std::vector<int> pool;
    for (int e = 0; e < E; e++)
      if (c.routing != kOneRankEmpty || r.owner(e) != nRanks / 2) pool.push_back(e);
    for (int t = 0; t < T; t++) {
      std::shuffle(pool.begin(), pool.end(), rng);
      for (int k = 0; k < K; k++) {
        int e = k < (int)pool.size() ? pool[k] : -1;
        if (c.routing == kOneExpert) e = k == t % K ? E - 1 : -1;
        if (c.routing == kRandom && rng() % 10 == 0) e = -1;
        if (c.routing == kSparse && rng() % 10 < 7) e = -1;
        idx[(size_t)t * K + k] = e;
      }
    }
    r.topkIdx.push_back(idx);
    r.weights.push_back(std::vector<float>((size_t)T * K, 1.0f));
  }
  return r;
}

// `r` with the weights of data seed `seed` (or 1 everywhere, as dispatch assumes when it is given none).
Routing withWeights(Routing r, bool given, uint64_t seed) {
  for (int s = 0; s < r.nRanks; s++)
    for (int t = 0; t < r.numTokens[s]; t++)
      for (int k = 0; k < r.topk; k++) r.weights[s][(size_t)t * r.topk + k] = given ? weightOf(seed, s, t, k) : 1.0f;
  return r;
}

struct Shape {  // one case's sizes on its group
  ncclEpLayout_t layout;
  Tokens tokens;
  int R, M, L, K, H, nScales;
  int64_t N;             // rows of the dispatch output: RANK_MAJOR R * M, EXPERT_MAJOR L * R * M
  size_t inRow, outRow;  // bytes of a token row into and out of dispatch
  bool rankMajor() const { return layout == NCCL_EP_LAYOUT_RANK_MAJOR; }
  // Where the reference's receive rows land in the dispatch output (and the combine input).
  int64_t slotRow(int s, int j) const { return (int64_t)s * M + j; }
  int64_t zoneRow(int e, int i) const { return (int64_t)e * R * M + i; }
};

Shape shapeOf(const Case& c, int nRanks) {
  Shape sh;
  sh.layout = c.layout;
  sh.tokens = c.tokens;
  sh.R = nRanks;
  sh.M = c.maxTokens;
  sh.L = c.expertsPerRank;
  sh.K = topkOf(c, nRanks);
  sh.H = c.hidden;
  // Scale words a row: one fp32 per 128 columns (fp8), four UE8M0 bytes per 512 (packed fp8), four e4m3 bytes per
  // 64 (NVFP4); the caller's own: one (per token) or three.
  sh.nScales = c.tokens == kBf16                    ? 0
               : c.tokens == kFp8ForwardedPerToken ? 1
               : c.tokens == kFp8ForwardedWords    ? 3
               : isUe8m0(c.tokens)                 ? c.hidden / 512
                                                   : c.hidden / (isFp4(c.tokens) ? 64 : ncclext::kFp8BlockElems);
  sh.N = (int64_t)(sh.rankMajor() ? 1 : sh.L) * sh.R * sh.M;
  sh.inRow = c.tokens == kFp4Forwarded ? (size_t)c.hidden / 2 : (size_t)c.hidden * (fp8In(c.tokens) ? 1 : 2);
  sh.outRow = isFp4(c.tokens) ? (size_t)c.hidden / 2 : (size_t)c.hidden * (c.tokens == kBf16 ? 2 : 1);
  return sh;
}

// 1 for the rows of this rank's dispatch output that hold data (the combine input's rows that must be read).
std::vector<uint8_t> validRows(const Shape& sh, const RankRecv& rr) {
  std::vector<uint8_t> v(sh.N, 0);
  if (sh.rankMajor()) {
    for (int s = 0; s < sh.R; s++)
      for (int j = 0; j < rr.rankCount[s]; j++) v[sh.slotRow(s, j)] = 1;
  } else {
    for (int e = 0; e < sh.L; e++)
      for (int i = 0; i < rr.expertCount[e]; i++) v[sh.zoneRow(e, i)] = 1;
  }
  return v;
}

// What one dispatch + combine must give this rank.
struct Expected {
  Routing r;                       // with the round's dispatch weights
  std::vector<RankRecv> recv;      // every rank's receive side
  std::vector<uint16_t> combined;  // this rank's combine output, bf16 bits [T * H]
};

Expected expect(const Case& c, const Shape& sh, const Routing& routing, Combine path, uint64_t ds, int me) {
  Expected x;
  x.r = withWeights(routing, c.dispatchWeights, ds);
  x.recv = ncclep::llref::dispatch(x.r);
  // Every rank's combine input, valid rows only, as the fill kernel writes them.
  std::vector<std::vector<std::vector<uint16_t>>> in(sh.R);
  for (int d = 0; d < sh.R; d++) {
    const RankRecv& rr = x.recv[d];
    const int blocks = sh.rankMajor() ? sh.R : sh.L;
    in[d].resize(blocks);
    for (int b = 0; b < blocks; b++) {
      const int rows = sh.rankMajor() ? rr.rankCount[b] : rr.expertCount[b];
      in[d][b].resize((size_t)rows * sh.H);
      for (int i = 0; i < rows; i++) {
        const int row = (int)(sh.rankMajor() ? sh.slotRow(b, i) : sh.zoneRow(b, i));
        for (int h = 0; h < sh.H; h++) in[d][b][(size_t)i * sh.H + h] = combineBits(ds, d, row, h);
      }
    }
  }
  if (path == kByRank) {
    x.combined = ncclep::llref::combineRankMajor(x.r, x.recv, in, sh.H)[me];
  } else if (path == kWeightsAtDispatch) {
    x.combined = ncclep::llref::combineExpertMajor(x.r, x.recv, in, sh.H, true)[me];
  } else {
    const Routing owner = withWeights(x.r, true, combineWeightSeed(ds));
    x.combined = ncclep::llref::combineExpertMajor(owner, x.recv, in, sh.H, false)[me];
  }
  return x;
}

// ---- Device memory and the calls' descriptors. ----

// This rank's stream and the count of failed CUDA calls and bounded waits of the test itself (any fails the run).
// Thread-local: the virtual-rank mode runs every rank as a thread of one process.
thread_local cudaStream_t tStream = nullptr;
using ncclext::harness::cudaOk;
using ncclext::harness::tCudaErrors;

// The rank's stream drained, within the group budget plus a margin (a bare cudaStreamSynchronize could hang).
bool drained(const char* what) {
  if (ncclext::waitStream(tStream, gTimeoutSeconds + 30, what) == ncclSuccess) return true;
  if (tCudaErrors++ < 5) fprintf(stderr, "the test's stream did not drain: %s\n", ncclext::lastError());
  return false;
}

// Device memory of the test, stream-ordered on the rank's stream: a cudaFree would wait for every kernel on the GPU,
// which with virtual ranks includes peers' kernels that wait for this rank's next call. Host copies go through
// pageable memory, so they wait for the stream with a budget first (docs/ARCHITECTURE.md, "Host waits").
struct DeviceBuf {
  void* p = nullptr;
  size_t bytes = 0;
  explicit DeviceBuf(size_t n) : bytes(std::max<size_t>(n, 16)) {
    cudaOk(cudaMallocAsync(&p, bytes, tStream), "cudaMallocAsync");
  }
  ~DeviceBuf() {
    if (p) cudaOk(cudaFreeAsync(p, tStream), "cudaFreeAsync");
  }
  DeviceBuf(const DeviceBuf&) = delete;
  DeviceBuf& operator=(const DeviceBuf&) = delete;
  void poison() { cudaOk(cudaMemsetAsync(p, 0xff, bytes, tStream), "poison"); }  // stream-ordered, no wait
  template <typename T>
  std::vector<T> get(size_t n) const {
    std::vector<T> v(n);
    if (n && ncclext::copyToHostAfter(tStream, v.data(), p, n * sizeof(T), gTimeoutSeconds + 30, "copy to host") !=
                 ncclSuccess) {
      if (tCudaErrors++ < 5) fprintf(stderr, "copy to host: %s\n", ncclext::lastError());
    }
    return v;
  }
  void put(const void* src, size_t n) {
    if (n == 0 || !drained("before a copy to device")) return;  // empty: its host vector may have no storage
    cudaOk(cudaMemcpyAsync(p, src, n, cudaMemcpyHostToDevice, tStream), "copy to device");
    drained("copy to device");
  }
};

// Writes a [rows, cols] input of this rank on the stream (see fillKernel).
void fill(Fill what, DeviceBuf& b, int64_t rows, int cols, uint64_t seed, int rank, const DeviceBuf* valid = nullptr) {
  const int64_t n = rows * cols;
  if (n == 0) return;
  const int blocks = (int)std::min<int64_t>(128, (n + 255) / 256);
  fillKernel<<<blocks, 256, 0, tStream>>>(what, b.p, n, cols, seed, rank,
                                          valid ? static_cast<const uint8_t*>(valid->p) : nullptr);
  cudaOk(cudaGetLastError(), "fill kernel");
}

// Inputs sized for M tokens (any routing of the group, so that a rebound handle keeps them), outputs for N rows.
struct Buffers {
  DeviceBuf topk, x, scales, weights, combineWeights, combineIn, valid;
  DeviceBuf y, yScales, yWeights, yIdx, ySrc, combineOut, missing;
  DeviceBuf expertCounters, srcRankCounters, expertOffsets, recvTotal, globalScale;
  explicit Buffers(const Shape& s)
      : topk((size_t)s.M * s.K * 8),
        x((size_t)s.M * s.inRow),
        scales((size_t)s.M * s.nScales * 4),
        weights((size_t)s.M * s.K * 4),
        combineWeights((size_t)s.M * s.K * 4),
        combineIn((size_t)s.N * s.H * 2),
        valid((size_t)s.N),
        y((size_t)s.N * s.outRow),
        yScales((size_t)s.N * s.nScales * 4),
        yWeights((size_t)s.N * s.K * 4),
        yIdx((size_t)s.N * s.K * 4),
        ySrc((size_t)s.N * 4),
        combineOut((size_t)s.M * s.H * 2),
        missing((size_t)s.M * 4),
        expertCounters((size_t)s.L * 4),
        srcRankCounters((size_t)s.R * 4),
        expertOffsets((size_t)s.L * 4),
        recvTotal(4),
        globalScale(4) {}
  void poisonOutputs() {
    for (DeviceBuf* b : {&y, &yScales, &yWeights, &yIdx, &ySrc, &combineOut, &missing, &expertCounters,
                         &srcRankCounters, &expertOffsets, &recvTotal})
      b->poison();
  }
};

// One dispatch + combine of a handle with T tokens.
struct Call {
  ncclEpDispatchInputs_t in = NCCL_EP_DISPATCH_INPUTS_INIT;
  ncclEpDispatchOutputs_t out = NCCL_EP_DISPATCH_OUTPUTS_INIT;
  ncclEpLayoutInfo_t info = NCCL_EP_LAYOUT_INFO_INIT;
  bool withInfo = false;
  ncclEpDispatchConfig_t config = NCCL_EP_DISPATCH_CONFIG_INIT;
  ncclEpCombineInputs_t cin = NCCL_EP_COMBINE_INPUTS_INIT;
  ncclEpCombineOutputs_t cout = NCCL_EP_COMBINE_OUTPUTS_INIT;
};

Call describe(const Case& c, const Shape& sh, Buffers& b, int T, Combine path) {
  Call k;
  const bool fp4 = isFp4(sh.tokens);
  const ncclDataType_t inType = fp8In(sh.tokens)             ? ncclFloat8e4m3
                                : sh.tokens == kFp4Forwarded ? ncclUint8
                                                             : ncclBfloat16;
  const ncclDataType_t outType = sh.tokens == kBf16 ? ncclBfloat16 : fp4 ? ncclUint8 : ncclFloat8e4m3;
  k.in.tokens = epTensor(b.x.p, inType, {T, sh.tokens == kFp4Forwarded ? sh.H / 2 : sh.H});
  if (c.dispatchWeights) k.in.topk_weights = epTensor(b.weights.p, ncclFloat32, {T, sh.K});
  const ncclDataType_t scaleType = int32Scales(sh.tokens) ? ncclInt32 : ncclFloat32;
  if (fp8In(sh.tokens)) k.in.scales = epTensor(b.scales.p, scaleType, {T, sh.nScales});
  if (sh.tokens == kFp4Forwarded) k.in.scales = epTensor(b.scales.p, ncclFloat8e4m3, {T, sh.H / 16});
  if (sh.tokens == kFp4Quantised) k.in.global_scale = epTensor(b.globalScale.p, ncclFloat32, {1});
  k.out.tokens = epTensor(b.y.p, outType, {sh.N, fp4 ? sh.H / 2 : sh.H});
  if (sh.nScales && !fp4) k.out.scales = epTensor(b.yScales.p, scaleType, {sh.N, sh.nScales});
  if (fp4) k.out.scales = epTensor(b.yScales.p, ncclUint8, {sh.N, sh.H / 16});
  if (!c.bare) {
    k.out.topk_weights = sh.rankMajor() ? epTensor(b.yWeights.p, ncclFloat32, {sh.N, sh.K})
                                        : epTensor(b.yWeights.p, ncclFloat32, {sh.N});
    if (sh.rankMajor()) k.out.topk_idx = epTensor(b.yIdx.p, ncclInt32, {sh.N, sh.K});
    k.out.src_info = epTensor(b.ySrc.p, ncclInt32, {sh.N});
    k.info.expert_counters = epTensor(b.expertCounters.p, ncclInt32, {sh.L});
    k.info.src_rank_counters = epTensor(b.srcRankCounters.p, ncclInt32, {sh.R});
    k.info.expert_offsets = epTensor(b.expertOffsets.p, ncclInt32, {sh.L});
    k.info.recv_total_counter = epTensor(b.recvTotal.p, ncclInt32, {1});
    k.withInfo = true;
  }
  k.config.round_scale = sh.tokens == kFp8Pow2Scales;
  k.cin.tokens = epTensor(b.combineIn.p, ncclBfloat16, {sh.N, sh.H});
  if (path == kWeightsAtCombine) k.cin.topk_weights = epTensor(b.combineWeights.p, ncclFloat32, {T, sh.K});
  k.cout.tokens = epTensor(b.combineOut.p, ncclBfloat16, {T, sh.H});
  if (c.masked) k.cout.missing_experts = epTensor(b.missing.p, ncclInt32, {T});
  return k;
}

// The bytes (and fp8 scales) dispatch must deliver for token t of rank s.
void expectedRow(const Shape& sh, uint64_t ds, int s, int t, std::vector<uint8_t>* row, std::vector<float>* scales) {
  row->resize(sh.outRow);
  scales->resize(sh.nScales);
  if (fp8In(sh.tokens)) {  // any scale words, forwarded bit for bit
    for (int h = 0; h < sh.H; h++) (*row)[h] = fp8Byte(ds, s, t, h);
    for (int i = 0; i < sh.nScales; i++) (*scales)[i] = scaleOf(ds, s, t, i);
    return;
  }
  if (sh.tokens == kFp4Forwarded) {  // the packed bytes and the e4m3 scale bytes as the fill kernel writes them
    for (size_t i = 0; i < sh.outRow; i++) (*row)[i] = fp8Byte(ds, s, t, (int)i);
    uint8_t* sb = reinterpret_cast<uint8_t*>(scales->data());
    for (int i = 0; i < sh.H / 16; i++) sb[i] = fp8Byte(~ds, s, t, i);
    return;
  }
  std::vector<uint16_t> bits(sh.H);
  for (int h = 0; h < sh.H; h++) bits[h] = tokenBits(ds, s, t, h);
  if (sh.tokens == kBf16) {
    memcpy(row->data(), bits.data(), sh.outRow);
    return;
  }
  std::vector<float> x(sh.H);
  for (int h = 0; h < sh.H; h++) x[h] = ncclext::bf16ToFloat(bits[h]);
  if (sh.tokens == kFp4Quantised) {
    ncclext::nvfp4QuantizeRow(x.data(), sh.H, kFp4GlobalScale, row->data(), reinterpret_cast<uint8_t*>(scales->data()));
    return;
  }
  if (sh.tokens == kFp8Ue8m0) {  // powers of two without round_scale (UE8M0 implies it), each its exponent byte
    std::vector<float> full(sh.H / ncclext::kFp8BlockElems);
    ncclext::fp8QuantizeRow(x.data(), sh.H, true, row->data(), full.data());
    uint8_t* sb = reinterpret_cast<uint8_t*>(scales->data());
    for (size_t b = 0; b < full.size(); b++) sb[b] = (uint8_t)(ncclext::floatBits(full[b]) >> 23);
    return;
  }
  ncclext::fp8QuantizeRow(x.data(), sh.H, sh.tokens == kFp8Pow2Scales, row->data(), scales->data());
}

long firstDiff(const void* a, const void* b, size_t n) {
  const uint8_t *x = static_cast<const uint8_t*>(a), *y = static_cast<const uint8_t*>(b);
  for (size_t i = 0; i < n; i++)
    if (x[i] != y[i]) return (long)i;
  return -1;
}

#define EXPECT_OK(call)                                                                                      \
  do {                                                                                                       \
    ncclResult_t r_ = (call);                                                                                \
    if (r_ != ncclSuccess) {                                                                                 \
      fprintf(stderr, "rank %d [%s] %s -> %s: %s\n", ctx.rank, label.c_str(), #call, ncclGetErrorString(r_), \
              ncclEpGetLastError());                                                                         \
      return 1;                                                                                              \
    }                                                                                                        \
  } while (0)

// ---- The test. ----

struct Runner {
  Runner(ncclext::harness::RankContext& c, const ncclEpGroupConfig_t& b) : ctx(c), base(b) {}
  ncclext::harness::RankContext& ctx;
  ncclEpGroupConfig_t base;  // the test's group settings; sizes per group
  ncclEpGroup_t group = nullptr;
  int groupM = 0, groupL = 0;  // the open group's max_tokens_per_rank and local experts
  int errors = 0, validationChecks = 0;
  bool acrossDomains = false;  // several NVLink domains: a rank that skips a call fails the rail (runMasked)
  std::string lastBad;

  void bad(const std::string& label, const char* what, long a = 0, long b = 0) {
    if (errors++ < 10 || lastBad != label)
      fprintf(stderr, "rank %d [%s] %s (%ld, %ld)\n", ctx.rank, label.c_str(), what, a, b);
    lastBad = label;
  }
  int wait(const char* what) {
    ncclResult_t r = ncclext::waitStream(ctx.stream, gTimeoutSeconds + 30, what);
    if (r == ncclSuccess) r = ncclEpGroupGetAsyncError(group);
    if (r != ncclSuccess) fprintf(stderr, "rank %d %s: %s\n", ctx.rank, what, ncclEpGetLastError());
    return r == ncclSuccess ? 0 : 1;
  }

  ncclEpGroupConfig_t groupConfig(int M, int L, int maxHidden) const {
    ncclEpGroupConfig_t cfg = base;
    cfg.num_experts = L * ctx.nRanks;
    cfg.max_tokens_per_rank = M;
    cfg.max_token_bytes = maxHidden * 2;
    return cfg;
  }
  int openGroup(int M, int L, int maxHidden) {
    const ncclEpGroupConfig_t cfg = groupConfig(M, L, maxHidden);
    if (ncclext::harness::createEpGroup(&group, ctx.comm, &cfg) != ncclSuccess) {
      fprintf(stderr, "rank %d: ncclEpCreateGroup (M %d, E %d, %d B rows): %s\n", ctx.rank, M, cfg.num_experts,
              cfg.max_token_bytes, ncclEpGetLastError());
      return 1;
    }
    groupM = M;
    groupL = L;
    return 0;
  }
  int closeGroup() {
    if (!group) return 0;
    const ncclResult_t r = ncclEpGroupDestroy(group);
    group = nullptr;
    if (r != ncclSuccess) fprintf(stderr, "rank %d: ncclEpGroupDestroy: %s\n", ctx.rank, ncclEpGetLastError());
    return r == ncclSuccess ? 0 : 1;
  }

  // Binds `r` to `*h` (a new handle, or ncclEpUpdateHandle on the existing one) and uploads the valid-row mask.
  int bind(const std::string& label, const Case& c, const Shape& sh, Buffers& b, const Routing& r, ncclEpHandle_t* h) {
    const int T = r.numTokens[ctx.rank];
    const std::vector<int>& idx = r.topkIdx[ctx.rank];
    if (c.idx64) {
      const std::vector<int64_t> v(idx.begin(), idx.end());
      b.topk.put(v.data(), v.size() * 8);
    } else {
      b.topk.put(idx.data(), idx.size() * 4);
    }
    const std::vector<uint8_t> valid = validRows(sh, ncclep::llref::dispatch(r)[ctx.rank]);
    b.valid.put(valid.data(), valid.size());
    const ncclEpTensor_t ti = epTensor(b.topk.p, c.idx64 ? ncclInt64 : ncclInt32, {T, sh.K});
    if (*h) {
      EXPECT_OK(ncclEpUpdateHandle(*h, &ti, nullptr, ctx.stream));
      return 0;
    }
    EXPECT_OK(ncclEpCreateHandle(h, group, c.layout, &ti, nullptr, nullptr, ctx.stream));  // WORST_CASE
    int64_t rows = 0;
    EXPECT_OK(ncclEpHandleGetMaxRecvRows(*h, &rows));
    if (rows != sh.N) bad(label, "ncclEpHandleGetMaxRecvRows differs from R * M (EXPERT_MAJOR: L * R * M)", rows, sh.N);
    return 0;
  }

  void fillInputs(const Case& c, const Shape& sh, Buffers& b, int T, uint64_t ds) {
    const int me = ctx.rank;
    if (sh.tokens == kFp4Forwarded) {  // packed bytes, then e4m3 scale bytes (any byte: forwarded bit for bit)
      fill(Fill::kTokensFp8, b.x, T, sh.H / 2, ds, me);
      fill(Fill::kTokensFp8, b.scales, T, sh.H / 16, ~ds, me);
    } else {
      fill(fp8In(sh.tokens) ? Fill::kTokensFp8 : Fill::kTokensBf16, b.x, T, sh.H, ds, me);
    }
    if (fp8In(sh.tokens)) fill(Fill::kScales, b.scales, T, sh.nScales, ds, me);
    if (sh.tokens == kFp4Quantised) b.globalScale.put(&kFp4GlobalScale, 4);
    if (c.dispatchWeights) fill(Fill::kWeights, b.weights, T, sh.K, ds, me);
    fill(Fill::kWeights, b.combineWeights, T, sh.K, combineWeightSeed(ds), me);
    fill(Fill::kCombineIn, b.combineIn, sh.N, sh.H, ds, me, &b.valid);
  }

  int enqueue(const std::string& label, ncclEpHandle_t h, const Call& k, bool sendOnly = false) {
    ncclEpDispatchConfig_t dc = k.config;
    ncclEpCombineConfig_t cc = NCCL_EP_COMBINE_CONFIG_INIT;
    dc.send_only = cc.send_only = sendOnly;
    EXPECT_OK(ncclEpDispatch(h, &k.in, &k.out, k.withInfo ? &k.info : nullptr, &dc, ctx.stream));
    if (sendOnly) EXPECT_OK(ncclEpComplete(h, nullptr, ctx.stream));
    EXPECT_OK(ncclEpCombine(h, &k.cin, &k.cout, &cc, ctx.stream));
    if (sendOnly) EXPECT_OK(ncclEpComplete(h, nullptr, ctx.stream));
    return 0;
  }

  // Checks this rank's dispatch outputs (valid rows only) and layout info against the reference.
  void checkDispatch(const std::string& label, const Case& c, const Shape& sh, const Buffers& b, const Expected& x,
                     uint64_t ds) {
    const RankRecv& rr = x.recv[ctx.rank];
    const int K = sh.K;
    const auto y = b.y.get<uint8_t>(sh.N * sh.outRow);
    const auto ys = b.yScales.get<float>(sh.N * sh.nScales);
    const auto yw = c.bare ? std::vector<float>() : b.yWeights.get<float>(sh.N * (sh.rankMajor() ? K : 1));
    const auto yi = c.bare || !sh.rankMajor() ? std::vector<int>() : b.yIdx.get<int>(sh.N * K);
    const auto src = c.bare ? std::vector<int>() : b.ySrc.get<int>(sh.N);
    std::vector<uint8_t> want;
    std::vector<float> wantScales;
    int rowErrors = 0;
    // The row's token bytes and scales; false (reported) when they differ.
    auto checkRow = [&](int64_t row, int s, int t) {
      expectedRow(sh, ds, s, t, &want, &wantScales);
      const long at = firstDiff(&y[row * sh.outRow], want.data(), sh.outRow);
      if (at >= 0) return bad(label, "token bytes differ at row/byte", (long)row, at), false;
      const long q = firstDiff(ys.data() + row * sh.nScales, wantScales.data(), wantScales.size() * 4);
      if (q >= 0) return bad(label, "scales differ at row/word", (long)row, q / 4), false;
      return true;
    };
    if (sh.rankMajor()) {
      for (int s = 0; s < sh.R && rowErrors < 3; s++)
        for (int j = 0; j < rr.rankCount[s] && rowErrors < 3; j++) {
          const auto& slot = rr.slots[s][j];
          const int64_t row = sh.slotRow(s, j);
          bool ok = checkRow(row, s, slot.srcToken);
          if (!c.bare) {
            if (src[row] != slot.srcToken) {
              bad(label, "src_info differs at row", (long)row, src[row]);
              ok = false;
            }
            for (int k = 0; k < K && ok; k++) {
              if (yi[row * K + k] != slot.localIds[k]) {
                bad(label, "topk_idx differs at row/k", (long)row, k);
                ok = false;
              } else if (yw[row * K + k] != slot.weights[k]) {
                bad(label, "topk_weights differ at row/k", (long)row, k);
                ok = false;
              }
            }
          }
          rowErrors += !ok;
        }
    } else {
      for (int e = 0; e < sh.L && rowErrors < 3; e++)
        for (int i = 0; i < rr.expertCount[e] && rowErrors < 3; i++) {
          const auto& er = rr.zones[e][i];
          const int64_t row = sh.zoneRow(e, i);
          bool ok = checkRow(row, er.src, er.token);
          if (!c.bare && src[row] != er.srcInfo(sh.M)) {
            bad(label, "src_info differs at row", (long)row, src[row]);
            ok = false;
          } else if (!c.bare && yw[row] != er.weight) {
            bad(label, "topk_weights differ at row", (long)row);
            ok = false;
          }
          rowErrors += !ok;
        }
    }
    if (c.bare) return;
    const auto cntE = b.expertCounters.get<int>(sh.L), cntS = b.srcRankCounters.get<int>(sh.R);
    const auto offE = b.expertOffsets.get<int>(sh.L), total = b.recvTotal.get<int>(1);
    int64_t wantTotal = 0;
    for (int e = 0; e < sh.L; e++) {
      if (cntE[e] != rr.expertCount[e]) bad(label, "expert_counters differ at", e, cntE[e]);
      if (offE[e] != sh.zoneRow(e, 0)) bad(label, "expert_offsets differ at", e, offE[e]);
      if (!sh.rankMajor()) wantTotal += rr.expertCount[e];
    }
    for (int s = 0; s < sh.R; s++) {
      if (cntS[s] != rr.rankCount[s]) bad(label, "src_rank_counters differ at", s, cntS[s]);
      if (sh.rankMajor()) wantTotal += rr.rankCount[s];
    }
    if (total[0] != wantTotal) bad(label, "recv_total_counter differs", total[0], (long)wantTotal);
  }

  void checkCombine(const std::string& label, const Shape& sh, const Buffers& b, const Expected& x) {
    const int T = x.r.numTokens[ctx.rank];
    const auto got = b.combineOut.get<uint16_t>((size_t)T * sh.H);
    for (int t = 0; t < T; t++)
      for (int h = 0; h < sh.H; h++) {
        const size_t i = (size_t)t * sh.H + h;
        if (got[i] == x.combined[i]) continue;
        if (errors < 10)
          fprintf(stderr, "    got %a (0x%04x) want %a (0x%04x)\n", ncclext::bf16ToFloat(got[i]), got[i],
                  ncclext::bf16ToFloat(x.combined[i]), x.combined[i]);
        bad(label, "combine differs at token/col", t, h);
        return;
      }
  }

  // The rounds of one binding: RANK_MAJOR one, EXPERT_MAJOR one per combine path.
  std::vector<Combine> paths(const Case& c) const {
    if (c.layout == NCCL_EP_LAYOUT_RANK_MAJOR) return {kByRank};
    if (c.combine == kBothPaths) return {kWeightsAtDispatch, kWeightsAtCombine};
    return {c.combine};
  }
  static const char* pathName(Combine p) {
    return p == kByRank ? "by rank" : p == kWeightsAtDispatch ? "weights at dispatch" : "weights at combine";
  }

  // Fresh inputs, poisoned outputs, dispatch + combine, then every check.
  int round(const std::string& label, const Case& c, const Shape& sh, Buffers& b, const Routing& r, Combine path,
            uint64_t ds, ncclEpHandle_t h) {
    const int T = r.numTokens[ctx.rank];
    fillInputs(c, sh, b, T, ds);
    b.poisonOutputs();
    if (enqueue(label, h, describe(c, sh, b, T, path), c.sendOnly)) return 1;
    if (wait(label.c_str())) return 1;
    const Expected x = expect(c, sh, r, path, ds, ctx.rank);
    checkDispatch(label, c, sh, b, x, ds);
    checkCombine(label, sh, b, x);
    if (c.masked) checkMissing(label, b, x);
    return 0;
  }

  // missing_experts against the reference's count of the experts on masked ranks.
  void checkMissing(const std::string& label, const Buffers& b, const Expected& x) {
    const std::vector<int> want = ncclep::llref::missingExperts(x.r)[ctx.rank];
    const auto got = b.missing.get<int>(want.size());
    for (size_t t = 0; t < want.size(); t++)
      if (got[t] != want[t]) {
        bad(label, "missing_experts differs at token (got)", (long)t, got[t]);
        return;
      }
  }

  int runCase(const Case& c, uint64_t caseSeed) {
    const Shape sh = shapeOf(c, ctx.nRanks);
    Buffers b(sh);
    ncclEpHandle_t h = nullptr;
    Routing r = makeRouting(c, ctx.nRanks, caseSeed);
    std::string label = c.name;
    if (bind(label, c, sh, b, r, &h)) return 1;
    uint64_t ds = caseSeed * 16;
    for (int binding = 0; binding < (c.update ? 2 : 1); binding++) {
      if (binding == 1) {
        r = makeRouting(c, ctx.nRanks, caseSeed ^ 0x5eed5eedull);
        label = c.name + ", after ncclEpUpdateHandle";
        if (bind(label, c, sh, b, r, &h)) return 1;
      }
      for (Combine p : paths(c))
        if (round(label + " / " + pathName(p), c, sh, b, r, p, ds++, h)) return 1;
    }
    EXPECT_OK(ncclEpHandleDestroy(h));
    return 0;
  }

  // --soak: `calls` dispatch + combine pairs of case `c` on a group of their own, a new routing on a new handle every
  // kSoakHandleEvery pairs (the old handle destroyed), fresh inputs every pair, every kSoakCheckEvery-th pair and
  // the last checked on poisoned outputs; the group destroyed at the end.
  int soakCycle(const Case& c, uint64_t seed, int calls, ncclext::harness::SoakNumbers* n) {
    if (openGroup(c.maxTokens, c.expertsPerRank, c.hidden)) return 1;
    const Shape sh = shapeOf(c, ctx.nRanks);
    int rc = 0;
    {
      Buffers b(sh);
      ncclEpHandle_t h = nullptr;
      Routing r;
      for (int i = 0; i < calls && !rc; i++) {
        const std::string label = c.name + " / soak pair " + std::to_string(i);
        if (i % ncclext::harness::kSoakHandleEvery == 0) {
          if (h && ncclEpHandleDestroy(h) != ncclSuccess) {
            bad(label, "ncclEpHandleDestroy failed");
            rc = 1;
          }
          h = nullptr;
          r = makeRouting(c, ctx.nRanks, seed * 1000003 + i / ncclext::harness::kSoakHandleEvery);
          if (rc || bind(label, c, sh, b, r, &h)) rc = 1;
          n->handles++;
        }
        const int T = r.numTokens[ctx.rank];
        const uint64_t ds = seed * 4096 + i;
        const bool checked = i % ncclext::harness::kSoakCheckEvery == 0 || i == calls - 1;
        if (rc) break;
        fillInputs(c, sh, b, T, ds);
        if (checked) b.poisonOutputs();
        if (enqueue(label, h, describe(c, sh, b, T, kByRank))) rc = 1;
        n->calls++;
        if (rc || !checked) continue;
        if (wait(label.c_str())) rc = 1;
        if (rc) break;
        const Expected x = expect(c, sh, r, kByRank, ds, ctx.rank);
        checkDispatch(label, c, sh, b, x, ds);
        checkCombine(label, sh, b, x);
        n->checks++;
      }
      if (!rc && wait("soak: the last pair")) rc = 1;
      if (h && ncclEpHandleDestroy(h) != ncclSuccess) rc = 1;
    }  // the buffers go before the group
    rc |= closeGroup();
    return rc;
  }

  // The soak: a warm-up cycle of two handles, then the memory measured (no group open), `calls` pairs on a new
  // group, and the memory again: its growth is the soak's.
  int runSoak(const Case& c, uint64_t seed, int calls, ncclext::harness::SoakNumbers* n) {
    ncclext::harness::SoakNumbers warm;
    if (soakCycle(c, seed, 2 * ncclext::harness::kSoakHandleEvery, &warm)) return 1;
    const double budget = gTimeoutSeconds + 30;
    if (!ncclext::harness::measureMemory(ctx, budget, &n->deviceUsed0, &n->rss0)) return 1;
    const auto t0 = std::chrono::steady_clock::now();
    if (soakCycle(c, seed + 1, calls, n)) return 1;
    n->seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return ncclext::harness::measureMemory(ctx, budget, &n->deviceUsed1, &n->rss1) ? 0 : 1;
  }

  // Dispatch + combine captured once (global capture mode) and replayed: fresh inputs written by the fill kernel
  // before every replay (same routing), outputs poisoned before each checked one.
  int runGraph(const Case& c, uint64_t caseSeed, int replays, int checkEvery) {
    const std::string label = c.name;
    const Shape sh = shapeOf(c, ctx.nRanks);
    Buffers b(sh);
    ncclEpHandle_t h = nullptr;
    const Routing r = makeRouting(c, ctx.nRanks, caseSeed);
    const int T = r.numTokens[ctx.rank];
    const Combine path = paths(c)[0];
    if (bind(label, c, sh, b, r, &h)) return 1;
    const Call k = describe(c, sh, b, T, path);
    if (wait("graph setup")) return 1;
    // The capture is thread-local: with virtual ranks every rank is a thread of one process, and a global capture
    // would fail a peer's CUDA calls (mixed mode: the tail of the barrier's rail sum, a cudaFreeAsync) that overlap
    // it. The ranks meet before their captures and agree on the outcome after them, so that no rank replays a
    // graph that its peers do not.
    if (ncclext::harness::barrier(ctx, 60) != ncclSuccess) return bad(label, "barrier before capture"), 1;
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    bool ok = cudaOk(cudaStreamBeginCapture(ctx.stream, cudaStreamCaptureModeThreadLocal), "begin capture");
    if (ok) {
      ok = enqueue(label, h, k, c.sendOnly) == 0;  // no early return: the capture must end
      ok &= cudaOk(cudaStreamEndCapture(ctx.stream, &graph), "end capture");
    }
    uint64_t failed = 0;
    const bool met = ncclext::harness::sumOverRanks(ctx, ok ? 0 : 1, &failed, 60) == ncclSuccess;  // captures ended
    if (met && failed == 0) ok = cudaOk(cudaGraphInstantiate(&exec, graph, 0), "graph instantiate");
    if (!met || failed || ncclext::harness::sumOverRanks(ctx, ok ? 0 : 1, &failed, 60) != ncclSuccess || failed) {
      if (exec) cudaGraphExecDestroy(exec);
      if (graph) cudaGraphDestroy(graph);
      return bad(label, "capture or instantiation failed on ranks", (long)failed), 1;
    }
    for (int rep = 0; rep < replays; rep++) {
      const uint64_t ds = caseSeed * 4096 + rep;
      const bool checked = rep % checkEvery == 0 || rep == replays - 1;
      fillInputs(c, sh, b, T, ds);
      if (checked) b.poisonOutputs();
      if (!cudaOk(cudaGraphLaunch(exec, ctx.stream), "graph launch")) return 1;
      if (!checked) continue;
      const std::string at = label + " / replay " + std::to_string(rep);
      if (wait(at.c_str())) return 1;
      const Expected x = expect(c, sh, r, path, ds, ctx.rank);
      checkDispatch(at, c, sh, b, x, ds);
      checkCombine(at, sh, b, x);
    }
    if (wait("graph replays")) return 1;
    cudaOk(cudaGraphExecDestroy(exec), "graph exec destroy");
    cudaOk(cudaGraphDestroy(graph), "graph destroy");
    EXPECT_OK(ncclEpHandleDestroy(h));
    return 0;
  }

  // Calls that must be refused with ncclInvalidArgument or ncclInvalidUsage, on every rank alike (a refusal is
  // local, so no collective is left half-done), then a valid dispatch + combine: the group is still usable.
  int runValidation(const Case& c) {
    const std::string label = c.name;
    const int R = ctx.nRanks, M = groupM, E = groupL * R, H = 128, K = std::min(2, E), T = std::min(4, M);
    auto refused = [&](ncclResult_t res, const char* what) {
      validationChecks++;
      if (res != ncclInvalidArgument && res != ncclInvalidUsage)
        bad(label, (std::string(what) + " not refused: " + ncclGetErrorString(res)).c_str(), res);
    };
    // Distinct ids in every row of up to M + 1 tokens and kMaxTopk + 1 columns (-1 past E).
    const int rows = M + 1, cols = kMaxTopk + 1;
    std::vector<int> idx((size_t)rows * cols);
    for (int t = 0; t < rows; t++)
      for (int k = 0; k < cols; k++) idx[(size_t)t * cols + k] = k < E ? (t + k) % E : -1;
    DeviceBuf topk(idx.size() * 4);
    topk.put(idx.data(), idx.size() * 4);
    // [n, kk] views of the table: rows of `cols` ids, their first kk used by a handle of top-kk.
    std::vector<int> narrow((size_t)rows * K);
    for (int t = 0; t < rows; t++)
      for (int k = 0; k < K; k++) narrow[(size_t)t * K + k] = idx[(size_t)t * cols + k];
    DeviceBuf topkK(narrow.size() * 4);
    topkK.put(narrow.data(), narrow.size() * 4);
    const ncclEpTensor_t ti = epTensor(topkK.p, ncclInt32, {T, K});
    ncclEpHandle_t h = nullptr;
    auto refusedHandle = [&](ncclEpLayout_t layout, const ncclEpTensor_t& t, const ncclEpHandleConfig_t* hc,
                             const char* what) {
      h = nullptr;
      refused(ncclEpCreateHandle(&h, group, layout, &t, nullptr, hc, ctx.stream), what);
      if (h) {
        bad(label, (std::string(what) + ": a handle was returned").c_str());
        ncclEpHandleDestroy(h);
        h = nullptr;
      }
    };
    refusedHandle(NCCL_EP_LAYOUT_FLAT, ti, nullptr, "layout FLAT");
    ncclEpHandleConfig_t exact = NCCL_EP_HANDLE_CONFIG_INIT;
    exact.sizing = NCCL_EP_SIZING_EXACT;
    refusedHandle(NCCL_EP_LAYOUT_RANK_MAJOR, ti, &exact, "EXACT sizing");
    ncclEpHandleConfig_t aligned = NCCL_EP_HANDLE_CONFIG_INIT;
    aligned.dispatch_output_per_expert_alignment = 8;
    refusedHandle(NCCL_EP_LAYOUT_EXPERT_MAJOR, ti, &aligned, "alignment 8");
    refusedHandle(NCCL_EP_LAYOUT_RANK_MAJOR, epTensor(topkK.p, ncclInt32, {M + 1, K}), nullptr,
                  "max_tokens_per_rank + 1 tokens");
    refusedHandle(NCCL_EP_LAYOUT_RANK_MAJOR, epTensor(topk.p, ncclInt32, {T, cols}), nullptr, "top-k above max_topk");

    EXPECT_OK(ncclEpCreateHandle(&h, group, NCCL_EP_LAYOUT_RANK_MAJOR, &ti, nullptr, nullptr, ctx.stream));
    int64_t N = 0;
    EXPECT_OK(ncclEpHandleGetMaxRecvRows(h, &N));
    DeviceBuf x((size_t)T * H * 2), w((size_t)T * K * 4), y((size_t)N * H * 2), ys((size_t)N * 4),
        cin((size_t)N * H * 2), cout((size_t)T * H * 2);
    for (DeviceBuf* d : {&x, &w, &cin}) cudaOk(cudaMemsetAsync(d->p, 0, d->bytes, ctx.stream), "zero inputs");
    cout.poison();
    ncclEpDispatchInputs_t in = NCCL_EP_DISPATCH_INPUTS_INIT;
    in.tokens = epTensor(x.p, ncclBfloat16, {T, 64});
    ncclEpDispatchOutputs_t out = NCCL_EP_DISPATCH_OUTPUTS_INIT;
    out.tokens = epTensor(y.p, ncclFloat8e4m3, {N, 64});
    out.scales = epTensor(ys.p, ncclFloat32, {N, 1});
    refused(ncclEpDispatch(h, &in, &out, nullptr, nullptr, ctx.stream), "fp8 output of hidden 64");
    in.tokens = epTensor(x.p, ncclBfloat16, {T, H});
    out.tokens = epTensor(y.p, ncclFloat8e4m3, {N, H});
    out.scales = NCCL_EP_TENSOR_INIT;
    refused(ncclEpDispatch(h, &in, &out, nullptr, nullptr, ctx.stream), "fp8 output without outputs.scales");
    in.tokens = epTensor(x.p, ncclBfloat16, {T, 128});
    out.tokens = epTensor(y.p, ncclFloat8e4m3, {N, 128});
    out.scales = epTensor(ys.p, ncclInt32, {N, 1});
    refused(ncclEpDispatch(h, &in, &out, nullptr, nullptr, ctx.stream), "hidden 128 is not a multiple of 512");
    in.tokens = epTensor(x.p, ncclBfloat16, {T, H});
    out.scales = NCCL_EP_TENSOR_INIT;
    out.tokens = epTensor(y.p, ncclBfloat16, {N, H});
    EXPECT_OK(ncclEpDispatch(h, &in, &out, nullptr, nullptr, ctx.stream));
    ncclEpCombineInputs_t ci = NCCL_EP_COMBINE_INPUTS_INIT;
    ci.tokens = epTensor(cin.p, ncclBfloat16, {N, H});
    ci.topk_weights = epTensor(w.p, ncclFloat32, {T, K});
    ncclEpCombineOutputs_t co = NCCL_EP_COMBINE_OUTPUTS_INIT;
    co.tokens = epTensor(cout.p, ncclBfloat16, {T, H});
    refused(ncclEpCombine(h, &ci, &co, nullptr, ctx.stream), "RANK_MAJOR combine with inputs.topk_weights");
    ci.topk_weights = NCCL_EP_TENSOR_INIT;
    refused(ncclEpComplete(h, nullptr, ctx.stream), "ncclEpComplete with nothing pending");
    // A send-only dispatch leaves the dispatch open: another dispatch, a combine or an update of its handle are
    // refused until ncclEpComplete; then a send-only combine the same way.
    ncclEpDispatchConfig_t sendOnly = NCCL_EP_DISPATCH_CONFIG_INIT;
    sendOnly.send_only = 1;
    EXPECT_OK(ncclEpDispatch(h, &in, &out, nullptr, &sendOnly, ctx.stream));
    refused(ncclEpDispatch(h, &in, &out, nullptr, nullptr, ctx.stream), "a dispatch while one is open");
    refused(ncclEpCombine(h, &ci, &co, nullptr, ctx.stream), "a combine of a handle whose dispatch is open");
    refused(ncclEpUpdateHandle(h, &ti, nullptr, ctx.stream), "ncclEpUpdateHandle of a handle with an open call");
    EXPECT_OK(ncclEpComplete(h, nullptr, ctx.stream));
    ncclEpCombineConfig_t combineSendOnly = NCCL_EP_COMBINE_CONFIG_INIT;
    combineSendOnly.send_only = 1;
    EXPECT_OK(ncclEpCombine(h, &ci, &co, &combineSendOnly, ctx.stream));
    refused(ncclEpCombine(h, &ci, &co, nullptr, ctx.stream), "a combine while one is open");
    EXPECT_OK(ncclEpComplete(h, nullptr, ctx.stream));
    EXPECT_OK(ncclEpCombine(h, &ci, &co, nullptr, ctx.stream));
    if (wait("validation: the valid calls")) return 1;
    const auto got = cout.get<uint16_t>((size_t)T * H);  // zeros in, zeros out
    for (size_t i = 0; i < got.size(); i++)
      if (got[i] != 0) {
        bad(label, "combine of zeros after the refused calls differs at", (long)i, got[i]);
        break;
      }
    EXPECT_OK(ncclEpHandleDestroy(h));
    return 0;
  }

  void refusedCall(const std::string& label, ncclResult_t res, const char* what) {
    validationChecks++;
    if (res != ncclInvalidArgument && res != ncclInvalidUsage)
      bad(label, (std::string(what) + " not refused: " + ncclGetErrorString(res)).c_str(), res);
  }

  // Double-buffered staging, as two micro-batches overlap (DeepEP's two buffers): handles A and B with different
  // routings, send-only calls interleaved (dispatch A, dispatch B, complete A, combine A, complete B, combine B,
  // complete A, complete B); both checked in full. Refused on the way: completing B before A, a third open
  // dispatch, a plain dispatch while two are open.
  int runDoubleBuffered(const Case& c, uint64_t caseSeed) {
    const std::string label = c.name;
    const Shape sh = shapeOf(c, ctx.nRanks);
    const Combine path = paths(c)[0];
    Buffers bA(sh), bB(sh);
    ncclEpHandle_t hA = nullptr, hB = nullptr, hC = nullptr;
    const Routing rA = makeRouting(c, ctx.nRanks, caseSeed), rB = makeRouting(c, ctx.nRanks, caseSeed ^ 0xb0b0ull);
    if (bind(label + " A", c, sh, bA, rA, &hA) || bind(label + " B", c, sh, bB, rB, &hB)) return 1;
    const int TA = rA.numTokens[ctx.rank], TB = rB.numTokens[ctx.rank];
    const ncclEpTensor_t tiC = epTensor(bA.topk.p, c.idx64 ? ncclInt64 : ncclInt32, {TA, sh.K});
    EXPECT_OK(ncclEpCreateHandle(&hC, group, c.layout, &tiC, nullptr, nullptr, ctx.stream));
    const uint64_t dsA = caseSeed * 16, dsB = dsA + 1;
    fillInputs(c, sh, bA, TA, dsA);
    fillInputs(c, sh, bB, TB, dsB);
    bA.poisonOutputs();
    bB.poisonOutputs();
    const Call kA = describe(c, sh, bA, TA, path), kB = describe(c, sh, bB, TB, path);
    ncclEpDispatchConfig_t dA = kA.config, dB = kB.config;
    dA.send_only = dB.send_only = 1;
    ncclEpCombineConfig_t cc = NCCL_EP_COMBINE_CONFIG_INIT;
    cc.send_only = 1;
    EXPECT_OK(ncclEpDispatch(hA, &kA.in, &kA.out, kA.withInfo ? &kA.info : nullptr, &dA, ctx.stream));
    EXPECT_OK(ncclEpDispatch(hB, &kB.in, &kB.out, kB.withInfo ? &kB.info : nullptr, &dB, ctx.stream));
    refusedCall(label, ncclEpComplete(hB, nullptr, ctx.stream), "completing B's dispatch before A's");
    refusedCall(label, ncclEpDispatch(hC, &kA.in, &kA.out, nullptr, &dA, ctx.stream), "a third open dispatch");
    refusedCall(label, ncclEpDispatch(hC, &kA.in, &kA.out, nullptr, nullptr, ctx.stream),
                "a plain dispatch while two are open");
    EXPECT_OK(ncclEpComplete(hA, nullptr, ctx.stream));
    EXPECT_OK(ncclEpCombine(hA, &kA.cin, &kA.cout, &cc, ctx.stream));
    EXPECT_OK(ncclEpComplete(hB, nullptr, ctx.stream));
    EXPECT_OK(ncclEpCombine(hB, &kB.cin, &kB.cout, &cc, ctx.stream));
    refusedCall(label, ncclEpComplete(hB, nullptr, ctx.stream), "completing B's combine before A's");
    EXPECT_OK(ncclEpComplete(hA, nullptr, ctx.stream));
    EXPECT_OK(ncclEpComplete(hB, nullptr, ctx.stream));
    if (wait(label.c_str())) return 1;
    const Expected xA = expect(c, sh, rA, path, dsA, ctx.rank), xB = expect(c, sh, rB, path, dsB, ctx.rank);
    checkDispatch(label + " A", c, sh, bA, xA, dsA);
    checkCombine(label + " A", sh, bA, xA);
    checkDispatch(label + " B", c, sh, bB, xB, dsB);
    checkCombine(label + " B", sh, bB, xB);
    for (ncclEpHandle_t h : {hA, hB, hC}) EXPECT_OK(ncclEpHandleDestroy(h));
    return 0;
  }

  int setMask(const std::vector<int>& m) {
    const std::string label = "ncclEpMaskUpdate";
    EXPECT_OK(ncclEpMaskUpdate(group, m.data(), ctx.stream));
    return 0;
  }
  // Every rank: active again, then ncclEpMaskClean (after a host barrier, so that no rank is still inside a call
  // that waits for a peer's timeout).
  int cleanAll(const std::string& label) {
    if (wait((label + ": before clean").c_str())) return 1;
    if (ncclext::harness::barrier(ctx, 60) != ncclSuccess) return bad(label, "barrier before clean"), 1;
    if (setMask(std::vector<int>(ctx.nRanks, 1))) return 1;
    EXPECT_OK(ncclEpMaskClean(group, ctx.stream));
    return wait((label + ": clean").c_str());
  }

  // Masks, on a group of its own (enable_mask, the silent-peer budget). (1) Every rank masks rank X = R - 1 (with one
  // rank: itself): nothing goes to or comes from X, combine's missing_experts counts X's experts, the mask reads back.
  // (2+ ranks) (2) Unmasked, X skips a dispatch + combine: the others mask it when its counts do not come and give the
  // reference with X masked, no error. (3) After ncclEpMaskClean, X dispatches but skips the combine: the others'
  // combine masks it and the group reports ncclRemoteError once (unless X's dispatch came after the budget: then the
  // others' dispatch masked X, silently, and the combine has nothing to report). (4) After another clean, everyone: the
  // full reference again. Across domains (2) and (3) are replaced: a rank of another domain that skips a call while
  // active leaves its rail messages unmatched, and the rail's watchdog fails the group (runSilentPeer's test); so there
  // X skips a call while every rank still masks it (the exchanges must skip it both ways), then the clean before (4)
  // meets over the rail and brings X, a call behind, back in step.
  int runMasked(const Case& c, uint64_t caseSeed) {
    const int R = ctx.nRanks, X = R - 1, me = ctx.rank;
    const Shape sh = shapeOf(c, R);
    const Combine path = paths(c)[0];
    ncclEpGroup_t mainGroup = group;
    ncclEpGroupConfig_t cfg = groupConfig(c.maxTokens, c.expertsPerRank, c.hidden);
    cfg.enable_mask = 1;
    cfg.timeout_ns = (uint64_t)(gSilentPeerSeconds * 1e9);
    group = nullptr;
    if (ncclext::harness::createEpGroup(&group, ctx.comm, &cfg) != ncclSuccess) {
      fprintf(stderr, "rank %d: ncclEpCreateGroup (enable_mask): %s\n", ctx.rank, ncclEpGetLastError());
      group = mainGroup;
      return 1;
    }
    const int rc = maskedRounds(c, sh, path, caseSeed, X, me);
    if (closeGroup()) return 1;
    group = mainGroup;
    return rc;
  }

  int maskedRounds(const Case& c, const Shape& sh, Combine path, uint64_t caseSeed, int X, int me) {
    const int R = ctx.nRanks;
    std::string label = c.name + " (1) rank " + std::to_string(X) + " masked by all";
    Buffers b(sh);
    ncclEpHandle_t h = nullptr;
    Routing r = makeRouting(c, R, caseSeed);
    r.active.assign(R, 1);
    r.active[X] = 0;
    if (bind(label, c, sh, b, r, &h)) return 1;
    std::vector<int> m(R, 1);
    m[X] = 0;
    if (setMask(m) || round(label, c, sh, b, r, path, caseSeed * 16, h)) return 1;
    DeviceBuf q((size_t)R * 4);
    EXPECT_OK(ncclEpMaskQuery(group, static_cast<int*>(q.p), ctx.stream));
    if (q.get<int>(R) != m) bad(label, "ncclEpMaskQuery differs from the mask set");
    if (R >= 2 && acrossDomains) {
      // X, still masked by every rank, skips a call as a dead rank would: the others' exchanges have no message for
      // it, so nothing waits for it (without that skip their rail would stall and its watchdog fail the group).
      label = c.name + " (2) rank " + std::to_string(X) + ", masked by all, skips a call";
      if (me != X && round(label, c, sh, b, r, path, caseSeed * 16 + 1, h)) return 1;
      if (cleanAll(label)) return 1;
    } else if (R >= 2) {
      label = c.name + " (2) rank " + std::to_string(X) + " skips a call";
      if (setMask(std::vector<int>(R, 1))) return 1;
      if (me != X && round(label, c, sh, b, r, path, caseSeed * 16 + 1, h)) return 1;  // wait(): no error
      EXPECT_OK(ncclEpMaskQuery(group, static_cast<int*>(q.p), ctx.stream));
      if (me != X && q.get<int>(R) != m) bad(label, "the silent rank is not masked after the call");
      if (cleanAll(label)) return 1;
      label = c.name + " (3) rank " + std::to_string(X) + " skips a combine";
      const int T = r.numTokens[me];
      fillInputs(c, sh, b, T, caseSeed * 16 + 2);
      const Call k = describe(c, sh, b, T, path);
      EXPECT_OK(ncclEpDispatch(h, &k.in, &k.out, k.withInfo ? &k.info : nullptr, &k.config, ctx.stream));
      // The others wait for X's rows only if one of their tokens has an expert there.
      bool routesToX = false;
      for (int i = 0; i < T * sh.K; i++) routesToX |= r.topkIdx[me][i] >= 0 && r.owner(r.topkIdx[me][i]) == X;
      if (me != X) {
        // X dispatches, but a dispatch of X's that comes later than the budget (a slow or stalled rank: the sanitizer
        // holds virtual ranks' kernels back) has X masked there, as the contract says: silently if its counts did not
        // come (the combine then counts on nothing of X's and has nothing to report), with the report if its rows did
        // not. The mask after the dispatch tells which case this is.
        EXPECT_OK(ncclEpMaskQuery(group, static_cast<int*>(q.p), ctx.stream));
        const bool lateX = q.get<int>(R)[X] == 0;
        EXPECT_OK(ncclEpCombine(h, &k.cin, &k.cout, nullptr, ctx.stream));
        if (!drained(label.c_str())) return bad(label, "the stream did not drain"), 1;
        const ncclResult_t first = ncclEpGroupGetAsyncError(group);
        const std::string msg = ncclEpGetLastError();
        const ncclResult_t second = ncclEpGroupGetAsyncError(group);
        printf("rank %d: LL combine whose peer %d stops mid-call%s -> %s: %s\n", me, X,
               lateX ? " (masked at its late dispatch)" : "", ncclGetErrorString(first), msg.c_str());
        const bool namesX = first == ncclRemoteError && msg.find("peer " + std::to_string(X)) != std::string::npos;
        if (routesToX && !lateX && !namesX) bad(label, "no ncclRemoteError naming the masked peer", first);
        if (lateX && first != ncclSuccess && !namesX) bad(label, "an error that does not name the late rank", first);
        if (!routesToX && !lateX && first != ncclSuccess)
          bad(label, "an error though no token waits for the silent rank", first);
        if (second != ncclSuccess) bad(label, "the masked-peer report is not cleared once returned", second);
      }
      if (cleanAll(label)) return 1;
    }
    if (R >= 2) {
      label = c.name + " (4) everyone again";
      r.active.clear();
      if (bind(label, c, sh, b, r, &h) || round(label, c, sh, b, r, path, caseSeed * 16 + 3, h)) return 1;
    }
    EXPECT_OK(ncclEpHandleDestroy(h));
    return 0;
  }
};

// (2+ ranks) The timeout path, on a group of its own with a short budget: the last rank skips a dispatch. Every
// other rank's dispatch waits for its counts, gives up after the budget, and the group reports ncclRemoteError
// naming the timeout and the silent peer; the next call reports the same at once. No call may hang. Across domains
// the rail exchange waits first: its watchdog aborts it after the budget (then the receive half's waits time out
// too), and the group reports the rail's abort.
// The group of its own that runSilentPeer and runStraggler make: 2 experts a rank, kM tokens of kH bf16 columns, a
// top-kK routing that sends every rank's tokens to every rank, and a RANK_MAJOR handle bound to it.
struct PeerGroup {
  static constexpr int kM = 16, kK = 2, kH = 256;
  ncclEpGroup_t g = nullptr;
  ncclEpHandle_t h = nullptr;
  DeviceBuf topk{(size_t)kM * kK * 4};  // the routing, alive as long as the handle
  // 0, or 1 after a failure (said on stderr). timeoutNs: the group's budget (0: base's).
  int open(ncclext::harness::RankContext& ctx, const ncclEpGroupConfig_t& base, uint64_t timeoutNs,
           const std::string& label) {
    ncclEpGroupConfig_t cfg = base;
    cfg.num_experts = 2 * ctx.nRanks;
    cfg.max_tokens_per_rank = kM;
    cfg.max_token_bytes = kH * 2;
    if (timeoutNs) cfg.timeout_ns = timeoutNs;
    EXPECT_OK(ncclext::harness::createEpGroup(&g, ctx.comm, &cfg));
    std::vector<int> idx(kM * kK);
    for (int t = 0; t < kM; t++)
      for (int k = 0; k < kK; k++) idx[t * kK + k] = (t * kK + k) % cfg.num_experts;  // every rank receives
    topk.put(idx.data(), idx.size() * 4);
    const ncclEpTensor_t ti = epTensor(topk.p, ncclInt32, {kM, kK});
    EXPECT_OK(ncclEpCreateHandle(&h, g, NCCL_EP_LAYOUT_RANK_MAJOR, &ti, nullptr, nullptr, ctx.stream));
    return 0;
  }
  // Destroys both; false (said on stderr) when the group would not go.
  bool close(int rank, const std::string& label) {
    ncclEpHandleDestroy(h);
    if (ncclEpGroupDestroy(g) == ncclSuccess) return true;
    fprintf(stderr, "rank %d: ncclEpGroupDestroy (%s): %s\n", rank, label.c_str(), ncclEpGetLastError());
    return false;
  }
};

int runSilentPeer(ncclext::harness::RankContext& ctx, const ncclEpGroupConfig_t& base, double* waited, bool* ok) {
  const std::string label = "silent peer";
  const int R = ctx.nRanks, M = PeerGroup::kM, H = PeerGroup::kH, silentRank = R - 1;
  const double budget = gSilentPeerSeconds;
  PeerGroup pg;
  if (pg.open(ctx, base, (uint64_t)(budget * 1e9), label)) return 1;
  ncclEpGroup_t g = pg.g;
  ncclEpHandle_t h = pg.h;
  DeviceBuf x((size_t)M * H * 2), y((size_t)R * M * H * 2);
  cudaOk(cudaMemsetAsync(x.p, 0, x.bytes, tStream), "zero x");  // dispatch reads them: set (any values)
  const ncclext::harness::GroupShape shape = ncclext::harness::groupShape(g);  // what the verdict allows
  *ok = true;
  if (ctx.rank != silentRank) {
    ncclEpDispatchInputs_t in = NCCL_EP_DISPATCH_INPUTS_INIT;
    in.tokens = epTensor(x.p, ncclBfloat16, {M, H});
    ncclEpDispatchOutputs_t out = NCCL_EP_DISPATCH_OUTPUTS_INIT;
    out.tokens = epTensor(y.p, ncclBfloat16, {R * M, H});
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_OK(ncclEpDispatch(h, &in, &out, nullptr, nullptr, ctx.stream));
    const ncclResult_t drainedRes = ncclext::waitStream(ctx.stream, budget + 30, "timeout dispatch");
    *waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const ncclResult_t res = ncclEpGroupGetAsyncError(g);
    const std::string msg = ncclEpGetLastError();
    *ok = drainedRes == ncclSuccess &&
          ncclext::harness::silentPeerVerdict(ctx.nRanks, shape, silentRank, res, msg, *waited, budget);
    printf("rank %d: LL dispatch with a silent peer -> %s after %.2f s: %s\n", ctx.rank, ncclGetErrorString(res),
           *waited, msg.c_str());
    // Later calls report the same error instead of hanging.
    *ok &= ncclEpDispatch(h, &in, &out, nullptr, nullptr, ctx.stream) == ncclRemoteError;
  }
  *ok &= pg.close(ctx.rank, label);
  return 0;
}

// recv_wait_cycles (DeepEP's *_wait_recv_cost_stats) on a group of its own: every rank receives from every rank; the
// last rank sleeps kStragglerMs on the host before its dispatch and again before its combine. Each rank's two
// [R] int64 tensors start at kWaitBase and are added to: every entry must stay in [kWaitBase, kWaitBase + 2^40).
// Inside one NVLink domain the others' receive halves spin on the straggler's flags: its entry must exceed
// kStragglerCycles (5 ms at 2 GHz, for a 200 ms sleep). Across domains the rail exchange (NCCL) waits for it before
// the receive half starts, so only the range is checked there. *cycles: the smallest straggler entry seen.
constexpr int kStragglerMs = 200;
constexpr int64_t kWaitBase = (int64_t)1 << 40, kStragglerCycles = 10000000;
int runStraggler(ncclext::harness::RankContext& ctx, const ncclEpGroupConfig_t& base, bool acrossDomains,
                 int64_t* cycles, bool* ok) {
  const std::string label = "straggler";
  const int R = ctx.nRanks, M = PeerGroup::kM, H = PeerGroup::kH, late = R - 1;
  PeerGroup pg;
  if (pg.open(ctx, base, 0, label)) return 1;
  ncclEpHandle_t h = pg.h;
  DeviceBuf x((size_t)M * H * 2), y((size_t)R * M * H * 2), z((size_t)M * H * 2);
  DeviceBuf waits(2 * R * sizeof(int64_t));
  const std::vector<int64_t> start(2 * R, kWaitBase);
  waits.put(start.data(), start.size() * sizeof(int64_t));
  cudaOk(cudaMemsetAsync(x.p, 0, x.bytes, tStream), "zero x");
  auto lateStart = [&](const char* what) {  // every rank here, then the straggler sleeps
    if (ncclext::harness::barrier(ctx, 60) != ncclSuccess) {
      fprintf(stderr, "rank %d: barrier before the straggler's %s: %s\n", ctx.rank, what, ncclext::lastError());
      *ok = false;
    }
    if (ctx.rank == late) std::this_thread::sleep_for(std::chrono::milliseconds(kStragglerMs));
  };
  int64_t* dispatchWaits = static_cast<int64_t*>(waits.p);
  ncclEpDispatchInputs_t in = NCCL_EP_DISPATCH_INPUTS_INIT;
  in.tokens = epTensor(x.p, ncclBfloat16, {M, H});
  ncclEpDispatchOutputs_t out = NCCL_EP_DISPATCH_OUTPUTS_INIT;
  out.tokens = epTensor(y.p, ncclBfloat16, {R * M, H});
  out.recv_wait_cycles = epTensor(dispatchWaits, ncclInt64, {R});
  lateStart("dispatch");
  EXPECT_OK(ncclEpDispatch(h, &in, &out, nullptr, nullptr, ctx.stream));
  *ok &= drained("straggler dispatch");
  ncclEpCombineInputs_t ci = NCCL_EP_COMBINE_INPUTS_INIT;
  ci.tokens = epTensor(y.p, ncclBfloat16, {R * M, H});
  ncclEpCombineOutputs_t co = NCCL_EP_COMBINE_OUTPUTS_INIT;
  co.tokens = epTensor(z.p, ncclBfloat16, {M, H});
  co.recv_wait_cycles = epTensor(dispatchWaits + R, ncclInt64, {R});
  lateStart("combine");
  EXPECT_OK(ncclEpCombine(h, &ci, &co, nullptr, ctx.stream));
  *ok &= drained("straggler combine");
  const std::vector<int64_t> got = waits.get<int64_t>(2 * R);
  *cycles = INT64_MAX;
  for (int i = 0; i < 2 * R; i++) {
    const char* call = i < R ? "dispatch" : "combine";
    const int s = i % R;
    if (got[i] < kWaitBase || got[i] - kWaitBase >= ((int64_t)1 << 40)) {
      fprintf(stderr, "rank %d: %s recv_wait_cycles[%d] = base + %lld: not added to the start value\n", ctx.rank,
              call, s, (long long)(got[i] - kWaitBase));
      *ok = false;
    }
    if (s != late || ctx.rank == late) continue;
    *cycles = std::min(*cycles, got[i] - kWaitBase);
    if (!acrossDomains && got[i] - kWaitBase < kStragglerCycles) {
      fprintf(stderr, "rank %d: %s waited %lld cycles for rank %d, which started %d ms late\n", ctx.rank, call,
              (long long)(got[i] - kWaitBase), s, kStragglerMs);
      *ok = false;
    }
  }
  printf("rank %d: straggler (rank %d, %d ms late): %s\n", ctx.rank, late, kStragglerMs, *ok ? "ok" : "FAILED");
  *ok &= pg.close(ctx.rank, label);
  return 0;
}

// Holds one SM for `ns`: its dynamic shared memory (the most a CTA may have) leaves room for no other CTA there.
// Raises *started (host-mapped) once it runs.
__global__ void __launch_bounds__(1024) holdSmKernel(volatile int* started, unsigned long long ns) {
  extern __shared__ int4 held[];
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  if (threadIdx.x == 0) {
    held[0] = make_int4(0, 0, 0, 0);
    *started = 1;
    __threadfence_system();
  }
  do {
    __nanosleep(1000);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < ns);
}

// (1 rank, real GPU) Every SM beside a kernel on another stream that holds one SM for three times the group's
// budget: the Low-Latency calls (above kSharedSms: cooperative, nccl_ep/src/ll/calls.cc) start whole, once that SM
// is free, and succeed. A plain launch starts without the held SM's CTA and, at one rank, finishes anyway (a CTA waits
// only on lower ones there): a call that returns sooner than the hold fails the test, as the grid did not wait.
int runBesideHeldSm(ncclext::harness::RankContext& ctx, const ncclEpGroupConfig_t& base, double* waited, bool* ok) {
  const std::string label = "held SM";
  const int M = 16, K = 2, H = 2048, L = 8;
  const double budget = 1.0, hold = 3.0;
  ncclEpGroupConfig_t cfg = base;
  cfg.num_experts = L;
  cfg.max_tokens_per_rank = M;
  cfg.max_token_bytes = H * 2;
  cfg.num_sms = 1 << 20;  // every SM
  cfg.timeout_ns = (uint64_t)(budget * 1e9);
  *ok = false;
  int dev = 0, smem = 0;
  volatile int* started = nullptr;
  int* startedDev = nullptr;
  cudaStream_t side = nullptr;
  // Frees the side stream and the flag on every return, the early ones of EXPECT_OK included.
  struct SideGuard {
    cudaStream_t* side;
    volatile int** started;
    ~SideGuard() {
      if (*side) cudaOk(cudaStreamDestroy(*side), "side stream destroy");
      if (*started) cudaOk(cudaFreeHost((void*)*started), "cudaFreeHost");
    }
  } guard{&side, &started};
  if (!cudaOk(cudaGetDevice(&dev), "cudaGetDevice") ||
      !cudaOk(cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev), "smem attribute") ||
      !cudaOk(cudaFuncSetAttribute(holdSmKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem), "smem") ||
      !cudaOk(cudaHostAlloc((void**)&started, sizeof(int), cudaHostAllocMapped), "cudaHostAlloc") ||
      !cudaOk(cudaHostGetDevicePointer((void**)&startedDev, (void*)started, 0), "device pointer") ||
      !cudaOk(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking), "side stream"))
    return 1;
  *started = 0;
  ncclEpGroup_t g = nullptr;
  EXPECT_OK(ncclext::harness::createEpGroup(&g, ctx.comm, &cfg));
  std::vector<int> idx(M * K);
  for (int t = 0; t < M; t++)
    for (int k = 0; k < K; k++) idx[t * K + k] = (t * K + k) % L;
  DeviceBuf topk(idx.size() * 4), x((size_t)M * H * 2), y((size_t)M * H * 2), out((size_t)M * H * 2);
  topk.put(idx.data(), idx.size() * 4);
  x.poison();
  const ncclEpTensor_t ti = epTensor(topk.p, ncclInt32, {M, K});
  ncclEpHandle_t h = nullptr;
  EXPECT_OK(ncclEpCreateHandle(&h, g, NCCL_EP_LAYOUT_RANK_MAJOR, &ti, nullptr, nullptr, ctx.stream));
  if (!drained("before the held SM")) return 1;
  holdSmKernel<<<1, 1024, smem, side>>>(startedDev, (unsigned long long)(hold * 1e9));
  cudaOk(cudaGetLastError(), "holdSmKernel launch");
  const auto t0 = std::chrono::steady_clock::now();
  while (!*started && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10)) {
  }
  ncclEpDispatchInputs_t in = NCCL_EP_DISPATCH_INPUTS_INIT;
  in.tokens = epTensor(x.p, ncclBfloat16, {M, H});
  ncclEpDispatchOutputs_t dout = NCCL_EP_DISPATCH_OUTPUTS_INIT;
  dout.tokens = epTensor(y.p, ncclBfloat16, {M, H});
  ncclEpCombineInputs_t cin = NCCL_EP_COMBINE_INPUTS_INIT;
  cin.tokens = dout.tokens;
  ncclEpCombineOutputs_t cout = NCCL_EP_COMBINE_OUTPUTS_INIT;
  cout.tokens = epTensor(out.p, ncclBfloat16, {M, H});
  const auto t1 = std::chrono::steady_clock::now();
  EXPECT_OK(ncclEpDispatch(h, &in, &dout, nullptr, nullptr, ctx.stream));
  EXPECT_OK(ncclEpCombine(h, &cin, &cout, nullptr, ctx.stream));
  const ncclResult_t drainedRes = ncclext::waitStream(ctx.stream, hold + budget + 30, "beside a held SM");
  *waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  const ncclResult_t res = ncclEpGroupGetAsyncError(g);
  *ok = *started && drainedRes == ncclSuccess && res == ncclSuccess && *waited > 0.9 * hold;
  printf("rank %d: LL dispatch + combine on every SM beside a kernel holding one SM for %.1f s (budget %.1f s): "
         "%s after %.2f s%s\n",
         ctx.rank, hold, budget, ncclGetErrorString(res), *waited,
         res != ncclSuccess           ? ncclEpGetLastError()
         : *waited > 0.9 * hold       ? ""
                                      : " (sooner than the hold: it did not wait)");
  cudaOk(ncclext::waitStream(side, hold + 30, "the held SM") == ncclSuccess ? cudaSuccess : cudaErrorUnknown,
         "the held SM's stream");
  ncclEpHandleDestroy(h);
  if (ncclEpGroupDestroy(g) != ncclSuccess) {
    fprintf(stderr, "rank %d: ncclEpGroupDestroy (held SM): %s\n", ctx.rank, ncclEpGetLastError());
    *ok = false;
  }
  return 0;
}

// The cases, the same for every rank count (E scales with R).
std::vector<Case> buildCases() {
  std::vector<Case> cases;
  auto make = [](const std::string& what, ncclEpLayout_t layout, int M, int L, int K, int H) {
    Case c;
    const bool rm = layout == NCCL_EP_LAYOUT_RANK_MAJOR;
    c.name = (rm ? "rm/" : "em/") + what;
    c.layout = layout;
    c.combine = rm ? kByRank : kBothPaths;
    c.maxTokens = M;
    c.expertsPerRank = L;
    c.topk = K;
    c.hidden = H;
    return c;
  };
  const ncclEpLayout_t layouts[] = {NCCL_EP_LAYOUT_RANK_MAJOR, NCCL_EP_LAYOUT_EXPERT_MAJOR};
  struct Size {
    int M, L, K, H;
  } const sizes[] = {{1, 1, 1, 128},    {7, 4, 2, 256},   {64, 8, 6, 512}, {128, 4, 8, 1024},
                     {256, 1, 2, 2048}, {256, 8, 8, 512}, {64, 4, 6, 7168}};
  for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
    const Size z = sizes[i];
    const std::string size = "M=" + std::to_string(z.M) + " E=" + std::to_string(z.L) + "R K=" + std::to_string(z.K) +
                             " H=" + std::to_string(z.H);
    for (ncclEpLayout_t layout : layouts) {
      Case c = make("random " + size, layout, z.M, z.L, z.K, z.H);
      c.idx64 = i % 2 == 1;
      c.quick = z.M == 7;
      cases.push_back(c);
    }
    if (z.M != 128) continue;
    // Everything else on this group (M 128, E 4R), H 1024 unless said.
    for (ncclEpLayout_t layout : layouts) {
      const bool em = layout == NCCL_EP_LAYOUT_EXPERT_MAJOR;
      Case c = make("skew: every token to one expert", layout, z.M, z.L, 4, z.H);
      c.routing = kOneExpert;
      cases.push_back(c);
      c = make("one rank receives nothing", layout, z.M, z.L, 8, z.H);
      c.routing = kOneRankEmpty;
      cases.push_back(c);
      c = make("ranks of 0 and 1 tokens, H=256", layout, z.M, z.L, 8, 256);
      c.routing = kTinyRanks;
      c.quick = true;
      cases.push_back(c);
      c = make("mostly -1 slots", layout, z.M, z.L, 8, z.H);
      c.routing = kSparse;
      c.idx64 = true;
      cases.push_back(c);
      c = make("no dispatch weights", layout, z.M, z.L, 6, z.H);
      c.dispatchWeights = false;
      cases.push_back(c);
      c = make("required outputs only", layout, z.M, z.L, 8, z.H);
      c.bare = true;
      cases.push_back(c);
      c = make("fp8 quantised", layout, z.M, z.L, 8, z.H);
      c.tokens = kFp8Quantised;
      cases.push_back(c);
      // The other token formats, each in the quick runs of one layout.
      const struct {
        const char* name;
        Tokens tokens;
        bool quickInEm;  // in the quick runs of EXPERT_MAJOR (else of RANK_MAJOR)
      } formats[] = {{"fp8 quantised, round_scale", kFp8Pow2Scales, true},
                     {"fp8 forwarded", kFp8Forwarded, false},
                     {"fp8 quantised, UE8M0 scales", kFp8Ue8m0, false},
                     {"fp8 forwarded, UE8M0 scales", kFp8ForwardedUe8m0, true},
                     {"fp8 forwarded, a scale per token", kFp8ForwardedPerToken, false},
                     {"fp8 forwarded, three int32 scale words a token", kFp8ForwardedWords, true},
                     {"NVFP4 quantised", kFp4Quantised, true},
                     {"NVFP4 forwarded", kFp4Forwarded, false}};
      for (const auto& f : formats) {
        c = make(f.name, layout, z.M, z.L, 8, z.H);
        c.tokens = f.tokens;
        c.quick = f.quickInEm == em;
        cases.push_back(c);
      }
      c = make("ncclEpUpdateHandle", layout, z.M, z.L, 8, z.H);
      c.update = true;
      c.quick = true;
      cases.push_back(c);
      c = make("send-only + ncclEpComplete", layout, z.M, z.L, 8, z.H);
      c.sendOnly = true;
      c.quick = true;
      cases.push_back(c);
    }
    for (Combine path : {kByRank, kWeightsAtDispatch, kWeightsAtCombine}) {
      Case c = make(std::string("graph replay, ") + Runner::pathName(path),
                    path == kByRank ? NCCL_EP_LAYOUT_RANK_MAJOR : NCCL_EP_LAYOUT_EXPERT_MAJOR, z.M, z.L, 8, z.H);
      c.kind = kGraph;
      c.combine = path;
      c.quick = true;
      cases.push_back(c);
    }
    Case gs = make("graph replay, send-only + ncclEpComplete", NCCL_EP_LAYOUT_EXPERT_MAJOR, z.M, z.L, 8, z.H);
    gs.kind = kGraph;
    gs.combine = kWeightsAtCombine;
    gs.sendOnly = true;
    cases.push_back(gs);
    for (ncclEpLayout_t layout : layouts) {
      Case d = make("double-buffered send-only calls of two handles", layout, z.M, z.L, 8, z.H);
      d.kind = kDoubleBuffered;
      d.quick = true;
      cases.push_back(d);
      Case m = make("masks", layout, z.M, z.L, 8, z.H);
      m.kind = kMasked;
      m.masked = true;
      m.combine = layout == NCCL_EP_LAYOUT_RANK_MAJOR ? kByRank : kWeightsAtCombine;
      m.quick = true;
      cases.push_back(m);
    }
    Case v = make("argument validation", NCCL_EP_LAYOUT_RANK_MAJOR, z.M, z.L, 2, 128);
    v.kind = kValidation;
    v.quick = true;
    cases.push_back(v);
  }
  return cases;
}

// --soak CALLS: the soak alone, on the first plain bf16 RANK_MAJOR case (random routing), then one verdict over the
// ranks: every check right, no error, and the memory flat (ncclext::harness::SoakNumbers::flat on every rank).
int soakMain(ncclext::harness::RankContext& ctx, Runner& run, const std::vector<Case>& cases, uint64_t seed,
             const std::string& json) {
  const Case* soak = nullptr;
  for (const Case& c : cases)
    if (!soak && c.kind == kDispatchCombine && c.layout == NCCL_EP_LAYOUT_RANK_MAJOR && c.tokens == kBf16 &&
        c.routing == kRandom && !c.update && !c.sendOnly && !c.bare && !c.masked)
      soak = &c;
  if (!soak) {
    fprintf(stderr, "rank %d: no case for the soak\n", ctx.rank);
    return 1;
  }
  ncclext::harness::SoakNumbers n;
  const int rc = run.runSoak(*soak, seed, gSoak, &n);
  const bool pass =
      ncclext::harness::reportSoak(ctx, "ep_ll_soak", soak->name, n, ncclext::harness::kSoakHandleEvery, 0,
                                   ncclext::harness::kSoakCheckEvery, run.errors + rc + tCudaErrors, seed, json);
  return pass ? 0 : 1;
}

bool parse(int argc, char** argv, int* nRanks, uint64_t* seed, std::string* json, ncclext::harness::OneGpu* oneGpu,
           bool* quick) {
  ncclext::harness::Cli cli(argv[0]);
  cli.option("nranks", nRanks);
  cli.oneGpu(oneGpu, /*mixedToo=*/true);
  cli.option("seed", seed);
  cli.option("timeout-s", &gTimeoutSeconds);
  cli.option("silent-peer-s", &gSilentPeerSeconds);
  cli.option("sms", &gSms);
  cli.flag("quick", quick);
  cli.flag("graph-only", &gGraphOnly);
  cli.flag("back-to-back", &gBackToBack);
  cli.option("soak", &gSoak);
  cli.option("json", json);
  return cli.parse(argc, argv) &&
         cli.require(gTimeoutSeconds > 0 && gSilentPeerSeconds > 0, "--timeout-s and --silent-peer-s must be > 0") &&
         cli.require(gSoak >= 0, "--soak must be >= 0");
}

}  // namespace

int main(int argc, char** argv) {
  int nRanks = 0;
  uint64_t seed = (uint64_t)std::chrono::system_clock::now().time_since_epoch().count();  // fresh every run
  std::string json;
  ncclext::harness::OneGpu oneGpu = ncclext::harness::OneGpu::kOff;
  bool quick = false;
  if (!parse(argc, argv, &nRanks, &seed, &json, &oneGpu, &quick)) return 2;
  printf("ep_ll_test: seed %llu\n", (unsigned long long)seed);
  fflush(stdout);
  ncclext::harness::LaunchOptions lo;
  lo.nRanks = nRanks;
  lo.oneGpu = oneGpu;
  ncclEpVirtualDomain_t virt = nullptr;
  if (!ncclext::harness::makeVirtualDomain(lo, &virt)) return 1;
  const bool mixed = oneGpu == ncclext::harness::OneGpu::kMixed;
  const int rc = ncclext::harness::launch(lo, [&](ncclext::harness::RankContext& ctx) {
    tStream = ctx.stream;
    ncclEpGroupConfig_t base = NCCL_EP_GROUP_CONFIG_INIT;
    base.algorithm = NCCL_EP_ALGO_LOW_LATENCY;
    base.max_topk = kMaxTopk;
    base.num_sms = gSms;
    base.timeout_ns = (uint64_t)(gTimeoutSeconds * 1e9);
    ncclext::harness::setEpTesting(virt, ctx.localRank, ctx.rail);  // mixed: the rail of my index (relayed)
    std::vector<Case> cases = buildCases();
    if (quick || gGraphOnly) {
      std::vector<Case> few;
      for (const Case& c : cases)
        if ((!quick || c.quick) && (!gGraphOnly || c.kind == kGraph)) few.push_back(c);
      cases.swap(few);
    }
    Runner run{ctx, base};
    // Several NVLink domains (one-GPU nodes: every rank a domain of its own, every row over the rail exchange's
    // ncclSend / ncclRecv over loopback sockets; the mixed mode; real GPUs split by NCCL_EXT_LSA_DOMAIN_SIZE: asked
    // of a probe group). Fewer graph replays there (each moves every outbox over the sockets), and masks not in the
    // mixed mode (a relay does not mask: refused at group creation) and with runMasked's steps across domains.
    bool acrossDomains = (ctx.mode == ncclext::harness::OneGpu::kNodes && ctx.nRanks > 1) ||
                         (mixed && ctx.nRanks > lo.domainSize);
    if (ctx.mode == ncclext::harness::OneGpu::kOff && ctx.nRanks > 1) {
      ncclEpGroupConfig_t probe = base;
      probe.num_experts = ctx.nRanks;
      probe.max_tokens_per_rank = 1;
      probe.max_token_bytes = 512;
      ncclEpGroup_t g = nullptr;
      if (ncclext::harness::createEpGroup(&g, ctx.comm, &probe) != ncclSuccess) {
        fprintf(stderr, "rank %d: ncclEpCreateGroup (probe): %s\n", ctx.rank, ncclEpGetLastError());
        return 1;
      }
      acrossDomains = ncclext::harness::groupShape(g).nDomains > 1;
      if (ncclEpGroupDestroy(g) != ncclSuccess) return 1;
    }
    run.acrossDomains = acrossDomains;
    if (gSoak > 0) return soakMain(ctx, run, cases, seed, json);
    if (acrossDomains && mixed) {
      std::vector<Case> kept;
      for (const Case& c : cases)
        if (c.kind != kMasked) kept.push_back(c);
      cases.swap(kept);
    }
    const int replays = quick ? 5 : acrossDomains ? 20 : kReplays;
    int failedCases = 0, rc = 0;
    for (size_t i = 0; i < cases.size() && !rc; i++) {
      const Case& c = cases[i];
      if (!run.group || run.groupM != c.maxTokens || run.groupL != c.expertsPerRank) {
        // A group per run of cases with the same M and E, its rows as wide as the run's widest.
        int maxHidden = 0;
        for (size_t j = i;
             j < cases.size() && cases[j].maxTokens == c.maxTokens && cases[j].expertsPerRank == c.expertsPerRank; j++)
          maxHidden = std::max(maxHidden, cases[j].hidden);
        if (run.closeGroup() || run.openGroup(c.maxTokens, c.expertsPerRank, maxHidden)) {
          rc = 1;
          break;
        }
      }
      const int before = run.errors;
      switch (c.kind) {
        case kGraph:
          // Mixed: every replay checked, so waited for before the next is launched. Replays launched back to back
          // (as the other modes run them) hung there at the last one in the session-11 run (every rank waiting for
          // a peer's flag one or two calls behind): replays have no launch fences, and the relay puts a kernel that
          // spins on the domain's ranks on either side of the rail exchange, where virtual ranks' streams may share
          // a hardware queue (docs/ARCHITECTURE.md); a flaw of the relay's protocol under skew is not ruled out.
          rc |= run.runGraph(c, seed * 100 + i, replays, quick || (mixed && !gBackToBack) ? 1 : kCheckEvery);
          break;
        case kValidation:
          rc |= run.runValidation(c);
          break;
        case kDispatchCombine:
          rc |= run.runCase(c, seed * 100 + i);
          break;
        case kDoubleBuffered:
          rc |= run.runDoubleBuffered(c, seed * 100 + i);
          break;
        case kMasked:
          rc |= run.runMasked(c, seed * 100 + i);
          break;
      }
      if (run.errors != before || rc) failedCases++;
    }
    rc |= run.closeGroup();
    // Agree on the outcome before the timeout test breaks a group's sequence. A failed agreement fails the run.
    uint64_t total = 0;
    const int mine = run.errors + rc + tCudaErrors;
    if (ncclext::harness::sumOverRanks(ctx, (uint64_t)mine, &total, 60) != ncclSuccess) {
      fprintf(stderr, "rank %d: the ranks could not agree on the outcome: %s\n", ctx.rank, ncclext::lastError());
      total = 1 + mine;
    }
    bool stragglerOk = true;
    int64_t stragglerCycles = 0;
    if (ctx.nRanks > 1 && !gGraphOnly && runStraggler(ctx, base, acrossDomains, &stragglerCycles, &stragglerOk))
      stragglerOk = false;
    bool timeoutOk = true;
    double waited = 0;
    if (ctx.nRanks > 1 && !gGraphOnly && runSilentPeer(ctx, base, &waited, &timeoutOk)) timeoutOk = false;
    // A real GPU alone (not the sanitizers' --quick runs: the held SM's spin would outlast their slow kernels' budget).
    const bool heldSmTested = ctx.nRanks == 1 && ctx.mode == ncclext::harness::OneGpu::kOff && !quick && !gGraphOnly;
    bool heldSmOk = true;
    double heldSmWaited = 0;
    if (heldSmTested && runBesideHeldSm(ctx, base, &heldSmWaited, &heldSmOk)) heldSmOk = false;
    const bool pass = total == 0 && stragglerOk && timeoutOk && heldSmOk && tCudaErrors == 0;
    printf(
        "rank %d: %zu cases (%d failed), %d graph replays, %d argument checks, straggler %s, timeout %s, held SM %s, "
        "%s, CUDA errors in the test %d -> %s (seed %llu)\n",
        ctx.rank, cases.size(), failedCases, replays, run.validationChecks,
        ctx.nRanks > 1 ? (stragglerOk ? "ok" : "FAILED") : "n/a (1 rank)",
        ctx.nRanks > 1 ? (timeoutOk ? "ok" : "FAILED") : "n/a (1 rank)",
        heldSmTested ? (heldSmOk ? "ok" : "FAILED") : "n/a", ncclext::harness::oneGpuName(ctx.mode), tCudaErrors,
        pass ? "PASS" : "FAIL", (unsigned long long)seed);
    if (ctx.rank == 0) {
      char line[512];
      snprintf(line, sizeof(line),
               "{\"test\": \"ep_ll\", \"nranks\": %d, \"mode\": \"%s\", \"pass\": %s, \"cases\": %zu, "
               "\"graph_replays\": %d, \"argument_checks\": %d, \"timeout_tested\": %s, \"timeout_waited_s\": %.3f, "
               "\"held_sm_tested\": %s, \"held_sm_waited_s\": %.3f, \"num_sms\": %d, \"across_domains\": %s, "
               "\"straggler_wait_cycles\": %lld, \"seed\": %llu}",
               ctx.nRanks, ncclext::harness::oneGpuName(ctx.mode), pass ? "true" : "false", cases.size(), replays,
               run.validationChecks, ctx.nRanks > 1 ? "true" : "false", waited, heldSmTested ? "true" : "false",
               heldSmWaited, gSms, acrossDomains ? "true" : "false", (long long)stragglerCycles,
               (unsigned long long)seed);
      ncclext::harness::writeJsonLine(json, line);
    }
    return pass ? 0 : 1;
  });
  if (virt) ncclEpVirtualDomainDestroy(virt);
  return rc;
}
