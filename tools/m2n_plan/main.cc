// m2n_plan: plans a whole model's weight transfer from one parallel layout to another, on the CPU, and says what
// it would move: bytes per rank, over NVLink or the network, the busiest ranks, boxes, source balance and the
// time the transfer would take at given link speeds. `--json` for machines. See docs/M2N_PLAN.md.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "nccl_m2n/src/exec_tables.h"
#include "nccl_m2n/src/schedule.h"
#include "tools/m2n_plan/model.h"

namespace {

using Clock = std::chrono::steady_clock;

std::string human(double bytes) {
  const char* units[] = {"B", "KB", "MB", "GB", "TB"};
  int u = 0;
  while (bytes >= 1000 && u < 4) {
    bytes /= 1000;
    u++;
  }
  char buf[32];
  snprintf(buf, sizeof(buf), u ? "%.2f %s" : "%.0f %s", bytes, units[u]);
  return buf;
}

struct LinkTime {
  double seconds = 0;
  int rank = -1;
  const char* what = "";
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Plan a model's weight resharding between two parallel layouts (CPU only)."};
  std::string config, srcSpec, dstSpec;
  bool colocated = false, asJson = false, progressFlag = false;
  int ranksPerNode = 8, benchRanks = 0;
  double nvlinkGBps = 390.0, netGBps = 50.0;
  app.add_option("config", config, "model config (JSON), e.g. bench/configs/qwen3-32b.json")->required();
  app.add_option("--src", srcSpec, "source layout, e.g. tp=4,pp=2,dp=2[,ep=2][,etp=1]")->required();
  app.add_option("--dst", dstSpec, "destination layout, e.g. tp=2,dp=8")->required();
  app.add_flag("--colocated", colocated, "destination ranks start at 0 (shared GPUs) instead of after the source");
  app.add_option("--ranks-per-node", ranksPerNode, "GPUs per NVLink domain (0: one domain)")->check(CLI::NonNegativeNumber);
  app.add_option("--nvlink-gbps", nvlinkGBps, "NVLink bandwidth per GPU per direction, GB/s (assumed)")
      ->check(CLI::PositiveNumber);
  app.add_option("--net-gbps", netGBps, "network bandwidth per GPU per direction, GB/s (assumed)")
      ->check(CLI::PositiveNumber);
  app.add_option("--bench-ranks", benchRanks, "time the per-rank plan of this many ranks (busiest first)")
      ->check(CLI::NonNegativeNumber);
  app.add_flag("--json", asJson, "print JSON instead of the summary");
  app.add_flag("--progress", progressFlag, "progress bar even when stderr is not a terminal");
  CLI11_PARSE(app, argc, argv);

  m2nplan::Model model;
  m2nplan::Parallel src, dst;
  std::string error;
  if (!m2nplan::loadModel(config, &model, &error) || !m2nplan::parseParallel(srcSpec, &src, &error) ||
      !m2nplan::parseParallel(dstSpec, &dst, &error)) {
    fprintf(stderr, "m2n_plan: %s\n", error.c_str());
    return 2;
  }
  dst.firstRank = colocated ? 0 : src.worldSize();
  ncclm2n::Problem problem;
  problem.nRanks = colocated ? std::max(src.worldSize(), dst.worldSize()) : src.worldSize() + dst.worldSize();
  problem.options.ranksPerDomain = ranksPerNode;
  problem.tensors.reserve(model.tensors.size());
  int64_t modelBytes = 0;
  for (const m2nplan::TensorDesc& t : model.tensors) {
    ncclm2n::TensorPair tp;
    tp.name = t.name;
    if (!m2nplan::megatronLayout(model, t, src, &tp.src, &error) ||
        !m2nplan::megatronLayout(model, t, dst, &tp.dst, &error)) {
      fprintf(stderr, "m2n_plan: %s\n", error.c_str());
      return 2;
    }
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    modelBytes += n * (int64_t)ncclm2n::elementSize(t.dtype);
    problem.tensors.push_back(std::move(tp));
  }
  if (!ncclm2n::validateProblem(problem, &error)) {
    fprintf(stderr, "m2n_plan: %s\n", error.c_str());
    return 2;
  }

  const bool bar = progressFlag || (!asJson && isatty(STDERR_FILENO));
  ncclm2n::ProgressFn progress;
  if (bar) {
    progress = [](size_t done, size_t total) {
      const int width = 40, filled = (int)(width * done / std::max<size_t>(total, 1));
      fprintf(stderr, "\rplanning [%.*s%*s] %3d%% %zu/%zu tensors", filled, "########################################",
              width - filled, "", (int)(100 * done / std::max<size_t>(total, 1)), done, total);
      if (done == total) fprintf(stderr, "\n");
    };
  }
  ncclm2n::PlanStats s;
  auto t0 = Clock::now();
  ncclm2n::planRank(problem, 0, nullptr, &s, progress);
  const double planSeconds = std::chrono::duration<double>(Clock::now() - t0).count();

