/* Prints what was built and which NCCL it runs on, through the public C API only (compiled as C99: it also proves
 * that the public headers are C-clean). Needs no GPU. Exit status 0 when the loaded NCCL matches the build. */
#include <stdio.h>

#include "nccl_ep.h"
#include "nccl_m2n.h"

int main(void) {
  int ep = 0, m2n = 0, built = 0, loaded = 0;
  if (ncclEpGetVersion(&ep) != ncclSuccess || ncclM2nGetVersion(&m2n) != ncclSuccess) return 1;
  ncclResult_t res = ncclEpCheckNcclRuntime(&built, &loaded);
  printf("libnccl_ep %d, libnccl_m2n %d\n", ep, m2n);
  printf("NCCL: built against %d.%d.%d, loaded %d.%d.%d -> %s\n", built / 10000, built / 100 % 100, built % 100,
         loaded / 10000, loaded / 100 % 100, loaded % 100, res == ncclSuccess ? "compatible" : ncclEpGetLastError());
  return res == ncclSuccess ? 0 : 1;
}
