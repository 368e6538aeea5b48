// The group's window layout and sizes, and the config they are made from: pure host arithmetic, the same on every
// rank (ncclEpCreateGroup, ncclEpGroupInfoQuery, host tests).
#pragma once

#include "common/topology.h"
#include "nccl_ep/include/nccl_ep.h"
#include "nccl_ep/src/views.h"

namespace ncclep {

inline size_t alignUp(size_t x, size_t a) { return (x + a - 1) / a * a; }

// A config with the fields an environment variable may fill resolved by common/env.h's one rule (a value the config
// gives wins; NCCL_EP_AUTO takes the variable, else the default): what ncclEpCreateGroup and ncclEpGroupInfoQuery
// both use, so that they agree.
struct ResolvedConfig {
  ncclEpGroupConfig_t config{};  // rail_round_tokens resolved (0 still: layoutGroup's default)
  bool htHierarchical = false;
  bool railOverlap = false;
  double timeoutSeconds = 100;
};
ResolvedConfig resolveConfig(const ncclEpGroupConfig_t& config);

// The group's window layout, sizes and rail view (outbox pointer aside) for `config` on `topo`: pure host
// arithmetic, the same on every rank (ncclEpGroup::create; host tests). htHierarchical: the hierarchical HT;
// relayRail: the mixed test mode's rail (TestingModes::virtualRail).
void layoutGroup(const ncclEpGroupConfig_t& config, const ncclext::Topology& topo, GroupView* view,
                 bool htHierarchical = false, bool relayRail = false);
// The rail's device memory outside the window (ncclEpGroupInfo_t::rail_staging_bytes is their sum; 0 with one
// domain): the outboxes and inboxes, one allocation (the direct exchange: outboxes only, with a receive cap inboxes
// too; the hierarchical HT: inboxes only, its outboxes being in the window), and the hierarchical HT's rail rows of a
// round (dispatch rows with their tails and combine partials, out and in, a round's positions for every domain).
inline size_t railBoxBytes(const RailView& rv) {
  return (rv.hier ? 0 : rv.outboxBytes * rv.boxes) + (rv.direct && !rv.capped ? 0 : rv.inboxBytes * rv.boxes);
}
// The hierarchical HT's rail row of exchange `kind`: dispatch, a row with its tail (rail/view.h, HierRow); combine, a
// partial row with its tail (HierCombTail).
inline size_t hierRowBytes(const GroupView& v, int kind) {
  return kind == kDispatch ? v.rail.hierRow.bytes() : hierCombRowBytes(v.rowStride);
}
inline size_t hierRailRowBytes(const GroupView& v) {
  if (!v.rail.hier) return 0;
  const size_t slots = (size_t)(v.nRanks / v.rail.domainSize) * v.rail.roundSlots;
  return 2 * slots * (hierRowBytes(v, kDispatch) + hierRowBytes(v, kCombine));
}
inline size_t railStagingBytes(const GroupView& v) { return railBoxBytes(v.rail) + hierRailRowBytes(v); }
// layoutGroup for `config` whose rail_round_tokens is resolved (not NCCL_EP_AUTO), within its
// rail_staging_bytes_max when it has one: High-Throughput's round shrinks to the most rows a peer whose staging
// (railStagingBytes) fits; ncclInvalidArgument, with the smallest staging, when none does (or, Low-
// Latency and relayed flat exchanges, whose staging is fixed, when it does not fit).
ncclResult_t layoutWithinBudget(const ncclEpGroupConfig_t& config, const ncclext::Topology& topo, GroupView* view,
                                bool htHierarchical = false, bool relayRail = false);
}  // namespace ncclep
