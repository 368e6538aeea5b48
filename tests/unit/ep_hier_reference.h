// Host model of the hierarchical High-Throughput protocol across NVLink domains (issue 12; not built on the GPU
// yet): what crosses the rail, what each proxy forwards, and how a receiver puts every row where ep_reference.h's
// single-domain contract says (tests/unit/ep_hier_reference_test.cc checks that it does, and that combine through
// the proxies sums to the same). The kernels are to follow it.
//
// Ranks are blocks of G consecutive ranks per domain. For source s (domain ds, local index i) and its token t:
//   - inside ds: one row straight to each rank of ds that hosts one of t's experts (as inside one domain);
//   - for every other domain D that hosts one of t's experts: one rail row to the proxy p = D * G + i (the rank with
//     s's local index there), at rail position q = t's index among s's tokens that hit D. Its tail carries what the
//     proxy and the receivers need and only s knows: s, t, the token's top-k ids and weights, for every rank r of D
//     the token's slot towards r (its index among s's tokens that hit r, the handle's sendSlot; -1: none), and for
//     every column k its index among s's tokens that name that expert (the handle's emIdx);
//   - the proxy forwards each rail row to every rank r of D the token hits (itself included), into r's staging for
//     source s at that slot: the receiver then places rows from every world source exactly as from a source of its
//     own domain (FLAT row = recvOffset[s] + slot; EXPERT_MAJOR row = zoneStart[e] + block(e, s) + emIdx).
// Combine reverses it: each receiver's row for (s, t) goes straight to s inside ds, else to s's proxy in the
// receiver's domain, which sums its domain's rows for (s, t) in rank order and sends one row per (token, domain) back
// over the rail; s sums its own domain's rows in rank order, then the domains' partial rows in domain order.
// One rail row per (token, remote domain hit) each way, as issue 12 asks.
#pragma once

#include <cstdint>
#include <vector>

#include "tests/unit/ep_reference.h"

namespace ncclep {
namespace hier {

// A rail row as the proxy receives it.
struct RailRow {
  int src = -1, token = -1;
  int q = -1;                 // its position in the source's rail stream to this proxy
  std::vector<int> slots;     // per rank of the proxy's domain: the token's slot towards it, or -1
  std::vector<int> emIdx;     // per top-k column: the token's index among the source's tokens naming that expert
};

// A row a receiver gets, with where it came from and where it goes.
struct Delivery {
  int src = -1, token = -1;
  int via = -1;            // the rank that wrote it into the receiver's staging: src itself (own domain) or the proxy
  int slot = -1;           // the token's slot towards the receiver (FLAT row = recvOffset[src] + slot)
  std::vector<int> emIdx;  // per top-k column, as RailRow::emIdx (the source's, or the rail row's when forwarded)
};

struct Plan {
  int nRanks = 1, domainSize = 1;
  int domainOf(int r) const { return r / domainSize; }
  int proxyOf(int src, int domain) const { return domain * domainSize + src % domainSize; }
  // [proxy][k]: the rail rows a proxy receives, by source in rank order, each source's in rail-position order.
  std::vector<std::vector<RailRow>> railIn;
  // [receiver][k]: every row a receiver gets, direct or forwarded, in no particular order.
  std::vector<std::vector<Delivery>> delivered;
  int64_t railRows = 0, nvlinkRows = 0;  // rows over the rail (per direction) and over NVLink (direct + forwarded)
};

Plan plan(const ref::Routing& r, int domainSize);

// Each receiver's FLAT rows in receive order (recvOffset[src] + slot), rebuilt from the deliveries alone.
std::vector<std::vector<ref::FlatRow>> flatOrder(const ref::Routing& r, const Plan& p);

// Combine FLAT through the proxies (see the header), in double: flatIn[rank][row][h] -> out[rank][token][h].
std::vector<std::vector<std::vector<double>>> combineFlat(const ref::Routing& r, const Plan& p,
                                                          const std::vector<ref::RankRecv>& recv,
                                                          const std::vector<std::vector<std::vector<double>>>& flatIn,
                                                          int hidden);

}  // namespace hier
}  // namespace ncclep
