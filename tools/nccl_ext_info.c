/* Prints what was built and which NCCL it runs on, and what an EP High-Throughput group would take in memory at a
 * production shape (ncclEpGroupInfoQuery: host arithmetic), through the public C API only (compiled as C99: it also
 * proves that the public headers are C-clean). Needs no GPU. Exit status 0 when the loaded NCCL matches the build. */
#include <stdio.h>

#include "nccl_ep.h"
#include "nccl_m2n.h"

/* A GPU's window and rail staging for a High-Throughput group of 4096 tokens x 7168 bf16, top-8 of 256 experts, on
 * nodes of 8 GPUs (this process's environment: NCCL_EXT_RAIL_ROUND_TOKENS, ...). */
static int printEpMemory(void) {
  const int nodes[] = {1, 2, 4, 8};
  int i;
  printf("EP High-Throughput memory a GPU (ncclEpGroupInfoQuery; 4096 tokens x 7168 bf16, top-8 of 256 experts, "
         "8 GPUs a node):\n");
  for (i = 0; i < (int)(sizeof(nodes) / sizeof(nodes[0])); i++) {
    ncclEpGroupConfig_t cfg = NCCL_EP_GROUP_CONFIG_INIT;
    ncclEpGroupInfo_t info = NCCL_EP_GROUP_INFO_INIT;
    cfg.num_experts = 256;
    cfg.max_tokens_per_rank = 4096;
    cfg.max_token_bytes = 7168 * 2;
    cfg.max_topk = 8;
    if (ncclEpGroupInfoQuery(&cfg, 8 * nodes[i], 8, &info) != ncclSuccess) {
      printf("  %2d node(s): %s\n", nodes[i], ncclEpGetLastError());
      return 1;
    }
    printf("  %2d node(s): window %.2f GB, rail staging %.2f GB (rounds of %d rows a peer)\n", nodes[i],
           (double)info.window_bytes / 1e9, (double)info.rail_staging_bytes / 1e9, info.rail_round_tokens);
  }
  return 0;
}

/* The same group inside one NVLink domain of 8 to 64 GPUs (one multi-node NVLink system), and as 8 nodes of 8 (rail
 * rounds of the default 1024 rows a peer, and of 256),
 * without and with a receive cap (max_recv_rows_per_rank) of twice a rank's mean load under uniform top-8 routing:
 * each of the R x 4096 tokens reaches a given rank with probability 1 - C(256 - L, 8) / C(256, 8), L = 256 / R
 * experts a rank. Across domains the rail staging (an inbox beside each outbox under the cap) is printed too. */
static int printEpCapMemory(void) {
  const int ranks[] = {8, 16, 32, 64, 64, 64}, domains[] = {8, 16, 32, 64, 8, 8}, rounds[] = {0, 0, 0, 0, 0, 256};
  int i, j;
  printf("With a receive cap (ncclEpGroupInfoQuery; the same group, cap = 2 x the mean rows a rank receives):\n");
  for (i = 0; i < (int)(sizeof(ranks) / sizeof(ranks[0])); i++) {
    ncclEpGroupConfig_t cfg = NCCL_EP_GROUP_CONFIG_INIT;
    ncclEpGroupInfo_t open = NCCL_EP_GROUP_INFO_INIT, capped = NCCL_EP_GROUP_INFO_INIT;
    const int R = ranks[i], G = domains[i], L = 256 / R;
    double miss = 1, mean;
    for (j = 0; j < 8; j++) miss *= (double)(256 - L - j) / (double)(256 - j);
    mean = (double)R * 4096 * (1 - miss);
    cfg.num_experts = 256;
    cfg.max_tokens_per_rank = 4096;
    cfg.max_token_bytes = 7168 * 2;
    cfg.max_topk = 8;
    if (rounds[i]) cfg.rail_round_tokens = rounds[i];
    if (ncclEpGroupInfoQuery(&cfg, R, G, &open) != ncclSuccess) {
      printf("  %2d GPUs: %s\n", R, ncclEpGetLastError());
      return 1;
    }
    cfg.max_recv_rows_per_rank = (int)(2 * mean);
    if (ncclEpGroupInfoQuery(&cfg, R, G, &capped) != ncclSuccess) {
      printf("  %2d GPUs: %s\n", R, ncclEpGetLastError());
      return 1;
    }
    printf("  %2d GPUs, %d domain(s): mean %6.0f rows, cap %6d of %6d: window %.2f GB -> %.2f GB (%.1fx)", R, R / G,
           mean, cfg.max_recv_rows_per_rank, R * 4096, (double)open.window_bytes / 1e9,
           (double)capped.window_bytes / 1e9, (double)open.window_bytes / (double)capped.window_bytes);
    if (G < R)
      printf("; with the rail staging (rounds of %d) %.2f GB -> %.2f GB (%.1fx)", capped.rail_round_tokens,
             (double)(open.window_bytes + open.rail_staging_bytes) / 1e9,
             (double)(capped.window_bytes + capped.rail_staging_bytes) / 1e9,
             (double)(open.window_bytes + open.rail_staging_bytes) /
                 (double)(capped.window_bytes + capped.rail_staging_bytes));
    printf("\n");
  }
  return 0;
}

int main(void) {
  int ep = 0, m2n = 0, built = 0, loaded = 0;
  ncclResult_t res;
  if (ncclEpGetVersion(&ep) != ncclSuccess || ncclM2nGetVersion(&m2n) != ncclSuccess) return 1;
  res = ncclEpCheckNcclRuntime(&built, &loaded);
  printf("libnccl_ep %d, libnccl_m2n %d\n", ep, m2n);
  if (res == ncclSuccess)
    printf("NCCL: loaded %d.%d.%d, served by the part built against NCCL %d.%d.%d's headers\n", loaded / 10000,
           loaded / 100 % 100, loaded % 100, built / 10000, built / 100 % 100, built % 100);
  else
    printf("NCCL: %s\n", ncclEpGetLastError());
  if (printEpMemory() != 0 || printEpCapMemory() != 0) return 1;
  return res == ncclSuccess ? 0 : 1;
}
