// The receive cap's dense staging positions (docs/ARCHITECTURE.md, "Receive cap"), shared by the handle's exchange
// kernel (ht/route.cu) and the host model test (tests/unit/ep_cap_model_test.cc): from the count matrix every rank
// holds after the handle exchange, rows(s, r) = source s's rows (one per token) to rank r.
#pragma once

#if defined(__CUDACC__)
#define NCCLEP_HD __host__ __device__ __forceinline__
#else
#define NCCLEP_HD inline
#endif

namespace ncclep {

// What rank `me` derives about rank r (DerivedLayout): dispAt, where my rows start in r's dispatch staging (the rows
// of the sources before me to r), which is also r's FLAT offset for me; combAt, where my rows for owner r start in
// r's combine staging (r's rows to the ranks before me); combMine, where r's rows start in my combine staging (my
// rows to the ranks before r); total, every source's rows to r (r drops some when that is above the cap).
struct CapOffsets {
  int dispAt, combAt, combMine, total;
};

template <typename Rows>
NCCLEP_HD CapOffsets capOffsets(const Rows& rows, int R, int me, int r) {
  CapOffsets o{0, 0, 0, 0};
  for (int s = 0; s < R; s++) {
    const int n = rows(s, r);
    o.dispAt += s < me ? n : 0;
    o.total += n;
    o.combAt += s < me ? rows(r, s) : 0;
    o.combMine += s < r ? rows(me, s) : 0;
  }
  return o;
}

// Whether my row of slot `slot` towards r (r's dispAt for me being `dispAt`) is past r's cap: not sent, not received,
// not combined.
NCCLEP_HD bool capDrops(int dispAt, int slot, int cap) { return cap > 0 && dispAt + slot >= cap; }

// Of a source's `rows` for rank r starting at r's position `dispAt`, those r keeps under its cap: slots
// [0, capDelivered) (the source's count towards r in its retained half, r's count from the source: srcCount).
NCCLEP_HD int capDelivered(int rows, int dispAt, int cap) {
  const int room = cap - dispAt;
  return rows < room ? rows : room > 0 ? room : 0;
}

}  // namespace ncclep
