// The only file that touches nccl_m2n.h's public structs: validate, translate, call, record the last error.
#include "nccl_m2n/include/nccl_m2n.h"
#include "nccl_m2n/include/nccl_m2n_testing.h"

#include <algorithm>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "common/checks.h"
#include "common/device_status.h"
#include "common/version.h"
#include "common/env.h"
#include "nccl_m2n/src/executor.h"
#include "nccl_m2n/src/registry.h"
#include "nccl_m2n/src/plan.h"
#include "nccl_m2n/src/quantize.h"

struct ncclM2nHostPlan {
  std::vector<ncclM2nTransfer_t> lists[3];
  ncclM2nPlanInfo_t info;
};

namespace {

// The planner keeps O(nRanks) state per plan (about 80 bytes a rank) even for an empty batch: an unbounded nRanks
// (INT_MAX) would allocate ~170 GB. 2^20 ranks is beyond any communicator and costs ~80 MB.
constexpr int kMaxPlanRanks = 1 << 20;
// The plan's byte counts (info.bytes, totalBytes, interDomainBytes, per-rank loads) are int64 sums of what the
// destination positions receive, each at most its whole tensor: a batch whose sum of (destination positions x
// tensor bytes) stays within this bound cannot overflow any of them.
constexpr int64_t kMaxPlanBytes = int64_t(1) << 62;

ncclResult_t translateLayout(const ncclM2nLayout_t* in, const char* side, ncclm2n::Layout* out) {
  NCCLEXT_ARG(in != nullptr, "%s layout is NULL", side);
  NCCLEXT_ARG(in->size == sizeof(ncclM2nLayout_t) && in->magic == NCCL_M2N_MAGIC,
              "%s layout: size %zu / magic 0x%x do not match this library (%zu / 0x%x); use "
              "NCCL_M2N_LAYOUT_INITIALIZER",
              side, in->size, in->magic, sizeof(ncclM2nLayout_t), NCCL_M2N_MAGIC);
  NCCLEXT_ARG(in->ndims >= 1 && in->ndims <= NCCL_M2N_MAX_TENSOR_DIMS, "%s layout: tensor rank %d not in [1, %d]", side,
              in->ndims, NCCL_M2N_MAX_TENSOR_DIMS);
  NCCLEXT_ARG(in->globalShape != nullptr, "%s layout: globalShape is NULL", side);
  const ncclM2nMesh_t* m = in->mesh;
  NCCLEXT_ARG(m != nullptr, "%s layout: mesh is NULL", side);
  NCCLEXT_ARG(m->size == sizeof(ncclM2nMesh_t) && m->magic == NCCL_M2N_MAGIC,
              "%s mesh: size/magic do not match this library; use NCCL_M2N_MESH_INITIALIZER", side);
  NCCLEXT_ARG(m->ndims >= 1 && m->ndims <= NCCL_M2N_MAX_MESH_DIMS, "%s mesh: rank %d not in [1, %d]", side, m->ndims,
              NCCL_M2N_MAX_MESH_DIMS);
  NCCLEXT_ARG(m->dims != nullptr && m->ranks != nullptr, "%s mesh: dims or ranks is NULL", side);
  int64_t meshSize = 1;
  for (int a = 0; a < m->ndims; a++) {
    NCCLEXT_ARG(m->dims[a] >= 1 && m->dims[a] <= (1 << 24), "%s mesh: dims[%d] = %d not in [1, 2^24]", side, a,
                m->dims[a]);
    meshSize *= m->dims[a];
    NCCLEXT_ARG(meshSize <= (1 << 24), "%s mesh: more than 2^24 positions", side);
  }
  out->globalShape.assign(in->globalShape, in->globalShape + in->ndims);
  const int dtype = ncclext::storedInt(in->dtype);
  NCCLEXT_ARG(ncclext::isNcclDataType(dtype), "%s layout: dtype %d is not an NCCL data type", side, dtype);
  out->dtype = static_cast<ncclDataType_t>(dtype);
  out->mesh.dims.assign(m->dims, m->dims + m->ndims);
  out->mesh.ranks.assign(m->ranks, m->ranks + meshSize);
  out->placements.clear();
  out->boxes.clear();
  if (in->boxes) {
    for (int64_t p = 0; p < meshSize; p++) {
      ncclm2n::Box b;
      b.ndims = in->ndims;
      for (int d = 0; d < in->ndims; d++) {
        b.offset[d] = in->boxes[p].offset[d];
        b.shape[d] = in->boxes[p].shape[d];
      }
      out->boxes.push_back(b);
    }
  } else {
    NCCLEXT_ARG(in->placements != nullptr, "%s layout: placements is NULL (and no explicit boxes)", side);
    out->placements.assign(in->placements, in->placements + m->ndims);
  }
  out->strides.clear();
  if (in->localStrides) out->strides.assign(in->localStrides, in->localStrides + meshSize * in->ndims);
  return ncclSuccess;
}

ncclResult_t checkLayout(const ncclm2n::Layout& l, int nRanks, const char* what) {
  std::string why;
  NCCLEXT_ARG(ncclm2n::validateLayout(l, nRanks, &why), "%s: %s", what, why.c_str());
  return ncclSuccess;
}

ncclM2nTransfer_t toPublic(const ncclm2n::Transfer& t) {
  ncclM2nTransfer_t o = {};
  o.tensor = (int)t.tensor;
  o.srcRank = t.src;
  o.dstRank = t.dst;
  o.srcOffset = t.srcOffset;
  o.dstOffset = t.dstOffset;
  o.ndims = t.ndims;
  for (int d = 0; d < t.ndims; d++) {
    o.extent[d] = t.extent[d];
    o.srcStride[d] = t.srcStride[d];
    o.dstStride[d] = t.dstStride[d];
  }
  return o;
}

// The public batch as the planner's Problem (tensors only). Structural errors (NULL, sizes, magic) fail here. An
// entry with both layouts NULL is the scales of the tensor before it (quantize.h): marked in `isScales`, its layouts
// left for rewriteFp8.
ncclResult_t translateBatch(int nTensors, const ncclM2nTensorSpec_t* tensors, ncclm2n::Problem* p,
                            std::vector<char>* isScales) {
  p->tensors.resize(nTensors);
  isScales->assign(nTensors, 0);
  for (int t = 0; t < nTensors; t++) {
    ncclm2n::TensorPair& tp = p->tensors[t];
    tp.name = tensors[t].name ? tensors[t].name : "";
    if (tensors[t].src == nullptr && tensors[t].dst == nullptr) {
      (*isScales)[t] = 1;
      continue;
    }
    char side[96];
    snprintf(side, sizeof(side), "tensor %d (%s) source", t, tp.name.c_str());
    NCCLEXT_CHECK(translateLayout(tensors[t].src, side, &tp.src));
    snprintf(side, sizeof(side), "tensor %d (%s) destination", t, tp.name.c_str());
    NCCLEXT_CHECK(translateLayout(tensors[t].dst, side, &tp.dst));
  }
  return ncclSuccess;
}

// The batch's meaning: layouts, coverage, and a total size the plan's byte counts can hold. False with `why`.
bool checkBatch(const ncclm2n::Problem& p, std::string* why) {
  if (!ncclm2n::validateProblem(p, why)) return false;
  __int128 batchBytes = 0;  // valid layouts: < 2^62 elements x 8 bytes x 2^24 positions per tensor
  for (const ncclm2n::TensorPair& tp : p.tensors) {
    __int128 elements = 1;
    for (int64_t n : tp.dst.globalShape) elements *= n;
    batchBytes += elements * (int64_t)ncclm2n::elementSize(tp.dst.dtype) * tp.dst.mesh.size();
    if (batchBytes > kMaxPlanBytes) {
      *why = "the batch delivers more than 2^62 bytes (up to tensor " +
             std::to_string((int)(&tp - p.tensors.data())) + " (" + tp.name + ")): its byte counts would overflow";
      return false;
    }
  }
  return true;
}

}  // namespace