  // Ranks ordered by traffic, for the "busiest" lines and the per-rank benchmark.
  const int n = problem.nRanks;
  int busiestSrc = 0, busiestDst = dst.firstRank;
  for (int r = 0; r < n; r++) {
    if (s.sendBytes[r] > s.sendBytes[busiestSrc]) busiestSrc = r;
    if (s.recvBytes[r] + s.copyBytes[r] > s.recvBytes[busiestDst] + s.copyBytes[busiestDst]) busiestDst = r;
  }
  int64_t dstMin = INT64_MAX, dstMax = 0, dstSum = 0;
  for (int r = dst.firstRank; r < dst.firstRank + dst.worldSize(); r++) {
    const int64_t b = s.recvBytes[r] + s.copyBytes[r];
    dstMin = std::min(dstMin, b);
    dstMax = std::max(dstMax, b);
    dstSum += b;
  }
  // Time model: NVLink and the NIC are separate full-duplex links, so a rank needs
  // max(intra / nvlink, inter / net) to send and the same to receive; the transfer takes the slowest rank.
  LinkTime slowest;
  for (int r = 0; r < n; r++) {
    const double send = std::max(s.sendIntraBytes[r] / (nvlinkGBps * 1e9), s.sendInterBytes[r] / (netGBps * 1e9));
    const double recv = std::max(s.recvIntraBytes[r] / (nvlinkGBps * 1e9), s.recvInterBytes[r] / (netGBps * 1e9));
    if (send > slowest.seconds) slowest = {send, r, "sending"};
    if (recv > slowest.seconds) slowest = {recv, r, "receiving"};
  }
  int64_t sendBoxes = 0;
  for (int64_t b : s.sendBoxes) sendBoxes += b;

  // Per-rank plans, timed one by one (each is what one rank of a real job computes).
  std::vector<int> benchList;
  for (int r : {busiestSrc, busiestDst, 0, dst.firstRank})
    if ((int)benchList.size() < benchRanks && std::find(benchList.begin(), benchList.end(), r) == benchList.end())
      benchList.push_back(r);
  for (int r = 1; (int)benchList.size() < benchRanks && r < n; r += std::max(1, n / std::max(1, benchRanks)))
    if (std::find(benchList.begin(), benchList.end(), r) == benchList.end()) benchList.push_back(r);
  nlohmann::json bench = nlohmann::json::array();
  std::vector<double> benchTimes;
  for (int r : benchList) {
    ncclm2n::RankPlan mine;
    auto b0 = Clock::now();
    ncclm2n::planRank(problem, r, &mine, nullptr);
    const double secs = std::chrono::duration<double>(Clock::now() - b0).count();
    // The rest of ncclM2nPlanCreate's host work on that plan, with the executor's default options (staging cap
    // 256 MiB, every stream by ncclSend/ncclRecv, direct transfers): the schedule (wire streams, chunks, staging),
    // then the tables an execute reads (exec_tables.h) and the local copies' segments.
    ncclm2n::ScheduleOptions so;
    so.lsa = false;
    so.direct = true;
    ncclm2n::RankSchedule sched;
    ncclm2n::ExecTables tables;
    std::string why;
    auto s0 = Clock::now();
    bool scheduled = ncclm2n::buildSchedule(problem, mine, so, &sched, &why);
    const double schedSecs = std::chrono::duration<double>(Clock::now() - s0).count();
    auto t0 = Clock::now();
    scheduled = scheduled && ncclm2n::buildExecTables(problem, mine, sched, &tables, &why);
    const size_t copySegs = scheduled ? ncclm2n::executorCopySegments(tables.copies).size() : 0;
    const double tableSecs = std::chrono::duration<double>(Clock::now() - t0).count();
    int64_t chunks = 0;
    for (const auto* list : {&sched.sends, &sched.recvs})
      for (const ncclm2n::WireStream& w : *list) chunks += w.chunks(sched.chunkBytes);
    benchTimes.push_back(secs + schedSecs + tableSecs);
    bench.push_back({{"rank", r}, {"seconds", secs}, {"sends", mine.sends.size()}, {"recvs", mine.recvs.size()},
                     {"copies", mine.copies.size()}, {"schedule_seconds", schedSecs}, {"tables_seconds", tableSecs},
                     {"rounds", tables.rounds.size()}, {"pack_segments", tables.pack.size()},
                     {"unpack_segments", tables.unpack.size()}, {"p2p_ops", tables.ops.size()},
                     {"direct_ops", tables.direct.size()}, {"copy_segments", copySegs},
                     {"schedule", scheduled ? nlohmann::json{{"chunk_bytes", sched.chunkBytes},
                                                             {"staging_bytes", sched.stagingBytes},
                                                             {"send_streams", sched.sends.size()},
                                                             {"recv_streams", sched.recvs.size()},
                                                             {"chunks", chunks}}
                                            : nlohmann::json(why)}});
  }
  std::sort(benchTimes.begin(), benchTimes.end());

