#include "nccl_m2n/src/registry.h"

#include <cuda_runtime.h>

#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "common/checks.h"
#include "common/domain.h"
#include "common/env.h"
#include "common/nccl_abi.h"
#include "common/status.h"

struct ncclM2nRegistration {
  ncclComm_t comm = nullptr;
  int slot = -1;
};

namespace ncclm2n {
namespace {

struct Slot {
  char* base = nullptr;
  size_t bytes = 0;
  ncclWindow_t window = nullptr;
};

struct Registry {
  std::mutex mu;  // one registration or lookup at a time (its collectives included)
  std::unique_ptr<ncclext::Domain> domain;
  char** devBases = nullptr;  // [kMaxRegistrations][domain size], device: every domain rank's base of each window
  std::vector<Slot> slots = std::vector<Slot>(kMaxRegistrations);
  int live = 0;
  ~Registry() {
    if (devBases) cudaFree(devBases);
  }
};

std::mutex registriesMu;
std::map<ncclComm_t, std::shared_ptr<Registry>>& registries() {
  static std::map<ncclComm_t, std::shared_ptr<Registry>> m;
  return m;
}

std::shared_ptr<Registry> registryOf(ncclComm_t comm, bool create) {
  std::lock_guard<std::mutex> lock(registriesMu);
  auto it = registries().find(comm);
  if (it != registries().end()) return it->second;
  if (!create) return nullptr;
  auto r = std::make_shared<Registry>();
  registries()[comm] = r;
  return r;
}

// The first registration on comm: its NVLink domains (COLLECTIVE over comm) and the device table of the
// registrations' window bases, zeroed.
ncclResult_t openDomain(ncclComm_t comm, Registry* r) {
  ncclext::DomainOptions opts;
  opts.timeoutSeconds = ncclext::env().timeoutSeconds;
  NCCLEXT_CHECK(ncclext::Domain::create(comm, opts, &r->domain));
  const size_t tableBytes = sizeof(char*) * kMaxRegistrations * r->domain->topo().domainSize;
  NCCLEXT_CUDA(cudaMalloc(reinterpret_cast<void**>(&r->devBases), tableBytes));
  NCCLEXT_CUDA(cudaMemset(r->devBases, 0, tableBytes));
  return ncclSuccess;
}

void dropIfEmpty(ncclComm_t comm, const std::shared_ptr<Registry>& r) {
  std::lock_guard<std::mutex> lock(registriesMu);
  if (r->live == 0 && !r->domain) registries().erase(comm);
}

}  // namespace

ncclResult_t registerBuffer(ncclComm_t comm, void* buffer, size_t bytes, ncclM2nRegistration** out) {
  std::shared_ptr<Registry> r = registryOf(comm, true);
  std::unique_lock<std::mutex> lock(r->mu);
  if (!r->domain) {
    const ncclResult_t res = openDomain(comm, r.get());
    if (res != ncclSuccess) {  // none of it stays: the next registration tries again
      if (r->devBases) cudaFree(r->devBases);
      r->devBases = nullptr;
      r->domain.reset();
      lock.unlock();
      dropIfEmpty(comm, r);
      return res;
    }
  }
  ncclext::Domain& d = *r->domain;
  // The same size on every rank of the domain, and a free slot (the same one everywhere: registrations come in the
  // same order on every rank).
  std::vector<uint64_t> sizes(d.topo().domainSize);
  const uint64_t mine = bytes;
  NCCLEXT_CHECK(d.allGather(&mine, sizeof(mine), sizes.data()));
  for (size_t i = 0; i < sizes.size(); i++)
    NCCLEXT_ARG(sizes[i] == mine,
                "ncclM2nRegister: domain rank %zu registers %llu bytes, this rank %llu: NCCL 2.28 needs the same size "
                "on every rank of the domain",
                i, (unsigned long long)sizes[i], (unsigned long long)mine);
  int slot = 0;
  while (slot < kMaxRegistrations && r->slots[slot].base) slot++;
  NCCLEXT_USAGE(slot < kMaxRegistrations, "ncclM2nRegister: %d registrations live on this communicator already",
                kMaxRegistrations);
  const ncclext::NcclAbi* abi = nullptr;
  NCCLEXT_CHECK(ncclext::loadedNcclAbi(&abi));
  ncclWindow_t win = nullptr;
  NCCLEXT_NCCL(ncclCommWindowRegister(d.domainComm(), buffer, bytes, &win, NCCL_WIN_DEFAULT));
  NCCLEXT_USAGE(win != nullptr, "ncclM2nRegister: NCCL returned no window (symmetric memory unsupported?)");
  const int n = d.topo().domainSize;
  std::vector<char*> bases(n);
  NCCLEXT_CHECK(abi->lsaBases(win, n, bases.data()));
  NCCLEXT_CUDA(cudaMemcpy(r->devBases + (size_t)slot * n, bases.data(), sizeof(char*) * n, cudaMemcpyHostToDevice));
  r->slots[slot] = Slot{static_cast<char*>(buffer), bytes, win};
  r->live++;
  *out = new ncclM2nRegistration{comm, slot};
  return ncclSuccess;
}

ncclResult_t deregisterBuffer(ncclM2nRegistration* reg) {
  std::shared_ptr<Registry> r = registryOf(reg->comm, false);
  NCCLEXT_USAGE(r && reg->slot >= 0 && reg->slot < kMaxRegistrations, "ncclM2nDeregister: unknown registration");
  {
    std::lock_guard<std::mutex> lock(r->mu);
    Slot& s = r->slots[reg->slot];
    NCCLEXT_USAGE(s.base != nullptr, "ncclM2nDeregister: registration already released");
    const int n = r->domain->topo().domainSize;
    NCCLEXT_CUDA(cudaMemset(r->devBases + (size_t)reg->slot * n, 0, sizeof(char*) * n));
    NCCLEXT_NCCL(ncclCommWindowDeregister(r->domain->domainComm(), s.window));
    s = Slot{};
    if (--r->live == 0) r->domain.reset();  // the last one: the domain's communicators go with it
  }
  dropIfEmpty(reg->comm, r);
  delete reg;
  return ncclSuccess;
}

bool resolveRegistered(ncclComm_t comm, int domainSize, const void* const* ptrs, const int64_t* bytes, int n,
                       Registered* out, char* const** bases) {
  std::shared_ptr<Registry> r = registryOf(comm, false);
  if (!r) return false;
  std::lock_guard<std::mutex> lock(r->mu);
  if (!r->domain || r->domain->topo().domainSize != domainSize) return false;
  *bases = r->devBases;
  for (int t = 0; t < n; t++) {
    out[t] = Registered{};
    const char* c = static_cast<const char*>(ptrs[t]);
    for (int i = 0; c && i < kMaxRegistrations; i++) {
      const Slot& s = r->slots[i];
      if (s.base && c >= s.base && c + bytes[t] <= s.base + s.bytes) {
        out[t] = Registered{i, (uint64_t)(c - s.base)};
        break;
      }
    }
  }
  return true;
}

}  // namespace ncclm2n
