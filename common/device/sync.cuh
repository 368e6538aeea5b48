// Device synchronisation primitives shared by the kernels of both libraries.
//
// Contract
// - Flags are 64-bit sequence numbers that only grow, compared with a rolling comparison, so they never need
//   resetting (a graph replayed many times keeps counting).
// - Publish: plain stores of the payload by any threads of the CTA, then a CTA barrier, then one thread's
//   release store of the flag at SYSTEM scope into the peer's window (the barrier plus the cumulativity of the
//   release make every payload store of the CTA visible before the flag).
// - Consume: acquire loads of the local flag at SYSTEM scope until it reaches the expected value, then a CTA
//   barrier, after which every thread of the CTA may read the payload.
// - Every wait has a budget (WaitContext::timeoutNs, measured on %globaltimer, so it does not drift with the SM
//   clock). When it runs out the waiting thread records rank, peer, expected and seen values in the error word
//   (common/device_error.h) and returns false; it never traps. A wait also gives up early, without overwriting the
//   word, once another thread of this rank has recorded a timeout (not a bad-input report, which is recoverable).
// - Windows are reached only through dev::Peers (a table of window bases: NCCL's LSA mapping for real ranks, the
//   allocations' addresses for virtual ranks).
#pragma once

#include <cstdint>
#include <cuda/atomic>

#include "common/device/coop.cuh"
#include "common/device/peers.h"
#include "common/device_error.h"

namespace ncclext {
namespace dev {

struct WaitContext {
  DeviceErrorSink err;
  uint64_t timeoutNs;
  int rank;  // my world rank, for the error word
};

__device__ __forceinline__ uint64_t globalTimerNs() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ void storeRelease(uint64_t* p, uint64_t v) {
  cuda::atomic_ref<uint64_t, cuda::thread_scope_system>(*p).store(v, cuda::memory_order_release);
}

__device__ __forceinline__ uint64_t loadAcquire(const uint64_t* p) {
  return cuda::atomic_ref<uint64_t, cuda::thread_scope_system>(*const_cast<uint64_t*>(p))
      .load(cuda::memory_order_acquire);
}

// a >= b on a sequence that may wrap.
__device__ __forceinline__ bool seqAtLeast(uint64_t a, uint64_t b) { return static_cast<int64_t>(a - b) >= 0; }

// A failure that dooms this rank's waits (a timeout, or a wait that gave up because of one). A bad-input report
// (an invalid expert id found by a handle kernel) is not one: the collective goes on and the group stays usable,
// so the other waits must not give up because of it.
__device__ __forceinline__ bool errorRecorded(const DeviceErrorSink& s) {
  const uint32_t code = *reinterpret_cast<const volatile uint32_t*>(&s.word->code);
  return code == kDeviceTimeout || code == kDeviceAborted;
}

// Records the first failure of this rank (see common/device_error.h): only device-scope atomics on device memory and
// plain stores to the mapped host word, which every GPU supports.
__device__ inline void recordError(const DeviceErrorSink& s, uint32_t code, int rank, int peer, uint64_t expected,
                                   uint64_t seen, uint32_t site, uint32_t index, uint64_t waitedNs) {
  volatile DeviceErrorWord* w = s.word;
  const uint32_t armed = w->resets;
  if (atomicCAS(s.claim, armed, armed + 1) != armed) return;  // the first failure since the last re-arm wins
  w->rank = rank;
  w->peer = peer;
  w->expected = expected;
  w->seen = seen;
  w->site = site;
  w->index = index;
  w->waitedNs = waitedNs;
  w->atNs = globalTimerNs();
  __threadfence_system();  // the fields before the code, for a host that polls the code
  w->code = code;
}

// The spinning part of waitFlagAtLeast, out of line so that a kernel's hot loop does not carry its registers.
static __device__ __noinline__ bool waitFlagSlow(const uint64_t* flag, uint64_t expected, const WaitContext ctx,
                                                 int peer, uint32_t site, uint32_t index) {
  uint64_t seen;
  const uint64_t start = globalTimerNs();
  for (uint32_t spin = 1;; spin++) {
    seen = loadAcquire(flag);
    if (seqAtLeast(seen, expected)) return true;
    if ((spin & 63) == 0) {
      const uint64_t waited = globalTimerNs() - start;
      if (waited > ctx.timeoutNs) {
        recordError(ctx.err, kDeviceTimeout, ctx.rank, peer, expected, seen, site, index, waited);
        return false;
      }
      if ((spin & 4095) == 0 && errorRecorded(ctx.err)) return false;
    }
  }
}

// One thread waits until *flag >= expected. True on success; false after recording a timeout (or after seeing
// that another thread already failed).
__device__ __forceinline__ bool waitFlagAtLeast(const uint64_t* flag, uint64_t expected, const WaitContext& ctx,
                                                int peer, uint32_t site, uint32_t index) {
  if (seqAtLeast(loadAcquire(flag), expected)) return true;
  return waitFlagSlow(flag, expected, ctx, peer, site, index);
}

// A barrier among the ranks of one LSA team, built on flags in a symmetric window, with a timeout.
//
// Window layout (identical on every rank, at `flagsOffset`): uint64 flags[nBarriers][lsaSize]; flags[b][s] of
// rank d's window is written only by LSA rank s, with the epoch of its b-th barrier. Each rank keeps its own
// epochs in local device memory (`epochs[nBarriers]`), so the sequence continues across launches and graph
// replays. Barrier index b must be used by one CTA at a time per rank (give each CTA its own index), and the k-th
// sync on index b pairs with the k-th on every peer: it orders only what the same-index CTAs did.
struct LsaBarrier {
  Peers peers;
  size_t flagsOffset;
  uint64_t* epochs;
  int lsaRank, lsaSize;
  int worldRankOfLsa0;  // world rank of LSA rank 0 (LSA teams are blocks of consecutive ranks)
  WaitContext wait;

  static constexpr size_t flagBytes(int nBarriers, int lsaSize) {
    return static_cast<size_t>(nBarriers) * lsaSize * sizeof(uint64_t);
  }
};

// CTA-collective: every thread of the CTA calls it. Returns false on every thread if any wait failed.
__device__ inline bool lsaBarrierSync(CoopCta cta, const LsaBarrier& b, uint32_t index) {
  const int t = cta.thread_rank();
  const int n = cta.size();
  // (1) Everything this CTA wrote so far happens before the release stores below.
  cta.sync();
  const uint64_t next = b.epochs[index] + 1;
  const size_t row = b.flagsOffset + static_cast<size_t>(index) * b.lsaSize * sizeof(uint64_t);
  // (2) Arrive: tell every peer (and myself) that I reached epoch `next`.
  for (int peer = t; peer < b.lsaSize; peer += n) {
    uint64_t* remote = static_cast<uint64_t*>(b.peers.at(row + b.lsaRank * sizeof(uint64_t), peer));
    storeRelease(remote, next);
  }
  // (3) Wait: every peer's flag in my window reached `next` (acquire).
  bool failed = false;
  for (int peer = t; peer < b.lsaSize; peer += n) {
    const uint64_t* mine = static_cast<const uint64_t*>(b.peers.local(row + peer * sizeof(uint64_t)));
    if (!waitFlagAtLeast(mine, next, b.wait, b.worldRankOfLsa0 + peer, kSiteBarrier, index)) failed = true;
  }
  // (4) The CTA barrier hands the acquires to every thread and agrees on the outcome.
  failed = __syncthreads_or(failed);
  if (t == 0 && !failed) b.epochs[index] = next;
  return !failed;
}

}  // namespace dev
}  // namespace ncclext