extern "C" {

ncclResult_t ncclM2nGetVersion(int* version) {
  ncclext::clearLastError();
  return ncclext::guardAbi("ncclM2nGetVersion", [&]() -> ncclResult_t {
    NCCLEXT_ARG(version != nullptr, "ncclM2nGetVersion: version is NULL");
    *version = NCCL_M2N_VERSION_CODE;
    return ncclSuccess;
  });
}

ncclResult_t ncclM2nCheckNcclRuntime(int* builtVersion, int* loadedVersion) {
  ncclext::clearLastError();
  return ncclext::guardAbi("ncclM2nCheckNcclRuntime",
                           [&]() -> ncclResult_t { return ncclext::checkNcclRuntime(builtVersion, loadedVersion); });
}

const char* ncclM2nGetLastError(void) { return ncclext::lastError(); }

ncclResult_t ncclM2nLayoutValidate(const ncclM2nLayout_t* layout, int nRanks) {
  ncclext::clearLastError();
  return ncclext::guardAbi("ncclM2nLayoutValidate", [&]() -> ncclResult_t {
    NCCLEXT_ARG(nRanks >= 0, "ncclM2nLayoutValidate: nRanks %d < 0", nRanks);
    ncclm2n::Layout l;
    NCCLEXT_CHECK(translateLayout(layout, "ncclM2nLayoutValidate", &l));
    return checkLayout(l, nRanks, "ncclM2nLayoutValidate");
  });
}

ncclResult_t ncclM2nLayoutLocalBox(const ncclM2nLayout_t* layout, int rank, int64_t* offset, int64_t* shape,
                                   int* holds) {
  ncclext::clearLastError();
  return ncclext::guardAbi("ncclM2nLayoutLocalBox", [&]() -> ncclResult_t {
    NCCLEXT_ARG(offset != nullptr && shape != nullptr && holds != nullptr,
                "ncclM2nLayoutLocalBox: offset, shape or holds is NULL");
    NCCLEXT_ARG(rank >= 0, "ncclM2nLayoutLocalBox: rank %d < 0", rank);
    ncclm2n::Layout l;
    NCCLEXT_CHECK(translateLayout(layout, "ncclM2nLayoutLocalBox", &l));
    NCCLEXT_CHECK(checkLayout(l, 0, "ncclM2nLayoutLocalBox"));
    const ncclm2n::ShardGrid g(l);
    *holds = 0;
    for (int d = 0; d < l.ndims(); d++) offset[d] = shape[d] = 0;
    for (int pos = 0; pos < l.mesh.size(); pos++) {
      if (l.mesh.ranks[pos] != rank) continue;
      const ncclm2n::Box& b = g.boxOfPosition(pos);
      for (int d = 0; d < l.ndims(); d++) {
        offset[d] = b.offset[d];
        shape[d] = b.shape[d];
      }
      *holds = 1;
      break;
    }
    return ncclSuccess;
  });
}

ncclResult_t ncclM2nHostPlanCreate(ncclM2nHostPlan_t* plan, int rank, int nTensors, const ncclM2nTensorSpec_t* tensors,
                                   const ncclM2nPlanConfig_t* config) {
  ncclext::clearLastError();
  // Planning allocates in proportion to the batch: std::bad_alloc becomes ncclSystemError (guardAbi).
  return ncclext::guardAbi("ncclM2nHostPlanCreate", [&]() -> ncclResult_t {
    NCCLEXT_ARG(plan != nullptr, "ncclM2nHostPlanCreate: plan is NULL");
    *plan = nullptr;
    NCCLEXT_ARG(config != nullptr, "ncclM2nHostPlanCreate: config is NULL");
    NCCLEXT_ARG(config->size == sizeof(ncclM2nPlanConfig_t) && config->magic == NCCL_M2N_MAGIC,
                "ncclM2nHostPlanCreate: config size/magic do not match; use NCCL_M2N_PLAN_CONFIG_INITIALIZER");
    NCCLEXT_ARG(config->nRanks >= 1 && config->nRanks <= kMaxPlanRanks,
                "ncclM2nHostPlanCreate: nRanks %d not in [1, %d]", config->nRanks, kMaxPlanRanks);
    NCCLEXT_ARG(rank >= 0 && rank < config->nRanks, "ncclM2nHostPlanCreate: rank %d not in [0, %d)", rank,
                config->nRanks);
    NCCLEXT_ARG(config->ranksPerDomain >= 0, "ncclM2nHostPlanCreate: ranksPerDomain %d < 0", config->ranksPerDomain);
    NCCLEXT_ARG(config->fp8BlockRows == 0 || config->fp8BlockRows == 1 || config->fp8BlockRows == 128,
                "ncclM2nHostPlanCreate: fp8BlockRows %d: 1 (or 0) or 128", config->fp8BlockRows);
    NCCLEXT_ARG(nTensors >= 0 && (nTensors == 0 || tensors != nullptr), "ncclM2nHostPlanCreate: %d tensors at %p",
                nTensors, (const void*)tensors);
    ncclm2n::Problem p;
    p.nRanks = config->nRanks;
    p.options.ranksPerDomain = config->ranksPerDomain;
    if (config->domainOfRank)
      p.options.domainOfRank.assign(config->domainOfRank, config->domainOfRank + config->nRanks);
    std::vector<char> isScales;
    NCCLEXT_CHECK(translateBatch(nTensors, tensors, &p, &isScales));
    std::string why;
    std::vector<ncclm2n::Fp8Tensor> fp8;
    NCCLEXT_ARG(ncclm2n::rewriteFp8(&p, isScales, std::max(1, config->fp8BlockRows), &fp8, &why),
                "ncclM2nHostPlanCreate: %s", why.c_str());
    NCCLEXT_ARG(checkBatch(p, &why), "ncclM2nHostPlanCreate: %s", why.c_str());

    ncclm2n::RankPlan mine;
    ncclm2n::PlanStats stats;
    ncclm2n::planRank(p, rank, &mine, &stats);
    std::unique_ptr<ncclM2nHostPlan> hp(new ncclM2nHostPlan());
    const std::vector<ncclm2n::Transfer>* lists[3] = {&mine.sends, &mine.recvs, &mine.copies};
    ncclM2nPlanInfo_t& info = hp->info;
    info = ncclM2nPlanInfo_t();
    for (int k = 0; k < 3; k++) {
      hp->lists[k].reserve(lists[k]->size());
      for (const ncclm2n::Transfer& t : *lists[k]) {
        hp->lists[k].push_back(toPublic(t));
        info.bytes[k] += t.elements() * (int64_t)ncclm2n::elementSize(p.tensors[t.tensor].dst.dtype);
      }
      info.counts[k] = (int64_t)lists[k]->size();
    }
    info.metadataHash = stats.metadataHash;
    info.planHash = stats.planHash;
    info.totalBytes = stats.totalBytes;
    info.interDomainBytes = stats.interDomainBytes;
    info.maxSourceLoad = stats.maxSourceLoad();
    info.meanSourceLoad = stats.meanSourceLoad();
    *plan = hp.release();
    return ncclSuccess;
  });
}

ncclResult_t ncclM2nHostPlanGetInfo(ncclM2nHostPlan_t plan, ncclM2nPlanInfo_t* info) {
  ncclext::clearLastError();
  return ncclext::guardAbi("ncclM2nHostPlanGetInfo", [&]() -> ncclResult_t {
    NCCLEXT_ARG(plan != nullptr && info != nullptr, "ncclM2nHostPlanGetInfo: plan or info is NULL");
    *info = plan->info;
    return ncclSuccess;
  });
}

ncclResult_t ncclM2nHostPlanGetTransfers(ncclM2nHostPlan_t plan, ncclM2nTransferKind_t kind,
                                         const ncclM2nTransfer_t** transfers, int64_t* count) {
  ncclext::clearLastError();
  return ncclext::guardAbi("ncclM2nHostPlanGetTransfers", [&]() -> ncclResult_t {
    NCCLEXT_ARG(plan != nullptr && transfers != nullptr && count != nullptr,
                "ncclM2nHostPlanGetTransfers: plan, transfers or count is NULL");
    NCCLEXT_ARG(kind >= ncclM2nSends && kind <= ncclM2nLocalCopies, "ncclM2nHostPlanGetTransfers: kind %d unknown",
                (int)kind);
    *transfers = plan->lists[kind].data();
    *count = (int64_t)plan->lists[kind].size();
    return ncclSuccess;
  });
}

ncclResult_t ncclM2nHostPlanDestroy(ncclM2nHostPlan_t plan) {
  ncclext::clearLastError();
  return ncclext::guardAbi("ncclM2nHostPlanDestroy", [&]() -> ncclResult_t {
    delete plan;
    return ncclSuccess;
  });
}

namespace {

// ncclM2nPlanCreate, with virtual ranks when `virt` is set (ncclM2nPlanCreateTesting).
ncclResult_t planCreate(ncclM2nPlan_t* plan, ncclComm_t comm, int nTensors, const ncclM2nTensorSpec_t* tensors,
                        const ncclM2nExecConfig_t* config, ncclext::VirtualDomain* virt, int virtualRank) {
  NCCLEXT_ARG(plan != nullptr, "ncclM2nPlanCreate: plan is NULL");
  *plan = nullptr;
  NCCLEXT_ARG(comm != nullptr, "ncclM2nPlanCreate: comm is NULL");
  NCCLEXT_ARG(config == nullptr || (config->size == sizeof(ncclM2nExecConfig_t) && config->magic == NCCL_M2N_MAGIC),
              "ncclM2nPlanCreate: config size/magic do not match; use NCCL_M2N_EXEC_CONFIG_INITIALIZER");
  NCCLEXT_ARG(config == nullptr || config->timeoutSeconds >= 0, "ncclM2nPlanCreate: timeoutSeconds < 0");
  NCCLEXT_ARG(config == nullptr || config->fp8BlockRows == 0 || config->fp8BlockRows == 1 ||
                  config->fp8BlockRows == 128,
              "ncclM2nPlanCreate: fp8BlockRows %d: 1 (or 0) or 128", config ? config->fp8BlockRows : 0);
  NCCLEXT_ARG(config == nullptr || config->lsa == 0 || config->lsa == 1, "ncclM2nPlanCreate: lsa %d: 0 or 1",
              config ? config->lsa : 0);
  NCCLEXT_ARG(config == nullptr || (config->zeroCopy >= NCCL_M2N_ZERO_COPY_OFF &&
                                    config->zeroCopy <= NCCL_M2N_ZERO_COPY_PUSH),
              "ncclM2nPlanCreate: zeroCopy %d: NCCL_M2N_ZERO_COPY_OFF, _PULL or _PUSH", config ? config->zeroCopy : 0);
  NCCLEXT_ARG(config == nullptr || config->zeroCopy == 0 || config->lsa == 1 || virt,
              "ncclM2nPlanCreate: zeroCopy %d needs lsa = 1 (it moves the streams inside an NVLink domain in place)",
              config ? config->zeroCopy : 0);
  NCCLEXT_ARG(nTensors >= 0 && (nTensors == 0 || tensors != nullptr), "ncclM2nPlanCreate: %d tensors at %p",
              nTensors, (const void*)tensors);
  NCCLEXT_CHECK(ncclext::checkNcclRuntime(nullptr));
  int nRanks = 0;
  NCCLEXT_NCCL(ncclCommCount(comm, &nRanks));
  if (virt) nRanks = virt->size();  // comm: one of its ranks
  ncclm2n::Problem p;
  p.nRanks = nRanks;
  std::vector<char> isScales;
  NCCLEXT_CHECK(translateBatch(nTensors, tensors, &p, &isScales));
  std::string why;
  std::vector<ncclm2n::Fp8Tensor> fp8;
  // A rule broken here fails every rank together (plan creation's agreement), as a checkBatch failure does.
  const int blockRows = config && config->fp8BlockRows > 1 ? config->fp8BlockRows : 1;
  if (ncclm2n::rewriteFp8(&p, isScales, blockRows, &fp8, &why) && !checkBatch(p, &why) && why.empty())
    why = "invalid batch";
  ncclm2n::ExecOptions o;
  if (config && config->stagingBytes) o.stagingBytes = (int64_t)config->stagingBytes;
  o.virt = virt;
  o.virtualRank = virtualRank;
  o.lsa = (config && config->lsa == 1) || virt;  // virtual ranks reach each other only over LSA
  if (config) {
    o.zeroCopy = config->zeroCopy;
    if (o.zeroCopy && !fp8.empty() && why.empty())  // every rank fails together (the batch is the same)
      why = "zeroCopy with fp8 tensors is not supported (their quantised values live in plan-owned scratch)";
  }
  o.timeoutSeconds = config && config->timeoutSeconds > 0 ? config->timeoutSeconds : ncclext::env().timeoutSeconds;
  return ncclm2n::createPlan(comm, std::move(p), std::move(fp8), why, o, plan);
}

}  // namespace

ncclResult_t ncclM2nPlanCreate(ncclM2nPlan_t* plan, ncclComm_t comm, int nTensors, const ncclM2nTensorSpec_t* tensors,
                               const ncclM2nExecConfig_t* config) {
  ncclext::clearLastError();
  return ncclext::guardAbi("ncclM2nPlanCreate", [&]() -> ncclResult_t {
    return planCreate(plan, comm, nTensors, tensors, config, nullptr, 0);
  });
}

ncclResult_t ncclM2nPlanCreateTesting(ncclM2nPlan_t* plan, ncclComm_t comm, int nTensors,
                                      const ncclM2nTensorSpec_t* tensors, const ncclM2nExecConfig_t* config,
                                      const ncclM2nTestingConfig_t* testing) {
  ncclext::clearLastError();
  return ncclext::guardAbi("ncclM2nPlanCreateTesting", [&]() -> ncclResult_t {
    if (plan) *plan = nullptr;
    NCCLEXT_ARG(testing == nullptr || (testing->size == sizeof(ncclM2nTestingConfig_t) &&
                                       testing->magic == NCCL_M2N_MAGIC),
                "ncclM2nPlanCreateTesting: testing size/magic do not match; use NCCL_M2N_TESTING_CONFIG_INITIALIZER");
    ncclext::VirtualDomain* virt = testing && testing->virtualDomain ? &testing->virtualDomain->domain : nullptr;
    const int virtualRank = testing ? testing->virtualRank : 0;
    NCCLEXT_ARG(virt != nullptr || virtualRank == 0, "ncclM2nPlanCreateTesting: virtualRank %d without a virtualDomain",
                virtualRank);
    return planCreate(plan, comm, nTensors, tensors, config, virt, virtualRank);
  });
}

ncclResult_t ncclM2nExecute(ncclM2nPlan_t plan, const void* const* src, void* const* dst, cudaStream_t stream) {
  ncclext::clearLastError();
  return ncclext::guardAbi("ncclM2nExecute", [&]() -> ncclResult_t {
    NCCLEXT_ARG(plan != nullptr, "ncclM2nExecute: plan is NULL");
    return ncclm2n::execute(plan, src, dst, stream);
  });
}

ncclResult_t ncclM2nPlanSetStageHookTesting(ncclM2nPlan_t plan, ncclM2nStageHook_t hook, void* user) {
  ncclext::clearLastError();
  return ncclext::guardAbi("ncclM2nPlanSetStageHookTesting", [&]() -> ncclResult_t {
    NCCLEXT_ARG(plan != nullptr, "ncclM2nPlanSetStageHookTesting: plan is NULL");
    ncclm2n::setStageHook(plan, hook, user);
    return ncclSuccess;
  });
}

ncclResult_t ncclM2nPlanDestroy(ncclM2nPlan_t plan) {
  ncclext::clearLastError();
  return ncclext::guardAbi("ncclM2nPlanDestroy", [&]() -> ncclResult_t { return ncclm2n::destroyPlan(plan); });
}

ncclResult_t ncclM2nVirtualDomainCreate(ncclM2nVirtualDomain_t* domain, int nRanks) {
  ncclext::clearLastError();
  return ncclext::guardAbi("ncclM2nVirtualDomainCreate", [&]() -> ncclResult_t {
    NCCLEXT_ARG(domain != nullptr, "ncclM2nVirtualDomainCreate: domain is NULL");
    *domain = nullptr;
    NCCLEXT_ARG(nRanks >= 1 && nRanks <= ncclext::VirtualDomain::kMaxRanks,
                "ncclM2nVirtualDomainCreate: %d ranks not in [1, %d]", nRanks, ncclext::VirtualDomain::kMaxRanks);
    *domain = new ncclM2nVirtualDomain(nRanks);
    return ncclSuccess;
  });
}

ncclResult_t ncclM2nVirtualDomainDestroy(ncclM2nVirtualDomain_t domain) {
  ncclext::clearLastError();
  return ncclext::guardAbi("ncclM2nVirtualDomainDestroy", [&]() -> ncclResult_t {
    delete domain;
    return ncclSuccess;
  });
}

ncclResult_t ncclM2nPlanGetAsyncError(ncclM2nPlan_t plan) {
  ncclext::clearLastError();
  return ncclext::guardAbi("ncclM2nPlanGetAsyncError", [&]() -> ncclResult_t {
    NCCLEXT_ARG(plan != nullptr, "ncclM2nPlanGetAsyncError: plan is NULL");
    return ncclm2n::asyncError(plan);
  });
}

ncclResult_t ncclM2nCommRetain(ncclComm_t comm, const ncclM2nExecConfig_t* config) {
  ncclext::clearLastError();
  return ncclext::guardAbi("ncclM2nCommRetain", [&]() -> ncclResult_t {
    NCCLEXT_ARG(comm != nullptr, "ncclM2nCommRetain: comm is NULL");
    NCCLEXT_ARG(config == nullptr || (config->size == sizeof(ncclM2nExecConfig_t) && config->magic == NCCL_M2N_MAGIC),
                "ncclM2nCommRetain: config size/magic do not match; use NCCL_M2N_EXEC_CONFIG_INITIALIZER");
    NCCLEXT_ARG(config == nullptr || config->timeoutSeconds >= 0, "ncclM2nCommRetain: timeoutSeconds < 0");
    NCCLEXT_CHECK(ncclext::checkNcclRuntime(nullptr));
    const double budget =
        config && config->timeoutSeconds > 0 ? config->timeoutSeconds : ncclext::env().timeoutSeconds;
    return ncclm2n::retainExchange(comm, budget);
  });
}

ncclResult_t ncclM2nCommRelease(ncclComm_t comm) {
  ncclext::clearLastError();
  return ncclext::guardAbi("ncclM2nCommRelease", [&]() -> ncclResult_t {
    NCCLEXT_ARG(comm != nullptr, "ncclM2nCommRelease: comm is NULL");
    const ncclResult_t plans = ncclm2n::releaseReshardPlans(comm);
    ncclm2n::releaseExchange(comm);
    return plans;
  });
}

ncclResult_t ncclM2nRegister(ncclComm_t comm, void* buffer, size_t bytes, ncclM2nRegistration_t* reg) {
  ncclext::clearLastError();
  return ncclext::guardAbi("ncclM2nRegister", [&]() -> ncclResult_t {
    NCCLEXT_ARG(reg != nullptr, "ncclM2nRegister: reg is NULL");
    *reg = nullptr;
    NCCLEXT_ARG(comm != nullptr, "ncclM2nRegister: comm is NULL");
    NCCLEXT_ARG(buffer != nullptr && bytes > 0, "ncclM2nRegister: buffer %p of %zu bytes", buffer, bytes);
    NCCLEXT_CHECK(ncclext::checkNcclRuntime(nullptr));
    return ncclm2n::registerBuffer(comm, buffer, bytes, reg);
  });
}

ncclResult_t ncclM2nDeregister(ncclM2nRegistration_t reg) {
  ncclext::clearLastError();
  return ncclext::guardAbi("ncclM2nDeregister", [&]() -> ncclResult_t {
    NCCLEXT_ARG(reg != nullptr, "ncclM2nDeregister: reg is NULL");
    return ncclm2n::deregisterBuffer(reg);
  });
}

ncclResult_t ncclM2nReshard(ncclComm_t comm, const ncclM2nTensorSpec_t* spec, const void* src, void* dst,
                            const ncclM2nExecConfig_t* config, cudaStream_t stream) {
  ncclext::clearLastError();
  return ncclext::guardAbi("ncclM2nReshard", [&]() -> ncclResult_t {
    NCCLEXT_ARG(spec != nullptr, "ncclM2nReshard: spec is NULL");
    NCCLEXT_ARG(comm != nullptr, "ncclM2nReshard: comm is NULL");
    NCCLEXT_ARG(config == nullptr || (config->size == sizeof(ncclM2nExecConfig_t) && config->magic == NCCL_M2N_MAGIC),
                "ncclM2nReshard: config size/magic do not match; use NCCL_M2N_EXEC_CONFIG_INITIALIZER");
    NCCLEXT_CHECK(ncclext::checkNcclRuntime(nullptr));
    // The spec's checks before the cache's key follows its pointers (plan creation checks it again on a miss).
    ncclm2n::Problem p;
    NCCLEXT_NCCL(ncclCommCount(comm, &p.nRanks));
    std::vector<char> isScales;
    NCCLEXT_CHECK(translateBatch(1, spec, &p, &isScales));
    return ncclm2n::reshard(comm, *spec, src, dst, config, stream, [&](ncclM2nPlan** plan) {
      return planCreate(plan, comm, 1, spec, config, nullptr, 0);
    });
  });
}

}  // extern "C"