  char hashes[64];
  snprintf(hashes, sizeof(hashes), "%016llx/%016llx", (unsigned long long)s.metadataHash,
           (unsigned long long)s.planHash);
  if (asJson) {
    nlohmann::json j = {
        {"model", model.name}, {"config", config}, {"tensors", problem.tensors.size()}, {"model_bytes", modelBytes},
        {"src", srcSpec}, {"dst", dstSpec}, {"colocated", colocated}, {"ranks", n}, {"ranks_per_node", ranksPerNode},
        {"plan_seconds_all_ranks_stats", planSeconds}, {"pieces", s.pieces}, {"send_boxes", sendBoxes},
        {"total_bytes", s.totalBytes}, {"local_bytes", s.localBytes}, {"nvlink_bytes", s.intraDomainBytes},
        {"network_bytes", s.interDomainBytes},
        {"dst_rank_bytes", {{"min", dstMin}, {"mean", (double)dstSum / dst.worldSize()}, {"max", dstMax}}},
        {"busiest_source", {{"rank", busiestSrc}, {"bytes", s.sendBytes[busiestSrc]}}},
        {"busiest_destination", {{"rank", busiestDst}, {"bytes", s.recvBytes[busiestDst] + s.copyBytes[busiestDst]}}},
        {"source_load", {{"max", s.maxSourceLoad()}, {"mean", s.meanSourceLoad()}}},
        {"predicted", {{"seconds", slowest.seconds}, {"rank", slowest.rank}, {"limited_by", slowest.what},
                       {"nvlink_GBps_assumed", nvlinkGBps}, {"net_GBps_assumed", netGBps}}},
        {"metadata_hash", s.metadataHash}, {"plan_hash", s.planHash}, {"per_rank_plan", bench}};
    printf("%s\n", j.dump(1).c_str());
    return 0;
  }
  printf("m2n_plan: %s, %zu tensors, %s\n", model.name.c_str(), problem.tensors.size(), human(modelBytes).c_str());
  printf("  source       %-24s ranks %d-%d\n", srcSpec.c_str(), src.firstRank, src.firstRank + src.worldSize() - 1);
  printf("  destination  %-24s ranks %d-%d%s\n", dstSpec.c_str(), dst.firstRank, dst.firstRank + dst.worldSize() - 1,
         colocated ? " (co-located)" : "");
  printf("  NVLink domain %d GPUs; planned all %d ranks' decisions in %.3f s on one core\n", ranksPerNode, n,
         planSeconds);
  printf("\n");
  printf("  bytes delivered      %s (%s by local copies)\n", human(s.totalBytes).c_str(), human(s.localBytes).c_str());
  printf("  per destination rank min %s, mean %s, max %s\n", human(dstMin).c_str(),
         human((double)dstSum / dst.worldSize()).c_str(), human(dstMax).c_str());
  printf("  over NVLink          %s\n", human(s.intraDomainBytes).c_str());
  printf("  over the network     %s\n", human(s.interDomainBytes).c_str());
  printf("  busiest source       rank %d sends %s\n", busiestSrc, human(s.sendBytes[busiestSrc]).c_str());
  printf("  busiest destination  rank %d receives %s\n", busiestDst,
         human(s.recvBytes[busiestDst] + s.copyBytes[busiestDst]).c_str());
  printf("  boxes                %lld transfers (%lld sent between ranks, mean %s each)\n", (long long)s.pieces,
         (long long)sendBoxes, human(sendBoxes ? (double)(s.totalBytes - s.localBytes) / sendBoxes : 0).c_str());
  printf("  source balance       max/mean bytes sent = %.3f\n",
         s.meanSourceLoad() > 0 ? s.maxSourceLoad() / s.meanSourceLoad() : 1.0);
  printf("  predicted time       %.3f s at %.0f GB/s NVLink and %.0f GB/s network per GPU (rank %d %s)\n",
         slowest.seconds, nvlinkGBps, netGBps, slowest.rank, slowest.what);
  printf("  hashes               metadata/plan %s\n", hashes);
  if (!benchTimes.empty()) {
    printf("  per-rank plan + schedule + tables %zu ranks: median %.3f s, max %.3f s (one core)\n", benchTimes.size(),
           benchTimes[benchTimes.size() / 2], benchTimes.back());
  }
  return 0;
}
