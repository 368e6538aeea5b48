// CPU simulator for M2N plans: executes every rank's lists on host memory and checks the result.
//
// Each source position's local tensor is filled, at the offsets its strides give, with values that name
// (tensor, global linear index) uniquely; every other slot of its buffer holds a "hole" marker. Destination
// buffers start poisoned with a write count of zero. Executing the sends and local copies must then
//   - read only slots that hold an element of the source tensor (never a hole, never outside the buffer),
//   - write only inside the destination buffer, at slots of destination elements,
// and afterwards every destination element must hold its own value, written exactly once. The simulator also
// checks that the receive lists mirror the send lists exactly (a pull executor reads them).
//
// With schedules (simulateWire), the sends do not go straight from source to destination: each sender packs every
// chunk of every send stream into a staging buffer from its own lists and segments, and the receiver unpacks it
// from its own receive lists and segments, as the executor's kernels do. A chunk byte unpacked that was never
// packed, streams of different lengths on the two sides, or a staging slot outside the rank's staging, fail it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "nccl_m2n/src/exec_tables.h"
#include "nccl_m2n/src/plan.h"
#include "nccl_m2n/src/schedule.h"

namespace ncclm2n {

struct SimulationResult {
  bool ok = true;
  int64_t errors = 0;
  int64_t elementsChecked = 0;
  std::string firstError;
};

SimulationResult simulate(const Problem& problem, const std::vector<RankPlan>& plans);
SimulationResult simulateWire(const Problem& problem, const std::vector<RankPlan>& plans,
                              const std::vector<RankSchedule>& schedules);

// The executor as its tables drive it (exec_tables.h), on host bytes with the real element sizes: the local copies,
// then every round's packs (move.h's packElement, as the kernels call it), its ncclSend/ncclRecv pairs matched up
// and copied between the ranks' staging buffers, and its unpacks. LSA segments pack into the rank's own window
// and unpack from the sender's (found by its index in the domain). A send without its receive (or of another
// size), a staging access outside the staging, a pack into another rank's window, an LSA unpack in a round without
// its barrier, ranks of one domain that meet different numbers of barriers, or any destination element not written
// exactly once with its own value fails it.
SimulationResult emulateExecute(const Problem& problem, const std::vector<ExecTables>& tables);

}  // namespace ncclm2n
