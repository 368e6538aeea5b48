// The only file that touches nccl_ep.h's public structs: validate, translate, call, record the last error.
#include "nccl_ep/include/nccl_ep.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <deque>
#include <initializer_list>
#include <memory>

#include "common/checks.h"
#include "common/env.h"
#include "common/topology.h"
#include "common/version.h"
#include "nccl_ep/src/group.h"
#include "nccl_ep/src/handle.h"
#include "nccl_ep/src/ht/ht.h"
#include "nccl_ep/src/ll/ll.h"

namespace ncclep {

// Never destroyed, so that a call made during the process's exit still finds them.
ncclext::LiveSet& liveGroups() {
  static ncclext::LiveSet* set = new ncclext::LiveSet;
  return *set;
}
ncclext::LiveSet& liveHandles() {
  static ncclext::LiveSet* set = new ncclext::LiveSet;
  return *set;
}

}  // namespace ncclep

namespace {

size_t dtypeBytes(ncclDataType_t t) {
  switch (t) {
    case ncclInt8: case ncclUint8: case ncclFloat8e4m3: case ncclFloat8e5m2: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: return 0;
  }
}

const char* dtypeName(ncclDataType_t t) {
  switch (t) {
    case ncclBfloat16: return "bf16";
    case ncclFloat16: return "fp16";
    case ncclFloat32: return "fp32";
    case ncclFloat8e4m3: return "fp8_e4m3";
    case ncclInt32: return "int32";
    case ncclInt64: return "int64";
    default: return "other";
  }
}

using ncclep::liveGroups;
using ncclep::liveHandles;

ncclResult_t checkGroup(const ncclEpGroup* g, const char* what) {
  NCCLEXT_ARG(g != nullptr, "%s: group is NULL", what);
  NCCLEXT_ARG(liveGroups().contains(g), "%s: group %p is not a live group (destroyed, or never created)", what,
              (const void*)g);
  return ncclSuccess;
}

ncclResult_t checkHandle(const ncclEpHandle* h, const char* what) {
  NCCLEXT_ARG(h != nullptr, "%s: handle is NULL", what);
  NCCLEXT_ARG(liveHandles().contains(h), "%s: handle %p is not a live handle (destroyed, or never created)", what,
              (const void*)h);
  return ncclSuccess;
}

// A struct header ({size, magic}) of a layout this library knows: `sizes` lists every layout's size, the earliest
// first, sizeof of this library's last.
ncclResult_t checkHeader(const void* p, unsigned size, unsigned magic, std::initializer_list<size_t> sizes,
                         const char* what, const char* init) {
  NCCLEXT_ARG(p != nullptr, "%s is NULL", what);
  bool known = false;
  for (size_t s : sizes) known |= size == s;
  char layouts[64];
  if (sizes.size() == 1)
    snprintf(layouts, sizeof(layouts), "%zu", *sizes.begin());
  else
    snprintf(layouts, sizeof(layouts), "%zu to %zu", *sizes.begin(), *(sizes.end() - 1));
  NCCLEXT_ARG(known && magic == NCCL_EP_MAGIC,
              "%s: size %u / magic 0x%x are not a layout of this library (size %s, magic 0x%x): initialise it with "
              "%s, and build against this library's nccl_ep.h or an older one",
              what, size, magic, layouts, NCCL_EP_MAGIC, init);
  return ncclSuccess;
}

// A struct the caller passes in any layout this library knows (checkHeader's `sizes`), copied into `out` with what
// the caller's layout lacks zero (NCCL_EP_AUTO), its size this library's.
template <typename T>
ncclResult_t readVersioned(const T* p, std::initializer_list<size_t> sizes, const char* what, const char* init,
                           T* out) {
  NCCLEXT_CHECK(checkHeader(p, p ? p->size : 0, p ? p->magic : 0, sizes, what, init));
  std::memset(static_cast<void*>(out), 0, sizeof(T));
  std::memcpy(static_cast<void*>(out), static_cast<const void*>(p), p->size);
  out->size = sizeof(T);
  return ncclSuccess;
}

#define CHECK_HEADER(p, type, init) \
  NCCLEXT_CHECK(checkHeader((p), (p) ? (p)->size : 0, (p) ? (p)->magic : 0, {sizeof(type)}, #p, #init))

bool present(const ncclEpTensor_t& t) { return t.ndim != 0 || t.data != nullptr; }

// Whether the bytes [a, a + aBytes) and [b, b + bBytes) share one: one launch reading the one while it writes the
// other would see its own writes.
bool overlaps(const void* a, size_t aBytes, const void* b, size_t bBytes) {
  const uintptr_t a0 = (uintptr_t)a, b0 = (uintptr_t)b;
  return a0 < b0 + bBytes && b0 < a0 + aBytes;
}

// Checks a tensor's rank, dtype and sizes (-1: any) and that data is there unless the tensor is empty.
ncclResult_t checkTensor(const ncclEpTensor_t& t, const char* what, unsigned ndim,
                         std::initializer_list<ncclDataType_t> types, std::initializer_list<int64_t> sizes) {
  NCCLEXT_ARG(t.ndim == ndim, "%s: %u dims, expected %u", what, t.ndim, ndim);
  const int dtype = ncclext::storedInt(t.datatype);
  bool typeOk = false;
  for (ncclDataType_t d : types) typeOk |= dtype == (int)d;
  NCCLEXT_ARG(typeOk, "%s: dtype %s (%d) not accepted here", what,
              ncclext::isNcclDataType(dtype) ? dtypeName(static_cast<ncclDataType_t>(dtype)) : "unknown", dtype);
  int64_t elems = 1;
  bool overflow = false;  // a product past int64 must not wrap to "empty" (and so skip the data check)
  unsigned i = 0;
  for (int64_t want : sizes) {
    NCCLEXT_ARG(t.sizes[i] >= 0, "%s: sizes[%u] = %lld < 0", what, i, (long long)t.sizes[i]);
    NCCLEXT_ARG(want < 0 || t.sizes[i] == want, "%s: sizes[%u] = %lld, expected %lld", what, i, (long long)t.sizes[i],
                (long long)want);
    overflow |= __builtin_mul_overflow(elems, t.sizes[i], &elems);
    i++;
  }
  if (overflow) {  // an empty tensor stays empty (some size is 0); anything else has more elements than int64 holds
    bool empty = false;
    for (unsigned d = 0; d < ndim; d++) empty |= t.sizes[d] == 0;
    NCCLEXT_ARG(empty, "%s: sizes whose product overflows 64 bits", what);
    elems = 0;
  }
  NCCLEXT_ARG(elems == 0 || t.data != nullptr, "%s: data is NULL for a non-empty tensor", what);
  return ncclSuccess;
}

// Token rows are moved in 16-byte vectors.
ncclResult_t checkAligned(const ncclEpTensor_t& t, const char* what, int bytes = 16) {
  NCCLEXT_ARG(reinterpret_cast<uintptr_t>(t.data) % bytes == 0, "%s: data %p is not %d-byte aligned", what, t.data,
              bytes);
  return ncclSuccess;
}

ncclResult_t checkLayoutInfo(const ncclEpLayoutInfo_t* info, const ncclEpGroup* g) {
  if (!info) return ncclSuccess;
  NCCLEXT_CHECK(checkHeader(info, info->size, info->magic, {NCCL_EP_LAYOUT_INFO_V1_SIZE, sizeof(ncclEpLayoutInfo_t)},
                            "layout_info", "NCCL_EP_LAYOUT_INFO_INIT"));
  if (info->size >= sizeof(ncclEpLayoutInfo_t) && present(info->recv_dropped_counter)) {
    NCCLEXT_USAGE(!g->view.lowLatency, "layout_info.recv_dropped_counter: High-Throughput only (the receive cap's)");
    NCCLEXT_CHECK(checkTensor(info->recv_dropped_counter, "layout_info.recv_dropped_counter", 1, {ncclInt32}, {1}));
  }
  const int L = g->view.localExperts, R = g->view.nRanks;
  const struct {
    const ncclEpTensor_t& t;
    const char* name;
    int n;
  } outs[] = {{info->expert_counters, "layout_info.expert_counters", L},
              {info->src_rank_counters, "layout_info.src_rank_counters", R},
              {info->expert_offsets, "layout_info.expert_offsets", L},
              {info->recv_total_counter, "layout_info.recv_total_counter", 1}};
  for (const auto& o : outs)
    if (present(o.t)) NCCLEXT_CHECK(checkTensor(o.t, o.name, 1, {ncclInt32}, {o.n}));
  return ncclSuccess;
}

// An LL output beside outputs.tokens: at least the output's N rows.
ncclResult_t checkRows(const ncclEpTensor_t& t, const char* what, int64_t n) {
  NCCLEXT_ARG(t.sizes[0] >= n, "%s has %lld rows; the output has %lld", what, (long long)t.sizes[0], (long long)n);
  return ncclSuccess;
}

// The tensors both modes' dispatch calls carry (HT's DispatchCall, LL's LlDispatchCall).
template <typename Call>
void setDispatchTensors(Call* c, const ncclEpDispatchInputs_t* in, const ncclEpDispatchOutputs_t* out) {
  c->tokens = static_cast<const char*>(in->tokens.data);
  c->weights = static_cast<const float*>(in->topk_weights.data);
  c->scales = static_cast<const float*>(in->scales.data);
  c->outTokens = static_cast<char*>(out->tokens.data);
  c->outWeights = static_cast<float*>(out->topk_weights.data);
  c->outIdx = static_cast<int*>(out->topk_idx.data);
  c->outScales = static_cast<float*>(out->scales.data);
}

// Whether `p` points into this rank's window of the group (ncclEpGroupGetDispatchWindow's tensors do).
bool inWindow(const ncclEpGroup* g, const void* p) {
  const char* window = g->view.peers.mine;
  const char* at = static_cast<const char*>(p);
  return window && at >= window && at < window + g->view.wl.total;
}

int callSms(const ncclEpGroup* g, int requested) { return requested > 0 ? std::min(requested, g->smCount) : g->numSms; }

// At most `maxCtas` CTAs for `chunks` chunks, as few as keep the busiest at the same number of chunks: static
// round-robin ownership is then balanced (128 chunks on 88 CTAs would make some CTAs do 2 and most 1).
int balancedCtas(int maxCtas, int chunks) {
  if (chunks <= 0) return 1;
  const int per = (chunks + maxCtas - 1) / maxCtas;
  return (chunks + per - 1) / per;
}

// Combine's CTAs: half send (expert side), half reduce (owner side). The reducers walk this rank's own tokens and
// are balanced over its used chunks; the senders get the rest. Alone there are no senders.
void splitCombine(const ncclEpGroup* g, int ctas, int ownTokens, int* senders, int* receivers) {
  const int chunks = (ownTokens + ncclep::kChunkTokens - 1) / ncclep::kChunkTokens;
  if (g->view.nRanks == 1) {
    *receivers = balancedCtas(ctas, chunks);
    *senders = 0;
    return;
  }
  const int half = std::max(1, std::min(ctas - 1, (ctas + 1) / 2));  // senders get the odd CTA
  *receivers = balancedCtas(std::max(1, ctas - half), chunks);
  *senders = std::max(1, ctas - *receivers);
}

ncclResult_t rowsNeeded(const ncclEpHandle* h, int64_t* rows) {
  *rows = h->config.sizing == NCCL_EP_SIZING_EXACT ? h->recvRows() : h->maxRecvRows;
  return ncclSuccess;
}

// Low-Latency send-only calls: at most two open calls per kind and group (the staging's two banks), none on a handle
// with one open (a combine needs its dispatch received; a rebinding would change what the open call reads). A plain
// call runs both halves at once: none of its kind may be open.
const char* kindName(int kind) { return kind == ncclep::kDispatch ? "dispatch" : "combine"; }

ncclResult_t checkCallAllowed(const ncclEpHandle* h, ncclep::CallKind kind, bool sendOnly, const char* what) {
  const std::deque<ncclEpHandle*>& open = h->group->ll.pending[kind];
  const char* name = kindName(kind);
  NCCLEXT_USAGE(h->pendingKind < 0, "%s: this handle's send-only %s awaits ncclEpComplete", what,
                kindName(h->pendingKind));
  NCCLEXT_USAGE(sendOnly || open.empty(),
                "%s: %zu send-only %s call(s) await ncclEpComplete (the oldest on handle %p); complete them before a "
                "plain %s", what, open.size(), name, (const void*)open.front(), name);
  NCCLEXT_USAGE(open.size() < 2,
                "%s: two send-only %s calls (handles %p, %p) await ncclEpComplete: the staging has two banks", what,
                name, (const void*)open[0], (const void*)open[1]);
  return ncclSuccess;
}

// An LL call's optional recv_wait_cycles: [nRanks] int64 (added to by its receive half), else *out NULL.
ncclResult_t checkWaitCycles(const ncclEpTensor_t& t, const ncclEpGroup* g, unsigned long long** out) {
  *out = nullptr;
  if (!present(t)) return ncclSuccess;
  NCCLEXT_CHECK(checkTensor(t, "outputs.recv_wait_cycles", 1, {ncclInt64}, {g->view.nRanks}));
  NCCLEXT_CHECK(checkAligned(t, "outputs.recv_wait_cycles", 8));
  *out = static_cast<unsigned long long*>(t.data);
  return ncclSuccess;
}

// Low-Latency dispatch (headers checked): bf16 in and bf16 / e4m3 (quantised per 128 columns) / NVFP4 (quantised
// per 16, uint8 [N, H/2]) out, or e4m3 / NVFP4 in and out (forwarded with their scales).
ncclResult_t dispatchLowLatency(ncclEpHandle* handle, const ncclEpDispatchInputs_t* inputs,
                                const ncclEpDispatchOutputs_t* outputs, const ncclEpLayoutInfo_t* info,
                                const ncclEpDispatchConfig_t* config, cudaStream_t stream) {
  ncclEpGroup* g = handle->group;
  NCCLEXT_CHECK(checkCallAllowed(handle, ncclep::kDispatch, config && config->send_only, "ncclEpDispatch"));
  const int T = handle->view.numTokens, K = handle->topk;
  const int64_t N = handle->maxRecvRows;
  const bool rankMajor = handle->layout == NCCL_EP_LAYOUT_RANK_MAJOR;
  const ncclEpTensor_t& x = inputs->tokens;
  NCCLEXT_CHECK(checkTensor(x, "inputs.tokens", 2, {ncclBfloat16, ncclFloat8e4m3, ncclUint8}, {T, -1}));
  NCCLEXT_CHECK(checkAligned(x, "inputs.tokens"));
  // A row's format: bf16 (2 bytes a column), e4m3 (1) or NVFP4 (uint8, two columns a byte); H counts columns.
  enum Format { kBf16, kFp8, kFp4 };
  auto formatOf = [](int dtype) { return dtype == ncclBfloat16 ? kBf16 : dtype == ncclFloat8e4m3 ? kFp8 : kFp4; };
  auto rowBytesOf = [](Format f, int64_t cols) { return f == kBf16 ? 2 * cols : f == kFp8 ? cols : cols / 2; };
  const Format in = formatOf(x.datatype);
  NCCLEXT_ARG(x.sizes[1] <= g->config.max_token_bytes, "inputs.tokens: %lld columns exceed max_token_bytes %d",
              (long long)x.sizes[1], g->config.max_token_bytes);  // before the products below
  const int64_t H = in == kFp4 ? 2 * x.sizes[1] : x.sizes[1];
  NCCLEXT_ARG(H >= 1 && rowBytesOf(in, H) <= g->config.max_token_bytes && rowBytesOf(in, H) % 16 == 0,
              "inputs.tokens: hidden %lld: its row must be a multiple of 16 bytes within max_token_bytes %d",
              (long long)H, g->config.max_token_bytes);
  const ncclEpTensor_t& y = outputs->tokens;
  NCCLEXT_CHECK(checkTensor(y, "outputs.tokens", 2, {ncclBfloat16, ncclFloat8e4m3, ncclUint8}, {-1, -1}));
  const Format out = formatOf(y.datatype);
  NCCLEXT_ARG(y.sizes[1] == (out == kFp4 ? H / 2 : H), "outputs.tokens: sizes[1] = %lld, expected %lld (hidden %lld%s)",
              (long long)y.sizes[1], (long long)(out == kFp4 ? H / 2 : H), (long long)H,
              out == kFp4 ? " as NVFP4, two columns a byte" : "");
  NCCLEXT_CHECK(checkAligned(y, "outputs.tokens"));
  NCCLEXT_ARG(y.sizes[0] >= N, "outputs.tokens has %lld rows; a Low-Latency %s output has %lld",
              (long long)y.sizes[0], rankMajor ? "RANK_MAJOR" : "EXPERT_MAJOR", (long long)N);
  NCCLEXT_ARG(in == kBf16 || in == out, "inputs.tokens are %s: outputs.tokens must be %s too (forwarded)",
              in == kFp8 ? "fp8" : "NVFP4 (uint8)", in == kFp8 ? "fp8" : "NVFP4");
  const bool fp8Out = out == kFp8, fp4Out = out == kFp4;
  // fp8 scales as UE8M0 bytes packed four an int32 (DeepEP's use_ue8m0): asked for by int32 outputs.scales.
  const bool ue8m0 = fp8Out && present(outputs->scales) && outputs->scales.datatype == ncclInt32;
  // Scale words a row: one fp32 per 128 columns (fp8), four UE8M0 per 512 (packed fp8), four e4m3 per 64 (NVFP4).
  int scaleColsLog2 = fp4Out ? 6 : ue8m0 ? 9 : 7;
  int nScales = fp8Out || fp4Out ? (int)(H >> scaleColsLog2) : 0;
  // Forwarded fp8 takes any S 32-bit words a row (the caller's layout: per token, per block, packed), moved bit for
  // bit. Where S is not the per-block count above, the row's first slice moves all S (scaleColsLog2 -1).
  if (in == kFp8 && present(inputs->scales) && inputs->scales.ndim == 2 &&
      !(H % ((int64_t)1 << scaleColsLog2) == 0 && inputs->scales.sizes[1] == (H >> scaleColsLog2))) {
    NCCLEXT_ARG(inputs->scales.sizes[1] >= 1 && inputs->scales.sizes[1] <= g->view.meta.maxScales,
                "inputs.scales has %lld words a row; forwarded fp8 takes 1 to %d (a scale word per 128 bytes of the "
                "group's max_token_bytes %d)",
                (long long)inputs->scales.sizes[1], g->view.meta.maxScales, g->config.max_token_bytes);
    scaleColsLog2 = -1;
    nScales = (int)inputs->scales.sizes[1];
  }
  const char* fmt = fp4Out ? "NVFP4" : "fp8";
  // The window's room a row (layout.cc): a flag per kLlSliceCols columns and a scale word per 128 bytes, both
  // counted from max_token_bytes. bf16 and fp8 rows fit whenever their bytes do; NVFP4 rows (H / 2 bytes) need room
  // for H columns and H / 64 scale words: max_token_bytes >= 2 H, as for the bf16 rows they come from.
  NCCLEXT_ARG((H + ncclep::kLlSliceCols - 1) / ncclep::kLlSliceCols <= g->view.wl.slices &&
                  nScales <= g->view.meta.maxScales,
              "%s rows of hidden %lld need max_token_bytes >= %lld (the group's window keeps a flag per %d columns "
              "and a scale word per 128 bytes of max_token_bytes); the group has %d",
              fp4Out ? "NVFP4" : "Low-Latency", (long long)H, (long long)(fp4Out ? 2 * H : H), ncclep::kLlSliceCols,
              g->config.max_token_bytes);
  if (fp8Out || fp4Out) {
    NCCLEXT_ARG(H % 128 == 0, "%s tokens: hidden %lld is not a multiple of 128", fmt, (long long)H);
    NCCLEXT_ARG(present(outputs->scales), "%s outputs need outputs.scales %s", fmt,
                fp4Out ? "[N, hidden/16] uint8 or e4m3"
                       : "[N, hidden/128] fp32 or [N, hidden/512] int32 (UE8M0); forwarded: [N, S] as inputs.scales");
    NCCLEXT_ARG(!ue8m0 || in == kFp8 || H % 512 == 0,
                "UE8M0 scales (int32 outputs.scales): hidden %lld is not a multiple of 512 "
                "(four scales of 128 columns a word)",
                (long long)H);
    if (fp4Out)
      NCCLEXT_CHECK(checkTensor(outputs->scales, "outputs.scales", 2, {ncclUint8, ncclFloat8e4m3}, {-1, H / 16}));
    else
      NCCLEXT_CHECK(checkTensor(outputs->scales, "outputs.scales", 2, {ncclFloat32, ncclInt32}, {-1, nScales}));
    NCCLEXT_CHECK(checkRows(outputs->scales, "outputs.scales", N));
    NCCLEXT_CHECK(checkAligned(outputs->scales, "outputs.scales", 4));  // the kernels move 32-bit words
  } else {
    NCCLEXT_ARG(!present(outputs->scales), "outputs.scales are for fp8 and NVFP4 outputs only");
  }
  if (in != kBf16) {
    NCCLEXT_ARG(
        present(inputs->scales), "%s tokens need inputs.scales %s", fmt,
        fp4Out ? "[T, hidden/16] uint8 or e4m3" : "[T, S] fp32 or int32 (S words a row, forwarded bit for bit)");
    if (in == kFp4)
      NCCLEXT_CHECK(checkTensor(inputs->scales, "inputs.scales", 2, {ncclUint8, ncclFloat8e4m3}, {T, H / 16}));
    else  // forwarded as they are: the outputs' scales of the same form
      NCCLEXT_CHECK(checkTensor(inputs->scales, "inputs.scales", 2, {ue8m0 ? ncclInt32 : ncclFloat32}, {T, nScales}));
    NCCLEXT_CHECK(checkAligned(inputs->scales, "inputs.scales", 4));
  } else {
    NCCLEXT_ARG(!present(inputs->scales), "inputs.scales are for fp8 and NVFP4 tokens only");
  }
  const bool quantizeFp4 = in == kBf16 && fp4Out;
  if (quantizeFp4) {
    NCCLEXT_ARG(present(inputs->global_scale), "NVFP4 quantisation needs inputs.global_scale [1] fp32");
    NCCLEXT_CHECK(checkTensor(inputs->global_scale, "inputs.global_scale", 1, {ncclFloat32}, {1}));
    NCCLEXT_ARG(!config || !config->round_scale, "config.round_scale is for fp8 quantisation (NVFP4 scales are e4m3)");
  } else {
    NCCLEXT_ARG(!present(inputs->global_scale), "inputs.global_scale is for NVFP4 quantisation (bf16 in, uint8 out)");
  }
  if (present(inputs->topk_weights))
    NCCLEXT_CHECK(checkTensor(inputs->topk_weights, "inputs.topk_weights", 2, {ncclFloat32}, {T, K}));
  if (present(outputs->topk_weights)) {
    if (rankMajor) NCCLEXT_CHECK(checkTensor(outputs->topk_weights, "outputs.topk_weights", 2, {ncclFloat32}, {-1, K}));
    else NCCLEXT_CHECK(checkTensor(outputs->topk_weights, "outputs.topk_weights", 1, {ncclFloat32}, {-1}));
    NCCLEXT_CHECK(checkRows(outputs->topk_weights, "outputs.topk_weights", N));
  }
  if (present(outputs->topk_idx)) {
    NCCLEXT_USAGE(rankMajor, "outputs.topk_idx is for the RANK_MAJOR layout (EXPERT_MAJOR rows are grouped by expert)");
    NCCLEXT_CHECK(checkTensor(outputs->topk_idx, "outputs.topk_idx", 2, {ncclInt32}, {-1, K}));
    NCCLEXT_CHECK(checkRows(outputs->topk_idx, "outputs.topk_idx", N));
  }
  if (present(outputs->src_info)) {
    NCCLEXT_CHECK(checkTensor(outputs->src_info, "outputs.src_info", 1, {ncclInt32}, {-1}));
    NCCLEXT_CHECK(checkRows(outputs->src_info, "outputs.src_info", N));
  }
  unsigned long long* waitCycles = nullptr;
  NCCLEXT_CHECK(checkWaitCycles(outputs->recv_wait_cycles, g, &waitCycles));
  NCCLEXT_CHECK(checkLayoutInfo(info, g));
  ncclep::LlDispatchCall c{};
  setDispatchTensors(&c, inputs, outputs);
  c.outSrcInfo = static_cast<int*>(outputs->src_info.data);
  c.waitCycles = waitCycles;
  c.info = layoutInfoOut(info);
  c.hidden = (int)H;
  c.inRowBytes = (int)rowBytesOf(in, H);
  c.outRowBytes = (int)rowBytesOf(out, H);
  c.inColNibbles = (int)(2 * rowBytesOf(in, H) / H);
  c.outColNibbles = (int)(2 * rowBytesOf(out, H) / H);
  c.nScales = nScales;
  c.scaleColsLog2 = scaleColsLog2;
  c.quantize = in == kBf16 && fp8Out;
  c.quantizeFp4 = quantizeFp4;
  c.globalScale = quantizeFp4 ? static_cast<const float*>(inputs->global_scale.data) : nullptr;
  c.roundScale = (config && config->round_scale) || ue8m0;  // UE8M0 holds powers of two only
  c.ue8m0 = ue8m0;
  c.idBase = config && config->global_expert_ids ? g->view.rank * g->view.localExperts : 0;
  return ncclep::llDispatch(handle, c, callSms(g, config ? config->num_sms : 0), config && config->send_only,
                            stream);
}

ncclResult_t combineLowLatency(ncclEpHandle* handle, const ncclEpCombineInputs_t* inputs,
                               const ncclEpCombineOutputs_t* outputs, const ncclEpCombineConfig_t* config,
                               cudaStream_t stream) {
  ncclEpGroup* g = handle->group;
  NCCLEXT_CHECK(checkCallAllowed(handle, ncclep::kCombine, config && config->send_only, "ncclEpCombine"));
  const int T = handle->view.numTokens, K = handle->topk;
  const bool rankMajor = handle->layout == NCCL_EP_LAYOUT_RANK_MAJOR;
  NCCLEXT_ARG(!present(inputs->bias), "inputs.bias at combine is for the High-Throughput mode");
  const ncclEpTensor_t& x = inputs->tokens;
  NCCLEXT_CHECK(checkTensor(x, "inputs.tokens", 2, {ncclBfloat16}, {-1, -1}));
  NCCLEXT_CHECK(checkAligned(x, "inputs.tokens"));
  const int64_t H = x.sizes[1];
  NCCLEXT_ARG(H >= 8 && H % 8 == 0 && H <= g->config.max_token_bytes / 2,
              "inputs.tokens: hidden %lld: a bf16 row must be a multiple of 16 bytes within max_token_bytes %d",
              (long long)H, g->config.max_token_bytes);
  NCCLEXT_ARG(x.sizes[0] >= handle->maxRecvRows, "inputs.tokens has %lld rows; this handle's dispatch output has %lld",
              (long long)x.sizes[0], (long long)handle->maxRecvRows);
  NCCLEXT_CHECK(checkTensor(outputs->tokens, "outputs.tokens", 2, {ncclBfloat16}, {T, H}));
  NCCLEXT_CHECK(checkAligned(outputs->tokens, "outputs.tokens"));
  ncclep::LlCombineCall c{};
  if (present(inputs->topk_weights)) {
    NCCLEXT_USAGE(!rankMajor,
                  "inputs.topk_weights at combine: RANK_MAJOR rows are already reduced per (token, rank) by the "
                  "caller; the owner-weighted path is EXPERT_MAJOR's");
    NCCLEXT_CHECK(checkTensor(inputs->topk_weights, "inputs.topk_weights", 2, {ncclFloat32}, {T, K}));
    c.mode = ncclep::kLlOwnerWeighted;
    c.weights = static_cast<const float*>(inputs->topk_weights.data);
  } else {
    c.mode = rankMajor ? ncclep::kLlRankRows : ncclep::kLlExpertWeighted;
  }
  NCCLEXT_CHECK(checkWaitCycles(outputs->recv_wait_cycles, g, &c.waitCycles));
  if (present(outputs->missing_experts)) {
    NCCLEXT_USAGE(g->view.mask != nullptr, "outputs.missing_experts: the group was created without enable_mask");
    NCCLEXT_CHECK(checkTensor(outputs->missing_experts, "outputs.missing_experts", 1, {ncclInt32}, {T}));
    c.missing = static_cast<int*>(outputs->missing_experts.data);
  }
  // (the owner's own rows are read in place, from the input, while the output is written)
  NCCLEXT_ARG(!overlaps(x.data, (size_t)x.sizes[0] * H * 2, outputs->tokens.data, (size_t)T * H * 2),
              "outputs.tokens overlaps inputs.tokens: give the output a tensor of its own");
  c.in = static_cast<const char*>(x.data);
  c.out = static_cast<char*>(outputs->tokens.data);
  c.rowBytes = (int)(H * 2);
  return ncclep::llCombine(handle, c, callSms(g, config ? config->num_sms : 0), config && config->send_only,
                           stream);
}

}  // namespace

extern "C" {

ncclResult_t ncclEpGetVersion(int* version) {
  ncclext::clearLastError();
  return ncclext::guardAbi("ncclEpGetVersion", [&]() -> ncclResult_t {
    NCCLEXT_ARG(version != nullptr, "ncclEpGetVersion: version is NULL");
    *version = NCCL_EP_VERSION_CODE;
    return ncclSuccess;
  });
}

ncclResult_t ncclEpCheckNcclRuntime(int* builtVersion, int* loadedVersion) {
  ncclext::clearLastError();
  return ncclext::guardAbi("ncclEpCheckNcclRuntime",
                           [&]() -> ncclResult_t { return ncclext::checkNcclRuntime(builtVersion, loadedVersion); });
}

const char* ncclEpGetLastError(void) { return ncclext::lastError(); }

// The checks of a group's config (ncclEpCreateGroup, ncclEpGroupInfoQuery); `what` names the caller.
// Every layout of ncclEpGroupConfig_t: the first two's sizes, then this one's.
static ncclResult_t readGroupConfig(const ncclEpGroupConfig_t* config, ncclEpGroupConfig_t* out) {
  return readVersioned(config,
                       {NCCL_EP_GROUP_CONFIG_V1_SIZE, NCCL_EP_GROUP_CONFIG_V2_SIZE, sizeof(ncclEpGroupConfig_t)},
                       "config", "NCCL_EP_GROUP_CONFIG_INIT", out);
}

static ncclResult_t checkGroupConfig(const ncclEpGroupConfig_t& c, const char* what) {
  NCCLEXT_ARG(c.algorithm == NCCL_EP_ALGO_HIGH_THROUGHPUT || c.algorithm == NCCL_EP_ALGO_LOW_LATENCY,
              "%s: algorithm %d unknown", what, (int)c.algorithm);
  NCCLEXT_ARG(c.num_experts >= 1 && c.num_experts <= ncclep::kMaxExperts, "num_experts %d not in [1, %d]",
              c.num_experts, ncclep::kMaxExperts);
  NCCLEXT_ARG(c.max_tokens_per_rank >= 1 && c.max_tokens_per_rank <= ncclep::kMaxTokens,
              "max_tokens_per_rank %d not in [1, %d]", c.max_tokens_per_rank, ncclep::kMaxTokens);
  NCCLEXT_ARG(c.algorithm != NCCL_EP_ALGO_LOW_LATENCY || c.max_tokens_per_rank <= ncclep::kLlMaxTokens,
              "max_tokens_per_rank %d: the Low-Latency mode takes at most %d", c.max_tokens_per_rank,
              ncclep::kLlMaxTokens);
  NCCLEXT_ARG(c.max_token_bytes >= 16 && c.max_token_bytes % 16 == 0 && c.max_token_bytes <= 65536,
              "max_token_bytes %d: must be a multiple of 16 in [16, 65536]", c.max_token_bytes);
  NCCLEXT_ARG(c.max_topk >= 1 && c.max_topk <= ncclep::kMaxTopk, "max_topk %d not in [1, %d]", c.max_topk,
              ncclep::kMaxTopk);
  NCCLEXT_ARG(c.num_sms >= 0, "num_sms %d < 0", c.num_sms);
  NCCLEXT_ARG(c.zero_copy >= NCCL_EP_ZERO_COPY_AUTO && c.zero_copy <= NCCL_EP_ZERO_COPY_ON, "zero_copy %d unknown",
              (int)c.zero_copy);
  NCCLEXT_USAGE(c.zero_copy != NCCL_EP_ZERO_COPY_ON ||
                    (c.algorithm == NCCL_EP_ALGO_HIGH_THROUGHPUT && c.max_recv_rows_per_rank > 0),
                "zero_copy ON: dispatch outputs in the window, which only High-Throughput groups with "
                "max_recv_rows_per_rank have");
  NCCLEXT_USAGE((c.alloc.alloc_fn == nullptr) == (c.alloc.free_fn == nullptr),
                "alloc: give both alloc_fn and free_fn, or neither");
  NCCLEXT_ARG(c.lsa_domain_size >= 0, "lsa_domain_size %d < 0", c.lsa_domain_size);
  NCCLEXT_ARG(c.rail_round_tokens >= 0, "rail_round_tokens %d < 0", c.rail_round_tokens);
  NCCLEXT_ARG(c.enable_mask == 0 || c.enable_mask == 1, "enable_mask %d: 0 or 1", c.enable_mask);
  NCCLEXT_USAGE(!c.enable_mask || c.algorithm == NCCL_EP_ALGO_LOW_LATENCY,
                "enable_mask: rank masks belong to the Low-Latency mode (a High-Throughput wait that times out fails "
                "the group)");
  NCCLEXT_ARG(c.ht_hierarchical == NCCL_EP_AUTO || c.ht_hierarchical == 1 || c.ht_hierarchical == NCCL_EP_OFF,
              "ht_hierarchical %d: 1, NCCL_EP_OFF (-1) or NCCL_EP_AUTO (0)", c.ht_hierarchical);
  NCCLEXT_ARG(c.rail_overlap == NCCL_EP_AUTO || c.rail_overlap == 1 || c.rail_overlap == NCCL_EP_OFF,
              "rail_overlap %d: 1, NCCL_EP_OFF (-1) or NCCL_EP_AUTO (0)", c.rail_overlap);
  NCCLEXT_ARG(c.max_recv_rows_per_rank >= 0, "max_recv_rows_per_rank %d < 0 (NCCL_EP_AUTO, 0: no cap)",
              c.max_recv_rows_per_rank);
  NCCLEXT_USAGE(c.max_recv_rows_per_rank == 0 || c.algorithm == NCCL_EP_ALGO_HIGH_THROUGHPUT,
                "max_recv_rows_per_rank: the receive cap belongs to the High-Throughput mode (Low-Latency outputs "
                "are fixed, [local experts][R x max_tokens_per_rank] rows)");
  NCCLEXT_ARG(c.recv_overflow == NCCL_EP_RECV_OVERFLOW_ERROR || c.recv_overflow == NCCL_EP_RECV_OVERFLOW_DROP,
              "recv_overflow %d unknown", (int)c.recv_overflow);
  return ncclSuccess;
}

// The one-GPU test modes of ncclEpCreateGroupTesting (NULL: none).
static ncclResult_t checkTesting(const ncclEpTestingConfig_t* t, ncclep::TestingModes* out) {
  *out = ncclep::TestingModes{};
  if (!t) return ncclSuccess;
  CHECK_HEADER(t, ncclEpTestingConfig_t, NCCL_EP_TESTING_CONFIG_INIT);
  if (t->virtual_domain) {
    const int n = t->virtual_domain->domain.size();
    NCCLEXT_ARG(t->virtual_rank >= 0 && t->virtual_rank < n, "virtual_rank %d not in [0, %d) of the virtual domain",
                t->virtual_rank, n);
  } else {
    NCCLEXT_ARG(t->virtual_rank == 0, "virtual_rank %d without a virtual_domain", t->virtual_rank);
    NCCLEXT_USAGE(t->virtual_rail == nullptr, "virtual_rail without a virtual_domain (the mixed test mode has both)");
  }
  out->virtualDomain = t->virtual_domain;
  out->virtualRank = t->virtual_rank;
  out->virtualRail = t->virtual_rail;
  return ncclSuccess;
}

static ncclResult_t createGroup(ncclEpGroup_t* group, ncclComm_t comm, const ncclEpGroupConfig_t* config,
                                const ncclEpTestingConfig_t* testing, const char* what) {
  NCCLEXT_ARG(group != nullptr, "%s: group is NULL", what);
  *group = nullptr;
  NCCLEXT_ARG(comm != nullptr, "%s: comm is NULL", what);
  ncclEpGroupConfig_t c;
  NCCLEXT_CHECK(readGroupConfig(config, &c));
  NCCLEXT_CHECK(checkGroupConfig(c, what));
  ncclep::TestingModes modes;
  NCCLEXT_CHECK(checkTesting(testing, &modes));
  ncclext::LiveSet::Reservation entry(liveGroups());  // before the collective creation: registering cannot fail
  ncclEpGroup* g = nullptr;
  NCCLEXT_CHECK(ncclEpGroup::create(comm, c, modes, &g));
  entry.commit(g);
  *group = g;
  return ncclSuccess;
}

ncclResult_t ncclEpCreateGroup(ncclEpGroup_t* group, ncclComm_t comm, const ncclEpGroupConfig_t* config) {
  ncclext::clearLastError();
  return ncclext::guardAbi("ncclEpCreateGroup", [&]() -> ncclResult_t {
    return createGroup(group, comm, config, nullptr, "ncclEpCreateGroup");
  });
}

ncclResult_t ncclEpCreateGroupTesting(ncclEpGroup_t* group, ncclComm_t comm, const ncclEpGroupConfig_t* config,
                                      const ncclEpTestingConfig_t* testing) {
  ncclext::clearLastError();
  return ncclext::guardAbi("ncclEpCreateGroupTesting", [&]() -> ncclResult_t {
    return createGroup(group, comm, config, testing, "ncclEpCreateGroupTesting");
  });
}

ncclResult_t ncclEpVirtualDomainCreate(ncclEpVirtualDomain_t* domain, int n_ranks) {
  ncclext::clearLastError();
  return ncclext::guardAbi("ncclEpVirtualDomainCreate", [&]() -> ncclResult_t {
    NCCLEXT_ARG(domain != nullptr, "ncclEpVirtualDomainCreate: domain is NULL");
    *domain = nullptr;
    NCCLEXT_ARG(n_ranks >= 1 && n_ranks <= ncclext::VirtualDomain::kMaxRanks,
                "ncclEpVirtualDomainCreate: %d ranks not in [1, %d]", n_ranks, ncclext::VirtualDomain::kMaxRanks);
    *domain = new ncclEpVirtualDomain(n_ranks);
    return ncclSuccess;
  });
}

ncclResult_t ncclEpVirtualDomainDestroy(ncclEpVirtualDomain_t domain) {
  ncclext::clearLastError();
  return ncclext::guardAbi("ncclEpVirtualDomainDestroy", [&]() -> ncclResult_t {
    delete domain;
    return ncclSuccess;
  });
}

ncclResult_t ncclEpGroupDestroy(ncclEpGroup_t group) {
  ncclext::clearLastError();
  return ncclext::guardAbi("ncclEpGroupDestroy", [&]() -> ncclResult_t {
    if (!group) return ncclSuccess;
    NCCLEXT_CHECK(checkGroup(group, "ncclEpGroupDestroy"));
    const int handles = group->liveHandles.load();
    NCCLEXT_USAGE(handles == 0,
                  "ncclEpGroupDestroy: %d handle(s) of this group are alive; ncclEpHandleDestroy them first (the "
                  "group is unchanged)",
                  handles);
    liveGroups().remove(group);
    return ncclEpGroup::destroy(group);
  });
}

ncclResult_t ncclEpGroupGetAsyncError(ncclEpGroup_t group) {
  ncclext::clearLastError();
  return ncclext::guardAbi("ncclEpGroupGetAsyncError", [&]() -> ncclResult_t {
    NCCLEXT_CHECK(checkGroup(group, "ncclEpGroupGetAsyncError"));
    return group->asyncError("ncclEp");
  });
}

// What a group of layout `v` on `topo` reports (ncclEpGroupGetInfo; ncclEpGroupInfoQuery before it exists): its
// rail's staging bytes and whether its flat exchange is overlapped are the group's (or the query's) own.
static void fillGroupInfo(const ncclep::GroupView& v, const ncclext::Topology& topo, size_t railBytes, bool overlapped,
                          ncclEpGroupInfo_t* info) {
  const ncclep::RailView& rv = v.rail;
  const bool rail = topo.nDomains > 1;  // a rail communicator, outboxes: several domains
  info->n_domains = topo.nDomains;
  info->domain_size = topo.domainSize;
  info->window_bytes = v.wl.total;
  auto bytesOf = [&](int kind, bool owner) {
    return rail && !(owner && rv.highThroughput) ? rv.callBytes(rv.regionsOf(kind, owner)) : (size_t)0;
  };
  info->rail_dispatch_bytes = bytesOf(ncclep::kDispatch, false);
  info->rail_combine_bytes = bytesOf(ncclep::kCombine, false);
  info->rail_combine_owner_bytes = bytesOf(ncclep::kCombine, true);
  info->rail_messages_per_domain = 0;
  info->rail_dispatch_domain_bytes = info->rail_combine_domain_bytes = 0;
  info->rail_relayed = rail && rv.relay ? 1 : 0;
  info->rail_staging_bytes = railBytes;
  info->rail_round_tokens = rv.roundSlots;
  info->rail_hierarchical = rail && rv.hier ? 1 : 0;
  info->rail_overlapped = overlapped ? 1 : 0;
  if (rail && rv.hier) {
    // A message per round (fixed slices: every position's), of a row with its tail (dispatch) or a partial row.
    info->rail_messages_per_domain = ncclep::railRoundsOf(rv, v.nRanks, v.maxTokens, nullptr);
    info->rail_dispatch_domain_bytes = (size_t)v.maxTokens * ncclep::hierRowBytes(v, ncclep::kDispatch);
    info->rail_combine_domain_bytes = (size_t)v.maxTokens * ncclep::hierRowBytes(v, ncclep::kCombine);
  } else if (rail) {
    // Direct: a message per region (dispatch and combine have 2) and round (fixed slices: every slot's).
    const int rounds = ncclep::railRoundsOf(rv, v.nRanks, v.maxTokens, nullptr);
    info->rail_messages_per_domain = topo.domainSize * (rv.direct ? 2 * rounds : 1);
    info->rail_dispatch_domain_bytes = (size_t)topo.domainSize * info->rail_dispatch_bytes;
    info->rail_combine_domain_bytes = (size_t)topo.domainSize * info->rail_combine_bytes;
  }
}

ncclResult_t ncclEpGroupGetInfo(ncclEpGroup_t group, ncclEpGroupInfo_t* info) {
  ncclext::clearLastError();
  return ncclext::guardAbi("ncclEpGroupGetInfo", [&]() -> ncclResult_t {
    NCCLEXT_CHECK(checkGroup(group, "ncclEpGroupGetInfo"));
    NCCLEXT_ARG(info != nullptr, "ncclEpGroupGetInfo: info is NULL");
    CHECK_HEADER(info, ncclEpGroupInfo_t, NCCL_EP_GROUP_INFO_INIT);
    const ncclep::Rail* rail = group->rail.get();
    fillGroupInfo(group->view, group->window.domain->topo(), rail ? rail->stagingBytes() : 0,
                  rail && rail->sideStream() != nullptr, info);
    return ncclSuccess;
  });
}

ncclResult_t ncclEpGroupInfoQuery(const ncclEpGroupConfig_t* config, int n_ranks, int lsa_size,
                                  ncclEpGroupInfo_t* info) {
  ncclext::clearLastError();
  return ncclext::guardAbi("ncclEpGroupInfoQuery", [&]() -> ncclResult_t {
    NCCLEXT_ARG(info != nullptr, "ncclEpGroupInfoQuery: info is NULL");
    CHECK_HEADER(info, ncclEpGroupInfo_t, NCCL_EP_GROUP_INFO_INIT);
    ncclEpGroupConfig_t c;
    NCCLEXT_CHECK(readGroupConfig(config, &c));
    NCCLEXT_CHECK(checkGroupConfig(c, "ncclEpGroupInfoQuery"));
    NCCLEXT_ARG(n_ranks >= 1 && n_ranks <= ncclep::kMaxRanks, "ncclEpGroupInfoQuery: n_ranks %d not in [1, %d]",
                n_ranks, ncclep::kMaxRanks);
    NCCLEXT_ARG(c.num_experts % n_ranks == 0, "num_experts %d is not a multiple of the %d ranks", c.num_experts,
                n_ranks);
    // As ncclEpCreateGroup's Domain: the config's domain size, else the environment's, splits the LSA team.
    ncclext::Topology topo;
    NCCLEXT_CHECK(ncclext::makeTopology(0, n_ranks, 0, lsa_size,
                                        c.lsa_domain_size > 0 ? c.lsa_domain_size : ncclext::env().lsaDomainSize,
                                        &topo));
    const ncclep::ResolvedConfig resolved = ncclep::resolveConfig(c);
    ncclep::GroupView v;
    NCCLEXT_CHECK(ncclep::layoutWithinBudget(resolved.config, topo, &v, resolved.htHierarchical));
    fillGroupInfo(v, topo, ncclep::railStagingBytes(v), v.rail.overlappable() && resolved.railOverlap, info);
    return ncclSuccess;
  });
}

static ncclResult_t checkTopk(const ncclEpGroup* g, const ncclEpTensor_t* topk) {
  NCCLEXT_ARG(topk != nullptr, "topk_idx is NULL");
  NCCLEXT_CHECK(checkTensor(*topk, "topk_idx", 2, {ncclInt32, ncclInt64}, {-1, -1}));
  NCCLEXT_ARG(topk->sizes[0] <= g->config.max_tokens_per_rank, "topk_idx has %lld tokens, above max_tokens_per_rank %d",
              (long long)topk->sizes[0], g->config.max_tokens_per_rank);
  NCCLEXT_ARG(topk->sizes[1] >= 1 && topk->sizes[1] <= g->config.max_topk, "top-k %lld not in [1, max_topk %d]",
              (long long)topk->sizes[1], g->config.max_topk);
  return ncclSuccess;
}

ncclResult_t ncclEpCreateHandle(ncclEpHandle_t* handle, ncclEpGroup_t group, ncclEpLayout_t layout,
                                const ncclEpTensor_t* topk_idx, const ncclEpLayoutInfo_t* layout_info,
                                const ncclEpHandleConfig_t* config, cudaStream_t stream) {
  ncclext::clearLastError();
  return ncclext::guardAbi("ncclEpCreateHandle", [&]() -> ncclResult_t {
    NCCLEXT_ARG(handle != nullptr, "ncclEpCreateHandle: handle is NULL");
    *handle = nullptr;
    NCCLEXT_CHECK(checkGroup(group, "ncclEpCreateHandle"));
    NCCLEXT_CHECK(group->asyncError("ncclEpCreateHandle"));
    const bool ll = group->view.lowLatency;
    NCCLEXT_ARG(layout >= NCCL_EP_LAYOUT_EXPERT_MAJOR && layout <= NCCL_EP_LAYOUT_FLAT, "layout %d unknown",
                (int)layout);
    NCCLEXT_USAGE(ll || layout != NCCL_EP_LAYOUT_RANK_MAJOR,
                  "layout RANK_MAJOR belongs to the Low-Latency mode (High-Throughput takes FLAT or EXPERT_MAJOR)");
    NCCLEXT_USAGE(!ll || layout != NCCL_EP_LAYOUT_FLAT,
                  "layout FLAT belongs to the High-Throughput mode (Low-Latency takes RANK_MAJOR or EXPERT_MAJOR)");
    NCCLEXT_USAGE(layout == NCCL_EP_LAYOUT_FLAT || group->config.zero_copy != NCCL_EP_ZERO_COPY_ON,
                  "zero_copy ON: FLAT handles only (EXPERT_MAJOR rows are ordered by expert, not as they land in the "
                  "window)");
    NCCLEXT_CHECK(checkTopk(group, topk_idx));
    ncclEpHandleConfig_t cfg = NCCL_EP_HANDLE_CONFIG_INIT;
    if (config) {
      CHECK_HEADER(config, ncclEpHandleConfig_t, NCCL_EP_HANDLE_CONFIG_INIT);
      cfg = *config;
    }
    const int a = cfg.dispatch_output_per_expert_alignment;
    NCCLEXT_ARG(a >= 0 && a <= 1024, "dispatch_output_per_expert_alignment %d: not in [0, 1024]", a);
    NCCLEXT_ARG(cfg.sizing == NCCL_EP_SIZING_WORST_CASE || cfg.sizing == NCCL_EP_SIZING_EXACT, "sizing %d unknown",
                (int)cfg.sizing);
    if (ll) {
      NCCLEXT_USAGE(cfg.sizing == NCCL_EP_SIZING_WORST_CASE,
                    "EXACT sizing: Low-Latency outputs have fixed worst-case shapes and never wait on the host");
      NCCLEXT_USAGE(a <= 1, "dispatch_output_per_expert_alignment %d: Low-Latency zones are fixed (R x M rows)", a);
      NCCLEXT_USAGE(layout_info == nullptr,
                    "layout_info at handle creation: Low-Latency counts arrive with each dispatch (pass it there)");
    }
    NCCLEXT_CHECK(checkLayoutInfo(layout_info, group));
    ncclEpHandle* created = nullptr;
    NCCLEXT_CHECK(ncclEpHandle::create(group, layout, (int)topk_idx->sizes[1], cfg, &created));
    std::unique_ptr<ncclEpHandle> h(created);
    ncclext::LiveSet::Reservation entry(liveHandles());  // may throw: then h is freed, nothing registered
    NCCLEXT_CHECK(h->bind(*topk_idx, layout_info, stream));
    if (cfg.sizing == NCCL_EP_SIZING_EXACT) NCCLEXT_CHECK(group->asyncError("ncclEpCreateHandle"));
    entry.commit(h.get());
    group->liveHandles++;
    *handle = h.release();
    return ncclSuccess;
  });
}

ncclResult_t ncclEpUpdateHandle(ncclEpHandle_t handle, const ncclEpTensor_t* topk_idx,
                                const ncclEpLayoutInfo_t* layout_info, cudaStream_t stream) {
  ncclext::clearLastError();
  return ncclext::guardAbi("ncclEpUpdateHandle", [&]() -> ncclResult_t {
    NCCLEXT_CHECK(checkHandle(handle, "ncclEpUpdateHandle"));
    NCCLEXT_CHECK(handle->group->asyncError("ncclEpUpdateHandle"));
    NCCLEXT_CHECK(checkTopk(handle->group, topk_idx));
    NCCLEXT_ARG(topk_idx->sizes[1] == handle->topk, "top-k %lld differs from the handle's %d (create a new handle)",
                (long long)topk_idx->sizes[1], handle->topk);
    NCCLEXT_USAGE(handle->pendingKind < 0, "ncclEpUpdateHandle: the handle's send-only call awaits ncclEpComplete");
    NCCLEXT_USAGE(!handle->group->view.lowLatency || layout_info == nullptr,
                  "layout_info at handle update: Low-Latency counts arrive with each dispatch (pass it there)");
    NCCLEXT_CHECK(checkLayoutInfo(layout_info, handle->group));
    NCCLEXT_CHECK(handle->bind(*topk_idx, layout_info, stream));
    if (handle->config.sizing == NCCL_EP_SIZING_EXACT) NCCLEXT_CHECK(handle->group->asyncError("ncclEpUpdateHandle"));
    return ncclSuccess;
  });
}

ncclResult_t ncclEpHandleDestroy(ncclEpHandle_t handle) {
  ncclext::clearLastError();
  return ncclext::guardAbi("ncclEpHandleDestroy", [&]() -> ncclResult_t {
    if (!handle) return ncclSuccess;
    NCCLEXT_ARG(liveHandles().remove(handle),
                "ncclEpHandleDestroy: handle %p is not a live handle (destroyed already, or never created)",
                (const void*)handle);
    handle->group->liveHandles--;
    delete handle;
    return ncclSuccess;
  });
}

ncclResult_t ncclEpHandleGetRecvRows(ncclEpHandle_t handle, int64_t* rows) {
  ncclext::clearLastError();
  return ncclext::guardAbi("ncclEpHandleGetRecvRows", [&]() -> ncclResult_t {
    NCCLEXT_CHECK(checkHandle(handle, "ncclEpHandleGetRecvRows"));
    NCCLEXT_ARG(rows != nullptr, "ncclEpHandleGetRecvRows: rows is NULL");
    NCCLEXT_USAGE(handle->config.sizing == NCCL_EP_SIZING_EXACT,
                  "ncclEpHandleGetRecvRows: the handle uses worst-case sizing; the count is on the device "
                  "(layout_info.recv_total_counter)");
    *rows = handle->recvRows();
    return ncclSuccess;
  });
}

ncclResult_t ncclEpGroupGetDispatchWindow(ncclEpGroup_t group, ncclDataType_t datatype, int64_t hidden,
                                          ncclEpTensor_t* tokens) {
  ncclext::clearLastError();
  return ncclext::guardAbi("ncclEpGroupGetDispatchWindow", [&]() -> ncclResult_t {
    NCCLEXT_CHECK(checkGroup(group, "ncclEpGroupGetDispatchWindow"));
    NCCLEXT_ARG(tokens != nullptr, "ncclEpGroupGetDispatchWindow: tokens is NULL");
    const ncclep::GroupView& v = group->view;
    NCCLEXT_USAGE(group->config.zero_copy != NCCL_EP_ZERO_COPY_OFF,
                  "ncclEpGroupGetDispatchWindow: this group's zero_copy is OFF (its dispatches copy)");
    NCCLEXT_USAGE(v.recvCap > 0,
                  "ncclEpGroupGetDispatchWindow: zero-copy outputs need a High-Throughput group with "
                  "max_recv_rows_per_rank (its staging holds each row at its FLAT position)");
    const int dtype = ncclext::storedInt(datatype);
    const size_t esize = ncclext::isNcclDataType(dtype) ? dtypeBytes(static_cast<ncclDataType_t>(dtype)) : 0;
    NCCLEXT_ARG(esize > 0, "ncclEpGroupGetDispatchWindow: datatype %d unknown", dtype);
    NCCLEXT_ARG(hidden > 0 && hidden * (int64_t)esize == v.rowStride,
                "ncclEpGroupGetDispatchWindow: hidden %lld x %zu bytes is not the window's row of max_token_bytes %d",
                (long long)hidden, esize, v.rowStride);
    *tokens = NCCL_EP_TENSOR_INIT;
    tokens->ndim = 2;
    tokens->datatype = static_cast<ncclDataType_t>(dtype);
    tokens->data = v.peers.mine + v.wl.dispRows;
    tokens->sizes[0] = v.recvCap;
    tokens->sizes[1] = hidden;
    return ncclSuccess;
  });
}

ncclResult_t ncclEpHandleGetMaxRecvRows(ncclEpHandle_t handle, int64_t* rows) {
  ncclext::clearLastError();
  return ncclext::guardAbi("ncclEpHandleGetMaxRecvRows", [&]() -> ncclResult_t {
    NCCLEXT_CHECK(checkHandle(handle, "ncclEpHandleGetMaxRecvRows"));
    NCCLEXT_ARG(rows != nullptr, "ncclEpHandleGetMaxRecvRows: rows is NULL");
    *rows = handle->maxRecvRows;
    return ncclSuccess;
  });
}

ncclResult_t ncclEpDispatch(ncclEpHandle_t handle, const ncclEpDispatchInputs_t* inputs,
                            const ncclEpDispatchOutputs_t* outputs, const ncclEpLayoutInfo_t* layout_info,
                            const ncclEpDispatchConfig_t* config, cudaStream_t stream) {
  ncclext::clearLastError();
  return ncclext::guardAbi("ncclEpDispatch", [&]() -> ncclResult_t {
    NCCLEXT_CHECK(checkHandle(handle, "ncclEpDispatch"));
    ncclEpGroup* g = handle->group;
    NCCLEXT_CHECK(g->asyncError("ncclEpDispatch"));
    ncclEpDispatchInputs_t givenInputs;  // the caller's layout, any known one, with what it lacks absent
    NCCLEXT_CHECK(readVersioned(inputs, {NCCL_EP_DISPATCH_INPUTS_V1_SIZE, sizeof(ncclEpDispatchInputs_t)}, "inputs",
                                "NCCL_EP_DISPATCH_INPUTS_INIT", &givenInputs));
    inputs = &givenInputs;
    ncclEpDispatchOutputs_t givenOutputs;
    NCCLEXT_CHECK(readVersioned(outputs, {NCCL_EP_DISPATCH_OUTPUTS_V1_SIZE, sizeof(ncclEpDispatchOutputs_t)},
                                "outputs", "NCCL_EP_DISPATCH_OUTPUTS_INIT", &givenOutputs));
    outputs = &givenOutputs;
    ncclEpDispatchConfig_t given;  // the caller's layout, any known one, with what it lacks zero
    if (config) {
      NCCLEXT_CHECK(readVersioned(config, {NCCL_EP_DISPATCH_CONFIG_V1_SIZE, sizeof(ncclEpDispatchConfig_t)}, "config",
                                  "NCCL_EP_DISPATCH_CONFIG_INIT", &given));
      config = &given;
      NCCLEXT_ARG(config->global_expert_ids == 0 || config->global_expert_ids == 1,
                  "config.global_expert_ids %d: 0 (local ids) or 1", config->global_expert_ids);
    }
    if (g->view.lowLatency) return dispatchLowLatency(handle, inputs, outputs, layout_info, config, stream);
    NCCLEXT_CHECK(checkLayoutInfo(layout_info, g));  // accepted for API compatibility; HT reports at handle time
    NCCLEXT_ARG(!config || !config->round_scale, "config.round_scale is for Low-Latency fp8 quantisation");
    NCCLEXT_USAGE(!config || !config->send_only, "config.send_only is for the Low-Latency mode");
    const int T = handle->view.numTokens, K = handle->topk;
    const ncclEpTensor_t& x = inputs->tokens;
    NCCLEXT_CHECK(checkTensor(x, "inputs.tokens", 2,
                              {ncclBfloat16, ncclFloat16, ncclFloat32, ncclFloat8e4m3, ncclUint8}, {T, -1}));
    NCCLEXT_CHECK(checkAligned(x, "inputs.tokens"));
    NCCLEXT_ARG(!present(outputs->src_info),
                "outputs.src_info is a Low-Latency output (FLAT rows are in source order)");
    NCCLEXT_ARG(!present(outputs->recv_wait_cycles), "outputs.recv_wait_cycles is a Low-Latency output");
    NCCLEXT_ARG(!present(inputs->global_scale),
                "inputs.global_scale is for Low-Latency NVFP4 quantisation (High-Throughput forwards uint8 rows)");
    const int64_t H = x.sizes[1];
    NCCLEXT_ARG(H <= g->config.max_token_bytes, "inputs.tokens: hidden %lld exceeds max_token_bytes %d", (long long)H,
                g->config.max_token_bytes);  // before the product below, which could wrap
    const int64_t rowBytes = H * (int64_t)dtypeBytes(x.datatype);
    NCCLEXT_ARG(rowBytes % 16 == 0 && rowBytes > 0,
                "inputs.tokens: a row of %lld bytes is not a positive multiple of 16", (long long)rowBytes);
    NCCLEXT_ARG(rowBytes <= g->config.max_token_bytes, "inputs.tokens: a row of %lld bytes exceeds max_token_bytes %d",
                (long long)rowBytes, g->config.max_token_bytes);
    // Quantised tokens travel with their scales as the caller lays them out: S 4-byte values a row, fp32 or int32
    // (per 128 columns, per token, DeepEP's packed UE8M0, or an fp4 format's block scales packed four bytes to a
    // value), copied bit for bit beside the row. fp8 rows need them; rows of any other dtype may carry such words
    // too (opaque bytes' block scales, or a caller's per-token side words: the V2 drop-in's routing rows).
    const bool fp8 = x.datatype == ncclFloat8e4m3;
    if (present(inputs->topk_weights))
      NCCLEXT_CHECK(checkTensor(inputs->topk_weights, "inputs.topk_weights", 2, {ncclFloat32}, {T, K}));
    int nScales = 0;
    ncclDataType_t scaleType = ncclFloat32;
    if (present(inputs->scales)) {
      NCCLEXT_CHECK(checkTensor(inputs->scales, "inputs.scales", 2, {ncclFloat32, ncclInt32}, {T, -1}));
      NCCLEXT_ARG(inputs->scales.sizes[1] >= 1 && inputs->scales.sizes[1] <= g->view.meta.maxScales,
                  "inputs.scales: %lld a row; from 1 to the group's %d (max_token_bytes / 128)",
                  (long long)inputs->scales.sizes[1], g->view.meta.maxScales);
      nScales = (int)inputs->scales.sizes[1];
      scaleType = inputs->scales.datatype;
    } else {
      NCCLEXT_ARG(!fp8, "fp8 tokens need inputs.scales [T, S] fp32 or int32 (e.g. hidden/128 fp32, or hidden/512 "
                        "int32 of packed UE8M0)");
    }
    int64_t need = 0;
    NCCLEXT_CHECK(rowsNeeded(handle, &need));
    const ncclEpTensor_t& y = outputs->tokens;
    NCCLEXT_CHECK(checkTensor(y, "outputs.tokens", 2, {x.datatype}, {-1, H}));
    NCCLEXT_CHECK(checkAligned(y, "outputs.tokens"));
    NCCLEXT_ARG(y.sizes[0] >= need, "outputs.tokens has %lld rows; this handle needs %lld (%s sizing)",
                (long long)y.sizes[0], (long long)need,
                handle->config.sizing == NCCL_EP_SIZING_EXACT ? "exact" : "worst-case");
    // Zero-copy: outputs.tokens is the window (max_recv_rows_per_rank rows); the other outputs have the handle's
    // rows (ncclEpHandleGetRecvRows or GetMaxRecvRows), which the window's rows cover.
    const bool inPlace = inWindow(g, y.data);
    NCCLEXT_USAGE(inPlace || g->config.zero_copy != NCCL_EP_ZERO_COPY_ON,
                  "zero_copy ON: outputs.tokens must be ncclEpGroupGetDispatchWindow's tensor");
    const int64_t N = inPlace ? need : y.sizes[0];
    const bool flat = handle->layout == NCCL_EP_LAYOUT_FLAT;
    if (present(outputs->topk_weights)) {
      if (flat)
        NCCLEXT_CHECK(checkTensor(outputs->topk_weights, "outputs.topk_weights", 2, {ncclFloat32}, {N, K}));
      else
        NCCLEXT_CHECK(checkTensor(outputs->topk_weights, "outputs.topk_weights", 1, {ncclFloat32}, {N}));
    }
    if (present(outputs->topk_idx)) {
      NCCLEXT_USAGE(flat, "outputs.topk_idx is for the FLAT layout (EXPERT_MAJOR rows are grouped by expert)");
      NCCLEXT_CHECK(checkTensor(outputs->topk_idx, "outputs.topk_idx", 2, {ncclInt32}, {N, K}));
    }
    if (nScales) {
      NCCLEXT_ARG(present(outputs->scales), "inputs.scales given: outputs.scales [N, %d] of their dtype are needed",
                  nScales);
      NCCLEXT_CHECK(checkTensor(outputs->scales, "outputs.scales", 2, {scaleType}, {N, nScales}));
    } else {
      NCCLEXT_ARG(!present(outputs->scales), "outputs.scales come with inputs.scales");
    }
    // Zero-copy: outputs.tokens in my window is ncclEpGroupGetDispatchWindow's tensor, where the rows land already.
    if (inPlace) {
      NCCLEXT_USAGE(y.data == g->view.peers.mine + g->view.wl.dispRows && g->view.recvCap > 0,
                    "outputs.tokens lies in the group's window: only ncclEpGroupGetDispatchWindow's tensor may");
      NCCLEXT_USAGE(flat, "outputs.tokens from ncclEpGroupGetDispatchWindow: FLAT handles only (EXPERT_MAJOR rows "
                          "are ordered by expert, not as they land)");
      NCCLEXT_ARG(rowBytes == g->view.rowStride,
                  "outputs.tokens from ncclEpGroupGetDispatchWindow: rows of %lld bytes; the window's are %d",
                  (long long)rowBytes, g->view.rowStride);
    }
    ncclep::DispatchCall c{};
    setDispatchTensors(&c, inputs, outputs);
    c.rowsInPlace = inPlace;
    c.rowBytes = (int)rowBytes;
    c.nScales = nScales;
    c.idBase = config && config->global_expert_ids ? g->view.rank * g->view.localExperts : 0;
    // One CTA per SM of the budget: its first half a sender (rows over NVLink, the long pole), its second half a
    // receiver (the local copies: own rows and staged rows; every SM, since the peers' token counts are not known
    // here). Senders: as few as keep my chunks balanced. Alone, both halves send.
    const int sms = callSms(g, config ? config->num_sms : 0);
    const int chunks = (T + ncclep::kChunkTokens - 1) / ncclep::kChunkTokens;
    if (g->view.nRanks == 1) {
      c.nSenders = 2 * balancedCtas(sms, (chunks + 1) / 2);
      c.nReceivers = 0;
    } else {
      c.nSenders = balancedCtas(sms, chunks);
      c.nReceivers = sms;
    }
    return ncclep::htDispatch(handle, c, stream);
  });
}

ncclResult_t ncclEpCombine(ncclEpHandle_t handle, const ncclEpCombineInputs_t* inputs,
                           const ncclEpCombineOutputs_t* outputs, const ncclEpCombineConfig_t* config,
                           cudaStream_t stream) {
  ncclext::clearLastError();
  return ncclext::guardAbi("ncclEpCombine", [&]() -> ncclResult_t {
    NCCLEXT_CHECK(checkHandle(handle, "ncclEpCombine"));
    ncclEpGroup* g = handle->group;
    NCCLEXT_CHECK(g->asyncError("ncclEpCombine"));
    ncclEpCombineInputs_t givenInputs;  // the caller's layout, any known one, with what it lacks absent
    NCCLEXT_CHECK(readVersioned(inputs, {NCCL_EP_COMBINE_INPUTS_V1_SIZE, sizeof(ncclEpCombineInputs_t)}, "inputs",
                                "NCCL_EP_COMBINE_INPUTS_INIT", &givenInputs));
    inputs = &givenInputs;
    ncclEpCombineOutputs_t givenOutputs;
    NCCLEXT_CHECK(readVersioned(outputs, {NCCL_EP_COMBINE_OUTPUTS_V1_SIZE, sizeof(ncclEpCombineOutputs_t)},
                                "outputs", "NCCL_EP_COMBINE_OUTPUTS_INIT", &givenOutputs));
    outputs = &givenOutputs;
    if (config) CHECK_HEADER(config, ncclEpCombineConfig_t, NCCL_EP_COMBINE_CONFIG_INIT);
    if (g->view.lowLatency) return combineLowLatency(handle, inputs, outputs, config, stream);
    NCCLEXT_USAGE(!config || !config->send_only, "config.send_only is for the Low-Latency mode");
    NCCLEXT_ARG(!present(inputs->topk_weights), "inputs.topk_weights at combine are for the Low-Latency mode");
    NCCLEXT_ARG(!present(outputs->recv_wait_cycles), "outputs.recv_wait_cycles is a Low-Latency output");
    NCCLEXT_USAGE(!present(outputs->missing_experts) || g->view.recvCap > 0,
                  "outputs.missing_experts is for Low-Latency groups with enable_mask and High-Throughput groups with "
                  "max_recv_rows_per_rank");
    const ncclEpTensor_t& x = inputs->tokens;
    NCCLEXT_CHECK(checkTensor(x, "inputs.tokens", 2, {ncclBfloat16, ncclFloat16, ncclFloat32}, {-1, -1}));
    NCCLEXT_CHECK(checkAligned(x, "inputs.tokens"));
    // The dispatch window (ncclEpGroupGetDispatchWindow) is no combine input: a peer done with its own combine may
    // begin its next dispatch, and write there, while this combine still reads.
    NCCLEXT_USAGE(!inWindow(g, x.data),
                  "inputs.tokens lies in the group's window (the dispatch window): a peer's next dispatch may "
                  "overwrite it while combine reads it; combine the experts' outputs, or a copy");
    const int64_t H = x.sizes[1];
    NCCLEXT_ARG(H <= g->config.max_token_bytes, "inputs.tokens: hidden %lld exceeds max_token_bytes %d", (long long)H,
                g->config.max_token_bytes);  // before the product below, which could wrap
    const int64_t rowBytes = H * (int64_t)dtypeBytes(x.datatype);
    NCCLEXT_ARG(rowBytes % 16 == 0 && rowBytes > 0 && rowBytes <= g->config.max_token_bytes,
                "inputs.tokens: a row of %lld bytes must be a multiple of 16 in [16, max_token_bytes %d]",
                (long long)rowBytes, g->config.max_token_bytes);
    int64_t need = 0;
    NCCLEXT_CHECK(rowsNeeded(handle, &need));
    NCCLEXT_ARG(x.sizes[0] >= need, "inputs.tokens has %lld rows; this handle's dispatch output has %lld",
                (long long)x.sizes[0], (long long)need);
    if (present(inputs->bias)) {
      NCCLEXT_CHECK(
          checkTensor(inputs->bias, "inputs.bias", 2, {x.datatype, ncclFloat32}, {handle->view.numTokens, H}));
      NCCLEXT_CHECK(checkAligned(inputs->bias, "inputs.bias"));
    }
    NCCLEXT_CHECK(checkTensor(outputs->tokens, "outputs.tokens", 2, {x.datatype}, {handle->view.numTokens, H}));
    NCCLEXT_CHECK(checkAligned(outputs->tokens, "outputs.tokens"));
    // (the owner's own EXPERT_MAJOR part passes through the output row before the sum reads the bias)
    const size_t T = (size_t)handle->view.numTokens;
    NCCLEXT_ARG(!present(inputs->bias) || !overlaps(inputs->bias.data, T * H * dtypeBytes(inputs->bias.datatype),
                                                    outputs->tokens.data, T * rowBytes),
                "inputs.bias overlaps outputs.tokens: give the bias in a tensor of its own");
    ncclep::CombineCall c{};
    c.bias = static_cast<const char*>(inputs->bias.data);  // NULL when absent
    c.biasF32 = present(inputs->bias) && inputs->bias.datatype == ncclFloat32;
    c.in = static_cast<const char*>(x.data);
    c.out = static_cast<char*>(outputs->tokens.data);
    c.rowBytes = (int)rowBytes;
    c.dtype = x.datatype;
    if (present(outputs->missing_experts)) {
      NCCLEXT_CHECK(
          checkTensor(outputs->missing_experts, "outputs.missing_experts", 1, {ncclInt32}, {handle->view.numTokens}));
      c.missing = static_cast<int*>(outputs->missing_experts.data);
    }
    // Receivers reduce several rows per token for this rank's own tokens; senders push rows back to their owners.
    splitCombine(g, callSms(g, config ? config->num_sms : 0), handle->view.numTokens, &c.nSenders, &c.nReceivers);
    return ncclep::htCombine(handle, c, stream);
  });
}

ncclResult_t ncclEpComplete(ncclEpHandle_t handle, const ncclEpCompleteConfig_t* config, cudaStream_t stream) {
  ncclext::clearLastError();
  return ncclext::guardAbi("ncclEpComplete", [&]() -> ncclResult_t {
    NCCLEXT_CHECK(checkHandle(handle, "ncclEpComplete"));
    if (config) CHECK_HEADER(config, ncclEpCompleteConfig_t, NCCL_EP_COMPLETE_CONFIG_INIT);
    ncclEpGroup* g = handle->group;
    if (!g->view.lowLatency) return ncclSuccess;  // High-Throughput calls are never split into send and receive halves
    NCCLEXT_CHECK(g->asyncError("ncclEpComplete"));
    const int kind = handle->pendingKind;
    NCCLEXT_USAGE(kind >= 0, "ncclEpComplete: the handle has no send-only call awaiting completion");
    const std::deque<ncclEpHandle*>& open = g->ll.pending[kind];
    NCCLEXT_USAGE(open.front() == handle,
                  "ncclEpComplete: the send-only %s of handle %p was issued first: calls of a kind complete in the "
                  "order they were issued",
                  kindName(kind), (const void*)open.front());
    return ncclep::llComplete(handle, stream);
  });
}

static ncclResult_t checkMaskGroup(ncclEpGroup_t group, const char* what) {
  NCCLEXT_CHECK(checkGroup(group, what));
  NCCLEXT_USAGE(group->view.mask != nullptr, "%s: the group was created without enable_mask", what);
  return ncclSuccess;
}

ncclResult_t ncclEpMaskQuery(ncclEpGroup_t group, int* mask_dev, cudaStream_t stream) {
  ncclext::clearLastError();
  return ncclext::guardAbi("ncclEpMaskQuery", [&]() -> ncclResult_t {
    NCCLEXT_CHECK(checkMaskGroup(group, "ncclEpMaskQuery"));
    NCCLEXT_ARG(mask_dev != nullptr, "ncclEpMaskQuery: mask_dev is NULL");
    NCCLEXT_CUDA(cudaMemcpyAsync(mask_dev, group->view.mask, group->view.nRanks * sizeof(int), cudaMemcpyDeviceToDevice,
                                 stream));
    return ncclSuccess;
  });
}

ncclResult_t ncclEpMaskUpdate(ncclEpGroup_t group, const int* mask_host, cudaStream_t stream) {
  ncclext::clearLastError();
  return ncclext::guardAbi("ncclEpMaskUpdate", [&]() -> ncclResult_t {
    NCCLEXT_CHECK(checkMaskGroup(group, "ncclEpMaskUpdate"));
    NCCLEXT_ARG(mask_host != nullptr, "ncclEpMaskUpdate: mask_host is NULL");
    return ncclep::llSetMask(group, mask_host, stream);
  });
}

ncclResult_t ncclEpMaskClean(ncclEpGroup_t group, cudaStream_t stream) {
  ncclext::clearLastError();
  return ncclext::guardAbi("ncclEpMaskClean", [&]() -> ncclResult_t {
    NCCLEXT_CHECK(checkMaskGroup(group, "ncclEpMaskClean"));
    for (int kind = 0; kind < 2; kind++)
      NCCLEXT_USAGE(group->ll.pending[kind].empty(), "ncclEpMaskClean: a send-only %s awaits ncclEpComplete",
                    kindName(kind));
    return ncclep::llMaskClean(group, stream);
  });
}

}  // extern "C"
