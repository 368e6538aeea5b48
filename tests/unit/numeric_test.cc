// common/numeric.h against brute force: every e4m3 code decoded and re-encoded, random floats encoded to the
// nearest e4m3 value (ties to even, saturating at 448) and to the nearest bf16, and the FP8 block scales.
#include <cmath>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "common/numeric.h"

namespace ncclext {
namespace {

bool isNan(float f) { return f != f; }

TEST(Numeric, E4m3DecodesItsKnownValues) {
  EXPECT_EQ(e4m3ToFloat(0x00), 0.0f);
  EXPECT_EQ(e4m3ToFloat(0x01), std::ldexp(1.0f, -9));  // smallest subnormal
  EXPECT_EQ(e4m3ToFloat(0x07), 7 * std::ldexp(1.0f, -9));
  EXPECT_EQ(e4m3ToFloat(0x08), std::ldexp(1.0f, -6));  // smallest normal
  EXPECT_EQ(e4m3ToFloat(0x38), 1.0f);
  EXPECT_EQ(e4m3ToFloat(0x3c), 1.5f);
  EXPECT_EQ(e4m3ToFloat(0x7e), 448.0f);
  EXPECT_EQ(e4m3ToFloat(0xfe), -448.0f);
  EXPECT_TRUE(std::signbit(e4m3ToFloat(0x80)) && e4m3ToFloat(0x80) == 0.0f);
  EXPECT_TRUE(isNan(e4m3ToFloat(0x7f)) && isNan(e4m3ToFloat(0xff)));
}

TEST(Numeric, E4m3RoundTripsEveryCode) {
  for (int c = 0; c < 256; c++) {
    if ((c & 0x7f) == 0x7f) continue;  // NaN
    EXPECT_EQ(floatToE4m3(e4m3ToFloat((uint8_t)c)), c) << "code " << c;
  }
}

// The nearest finite e4m3 code of x by brute force (ties: the even code), saturating beyond 448.
uint8_t nearestE4m3(float x) {
  int best = -1;
  double bestErr = 0;
  for (int c = 0; c < 256; c++) {
    if ((c & 0x7f) == 0x7f) continue;
    if (std::signbit(e4m3ToFloat((uint8_t)c)) != std::signbit(x)) continue;
    const double err = std::fabs((double)e4m3ToFloat((uint8_t)c) - (double)x);
    if (best < 0 || err < bestErr || (err == bestErr && (c & 1) == 0)) {
      best = c;
      bestErr = err;
    }
  }
  return (uint8_t)best;
}

TEST(Numeric, E4m3EncodesToTheNearestValueTiesToEven) {
  std::mt19937 rng(20261201);
  std::uniform_real_distribution<float> expo(-14.0f, 10.0f), unit(0.0f, 1.0f);
  int checked = 0;
  for (int i = 0; i < 200000; i++) {
    // Magnitudes from far below the smallest subnormal to beyond 448, both signs; every 8th an exact midpoint.
    float x = std::ldexp(1.0f + unit(rng), (int)std::floor(expo(rng)));
    if (i % 8 == 0) {
      const uint8_t c = (uint8_t)(rng() % 0x7e);
      x = (e4m3ToFloat(c) + e4m3ToFloat((uint8_t)(c + 1))) / 2;  // between two neighbours (same sign)
    }
    if (i % 2) x = -x;
    ASSERT_EQ(floatToE4m3(x), nearestE4m3(x)) << "x = " << x;
    checked++;
  }
  EXPECT_EQ(checked, 200000);
}

TEST(Numeric, E4m3SaturatesAndKeepsNan) {
  EXPECT_EQ(floatToE4m3(1e6f), 0x7e);
  EXPECT_EQ(floatToE4m3(-INFINITY), 0xfe);
  EXPECT_EQ(floatToE4m3(INFINITY), 0x7e);
  EXPECT_EQ(floatToE4m3(464.0f), 0x7e);
  EXPECT_EQ(floatToE4m3(NAN), 0x7f);
  EXPECT_EQ(floatToE4m3(-NAN) | 0x80, 0xff);
  EXPECT_EQ(floatToE4m3(std::ldexp(1.0f, -11)), 0x00);  // a quarter of the smallest subnormal rounds to zero
  EXPECT_EQ(floatToE4m3(std::ldexp(1.0f, -10)), 0x00);  // half of it: a tie, to the even code 0
  EXPECT_EQ(floatToE4m3(std::ldexp(3.0f, -10)), 0x02);  // 1.5 units: a tie, to 2
}

TEST(Numeric, Bf16RoundsToNearestEven) {
  std::mt19937 rng(7);
  for (int i = 0; i < 200000; i++) {
    uint32_t u = (uint32_t)rng();
    if ((u & 0x7f800000u) == 0x7f800000u) continue;  // inf / NaN below
    const float x = bitsFloat(u);
    const uint16_t b = floatToBf16(x);
    if ((b & 0x7fff) == 0x7f80) {  // overflow to infinity: only from at least halfway past the largest bf16
      ASSERT_GE(std::fabs(x), bitsFloat(0x7f7f8000u)) << "x = " << x;
      continue;
    }
    const double err = std::fabs((double)bf16ToFloat(b) - x);
    for (int d : {-1, 1}) {
      const uint16_t n = (uint16_t)(b + d);
      if ((n & 0x7f80) == 0x7f80 || (n & 0x8000) != (b & 0x8000)) continue;
      const double nerr = std::fabs((double)bf16ToFloat(n) - x);
      ASSERT_TRUE(err < nerr || (err == nerr && (b & 1) == 0)) << "x = " << x;
    }
  }
  EXPECT_TRUE(isNan(bf16ToFloat(floatToBf16(NAN))));
  EXPECT_EQ(floatToBf16(INFINITY), 0x7f80);
  EXPECT_EQ(floatToBf16(1.0f), 0x3f80);
}

TEST(Numeric, Fp8BlockScales) {
  EXPECT_EQ(fp8BlockScale(448.0f, false), 1.0f);
  EXPECT_EQ(fp8BlockScale(0.0f, false), kFp8MinAmax / kFp8E4m3Max);
  EXPECT_EQ(fp8BlockScale(448.0f * 3, true), 4.0f);
  EXPECT_EQ(fp8BlockScale(448.0f * 4, true), 4.0f);
  EXPECT_EQ(fp8BlockScale(448.0f / 3, true), 0.5f);
  // Powers of two are whole in their exponent byte (UE8M0, the Low-Latency dispatch's int32 scales): a normal float
  // with no mantissa bits, for every amax from 0 (the floor) across the float range.
  for (float amax : {0.0f, 1e-30f, 3e-7f, 0.7f, 448.0f, 449.0f, 1e6f, 3e30f}) {
    const uint32_t bits = floatBits(fp8BlockScale(amax, true));
    EXPECT_EQ(bits & 0x807fffffu, 0u) << amax;  // positive, no mantissa
    EXPECT_NE(bits >> 23, 0u) << amax;          // normal: the byte is not 0 (UE8M0's 2^-127)
    EXPECT_EQ(bitsFloat(bits & 0x7f800000u), fp8BlockScale(amax, true)) << amax;
  }
  // A quantised block never saturates and dequantises within half an e4m3 step of each value.
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  for (int pow2 = 0; pow2 < 2; pow2++) {
    for (int b = 0; b < 200; b++) {
      float x[kFp8BlockElems], amax = 0;
      for (float& v : x) amax = std::fmax(amax, std::fabs(v = nd(rng) * (b % 7 + 1)));
      const float s = fp8BlockScale(amax, pow2);
      for (float v : x) {
        const float q = v / s;
        ASSERT_LE(std::fabs(q), kFp8E4m3Max * (1 + 1e-6f));
        const float back = e4m3ToFloat(floatToE4m3(q)) * s;
        ASSERT_LE(std::fabs(back - v), std::fabs(v) / 16 + s * std::ldexp(1.0f, -10)) << v;
      }
    }
  }
}

// e2m1 against brute force: the nearest of the 16 codes' values, a tie to the code whose lowest bit is 0, saturating
// past 6, on every midpoint and its neighbouring floats and on random floats across the range.
uint8_t nearestE2m1(float f) {
  if (isNan(f)) return std::signbit(f) ? 0xf : 0x7;
  const uint8_t sign = std::signbit(f) ? 8 : 0;
  const float a = std::fabs(f);
  if (a > 6.0f) return (uint8_t)(sign | 7);  // saturation (distances to 4 and 6 round alike for huge values)
  uint8_t best = 0;
  for (uint8_t c = 1; c < 8; c++) {
    const float d = std::fabs(e2m1ToFloat(c) - a), bd = std::fabs(e2m1ToFloat(best) - a);
    if (d < bd || (d == bd && (c & 1) == 0)) best = c;
  }
  return (uint8_t)(sign | best);
}

TEST(Numeric, E2m1DecodesItsEightMagnitudes) {
  const float want[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  for (uint8_t c = 0; c < 8; c++) {
    EXPECT_EQ(e2m1ToFloat(c), want[c]);
    EXPECT_EQ(e2m1ToFloat((uint8_t)(c | 8)), -want[c]);
    EXPECT_EQ(floatToE2m1(want[c]), c);
    EXPECT_EQ(floatToE2m1(-want[c]), (uint8_t)(c | 8));
  }
}

TEST(Numeric, E2m1EncodesToTheNearestValueTiesToEven) {
  std::vector<float> probes;
  for (float m : {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, 6.0f, 0.0f})
    for (float v : {m, std::nextafter(m, 0.0f), std::nextafter(m, 100.0f)}) probes.push_back(v);
  std::mt19937 rng(9);
  std::uniform_real_distribution<float> u(-8.0f, 8.0f);
  for (int i = 0; i < 100000; i++) probes.push_back(u(rng));
  for (float big : {7.0f, 1e30f, INFINITY}) probes.push_back(big);
  for (float p : std::vector<float>(probes)) probes.push_back(-p);
  for (float p : probes) ASSERT_EQ(floatToE2m1(p), nearestE2m1(p)) << p;
  EXPECT_EQ(floatToE2m1(0.25f), 0);  // ties: 0.25 to 0, 0.75 to 1.0, 1.25 to 1.0, 1.75 to 2, 2.5 to 2, 3.5 to 4, 5 to 4
  EXPECT_EQ(floatToE2m1(0.75f), 2);
  EXPECT_EQ(floatToE2m1(5.0f), 6);
  EXPECT_EQ(floatToE2m1(NAN), 7);
  EXPECT_EQ(floatToE2m1(-INFINITY), 0xf);
}

// NVFP4: a block's scale is e4m3(amax / 6 x g), its elements come back within half an e2m1 step of the scaled value
// (so within amax / 6 of x after dequantisation), zero blocks give zero scales and codes, and the row packs element
// 2i in the low nibble of byte i.
TEST(Numeric, Nvfp4QuantisesBlocksUnderAGlobalScale) {
  std::mt19937 rng(4);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  for (int trial = 0; trial < 200; trial++) {
    const int n = 64;
    float x[n], amaxRow = 0;
    for (int i = 0; i < n; i++) amaxRow = std::fmax(amaxRow, std::fabs(x[i] = nd(rng) * (trial % 5 + 1)));
    if (trial % 17 == 0)
      for (int i = 16; i < 32; i++) x[i] = 0.0f;  // a zero block
    const float g = kFp8E4m3Max * kFp4E2m1Max / amaxRow;
    uint8_t packed[n / 2], scales[n / 16];
    nvfp4QuantizeRow(x, n, g, packed, scales);
    for (int b = 0; b < n / 16; b++) {
      float amax = 0;
      for (int i = 0; i < 16; i++) amax = std::fmax(amax, std::fabs(x[b * 16 + i]));
      ASSERT_EQ(scales[b], floatToE4m3(amax / 6.0f * g)) << trial << " " << b;
      const float s = e4m3ToFloat(scales[b]);
      for (int i = 0; i < 16; i++) {
        const int k = b * 16 + i;
        const uint8_t q = (uint8_t)(k % 2 ? packed[k / 2] >> 4 : packed[k / 2] & 0xf);
        if (amax == 0.0f) {
          ASSERT_EQ(scales[b], 0);
          ASSERT_EQ(q & 7, 0);
          continue;
        }
        ASSERT_EQ(q, floatToE2m1(x[k] * (g / s)));
        const float back = e2m1ToFloat(q) * s / g;
        ASSERT_LE(std::fabs(back - x[k]), amax / 6.0f * 1.2f) << trial << " " << k;  // e4m3 scale error included
      }
    }
  }
  EXPECT_EQ(nvfp4Factor(0, 100.0f), 0.0f);
}

}  // namespace
}  // namespace ncclext
