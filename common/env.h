// Every environment variable the two libraries read, parsed once into one struct. getenv() appears nowhere else.
//
// One rule, in both libraries: a value the caller gives through the API (a config field set, an argument) wins; a
// variable fills only what the caller left to the library (a field at NCCL_EP_AUTO / 0, no config), and the settings
// no API takes (NCCL_EXT_LOG). So a config that sets every field behaves the same in any environment.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace ncclext {

enum class LogLevel : int { kNone = 0, kWarn = 1, kInfo = 2, kDebug = 3 };

struct Env {
  // NCCL_EXT_LOG = NONE | WARN | INFO | DEBUG. WARN lines carry file:line; every line carries the library and rank.
  LogLevel logLevel = LogLevel::kWarn;
  // NCCL_EXT_TIMEOUT_S = seconds (> 0). Budget of every device-side wait on a peer (flags, barriers) and of the
  // host watchdogs around kernels, where the config leaves it (ncclEpGroupConfig_t::timeout_ns, ncclM2n*Config's
  // timeoutSeconds: 0).
  double timeoutSeconds = 100.0;
  // NCCL_EXT_LSA_DOMAIN_SIZE = k > 0 splits NCCL's LSA team (one node) into domains of k consecutive ranks, so that
  // the across-domain paths run and get tested on one node, where the config leaves it (lsa_domain_size 0). 0 = the
  // LSA team as NCCL reports it.
  int lsaDomainSize = 0;
  // NCCL_EXT_HT_HIERARCHICAL = 0 | 1 (experimental), where ncclEpGroupConfig_t::ht_hierarchical is NCCL_EP_AUTO.
  // 1: nccl_ep's High-Throughput calls across NVLink domains of
  // several ranks go over relayed exchanges (the rail of my index; the mixed test mode's always do) and move one
  // rail row per (token, destination domain) each way, which the relay expands to (dispatch) or reduces from
  // (combine) the domain's ranks, instead of one per rank. 0 = off.
  int htHierarchical = 0;
  // NCCL_EXT_RAIL_ROUND_TOKENS = k > 0: nccl_ep's High-Throughput flat rail exchange moves a call's rows in rounds of
  // k slots per peer, so that its staging holds k rows a peer, where ncclEpGroupConfig_t::rail_round_tokens is
  // NCCL_EP_AUTO. 0 = the library's default.
  int railRoundTokens = 0;
  // NCCL_EXT_RAIL_OVERLAP = 0 | 1 (opt-in until measured on real nodes: docs/PERFORMANCE.md), where
  // ncclEpGroupConfig_t::rail_overlap is NCCL_EP_AUTO. 1: nccl_ep's
  // High-Throughput flat rail exchange runs a call's rows to my own domain (NVLink) on a stream of the group's beside
  // the rounds of rows to other domains and their exchanges (the rail), joined before the receive half. 0 = one
  // stream, the NVLink rows in the first round's send half.
  int railOverlap = 0;
  // NCCL_EXT_M2N_NET_CHANNELS = k > 0 (experimental): nccl_m2n's exchange communicators (the ncclSend / ncclRecv of
  // plans across NVLink domains) are split with ncclConfig_t::nChannelsPerNetPeer = k and minCTAs = k: channels, and
  // so connections, for each peer over the network (NCCL caps a peer's channels at the communicator's, which minCTAs
  // raises; maxCTAs stays NCCL's default, 64). 0 = NCCL's choice. No API field takes it.
  int m2nNetChannels = 0;
};

// Parses from `lookup` (getenv in production, a map in tests). Unparsable values keep the default and add a line
// to `problems`.
Env parseEnv(const std::function<const char*(const char*)>& lookup, std::vector<std::string>* problems);

// The process-wide values, parsed on first use; problems are printed to stderr once.
const Env& env();

// One line per variable, for the INFO dump.
std::string describeEnv(const Env& e);

const char* logLevelName(LogLevel level);

}  // namespace ncclext
