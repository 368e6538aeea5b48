// Number formats the libraries convert between, as plain inline functions that host code (references, tests) and
// device code (kernels: M2N's conversions in flight, the Low-Latency mode's FP8 dispatch) share, so that a kernel
// and its host reference cannot round differently. No CUDA header needed: bits in, bits out.
//
// - bf16: the top 16 bits of an fp32, rounded to nearest even; NaN stays a (quiet) NaN.
// - fp8 e4m3 ("e4m3fn", as torch.float8_e4m3fn and cuda_fp8.h's __NV_E4M3): 1 sign, 4 exponent (bias 7), 3 mantissa
//   bits, no infinities, 0x7f / 0xff NaN, largest finite 448. Conversion rounds to nearest even and saturates to
//   +-448, as cuda_fp8.h's __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3); NaN gives 0x7f (sign kept).
// - Block scales (DeepSeek-V3's recipe, one fp32 scale per 128 elements): scale = amax / 448 with amax at least
//   kFp8MinAmax, so that x / scale fits e4m3 and dequantisation is q * scale; with pow2 (UE8M0) the scale is
//   rounded up to a power of two, 2^ceil(log2(amax / 448)).
// - fp4 e2m1 (NVFP4's element): 1 sign, 2 exponent (bias 1), 1 mantissa bit: +-{0, 0.5, 1, 1.5, 2, 3, 4, 6}, no
//   infinities or NaN. Conversion rounds to nearest, ties to the even code, and saturates to +-6; a NaN saturates
//   too (its sign kept). Two to a byte, the first element in the low nibble (torch.float4_e2m1fn_x2, CUTLASS).
// - NVFP4 blocks (16 elements) under a global scale g (the multiplier TensorRT-LLM and vLLM pass, typically
//   448 x 6 / the tensor's amax): the block's scale is e4m3(amax / 6 x g), its elements e2m1(x x (g / scale)), 0
//   where the scale is 0; dequantisation is q x scale / g.
#pragma once

#include <stdint.h>
#include <string.h>

#if defined(__CUDACC__)
#define NCCLEXT_HD __host__ __device__ __forceinline__
#else
#define NCCLEXT_HD inline
#endif

namespace ncclext {

constexpr float kFp8E4m3Max = 448.0f;
constexpr float kFp8MinAmax = 1e-4f;  // a block of zeros gets a tiny scale, not a division by zero
constexpr int kFp8BlockElems = 128;

NCCLEXT_HD uint32_t floatBits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

NCCLEXT_HD float bitsFloat(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

NCCLEXT_HD uint16_t floatToBf16(float f) {
  const uint32_t u = floatBits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);  // NaN: keep it a quiet NaN
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

NCCLEXT_HD float bf16ToFloat(uint16_t b) { return bitsFloat((uint32_t)b << 16); }

NCCLEXT_HD float e4m3ToFloat(uint8_t v) {
  const uint32_t sign = (uint32_t)(v & 0x80) << 24;
  const int exp = (v >> 3) & 0xf, man = v & 0x7;
  if (exp == 0xf && man == 0x7) return bitsFloat(sign | 0x7fc00000u);  // NaN
  float mag;
  if (exp == 0) {
    mag = (float)man * 0.001953125f;  // subnormal: man / 8 * 2^-6
  } else {
    mag = bitsFloat((uint32_t)(exp - 7 + 127) << 23 | (uint32_t)man << 20);
  }
  return bitsFloat(floatBits(mag) | sign);
}

NCCLEXT_HD uint8_t floatToE4m3(float f) {
  const uint32_t u = floatBits(f);
  const uint8_t sign = (uint8_t)((u >> 24) & 0x80);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return (uint8_t)(sign | 0x7f);  // NaN
  if (a >= 0x43e00000u) return (uint8_t)(sign | 0x7e);  // >= 448 (and infinity): saturate
  const int e = (int)(a >> 23) - 127;                   // unbiased exponent of |f|
  if (e < -6) {
    // Subnormal range of e4m3 (or zero): the value in units of 2^-9, rounded to nearest even. 2^-6 * 7/8 rounds up
    // to the smallest normal (0x08), which the same integer arithmetic gives.
    const float units = bitsFloat(a) * 512.0f;  // exact: a power-of-two scale
    uint32_t q = (uint32_t)units;
    const float rest = units - (float)q;
    if (rest > 0.5f || (rest == 0.5f && (q & 1u))) q++;
    return (uint8_t)(sign | q);  // q <= 8: 8 is exponent 1, mantissa 0
  }
  // Normal: keep 3 mantissa bits, round to nearest even on the 20 dropped bits.
  uint32_t m = a & 0x7fffffu;
  uint32_t q = ((uint32_t)(e + 7) << 3) | (m >> 20);
  const uint32_t dropped = m & 0xfffffu;
  if (dropped > 0x80000u || (dropped == 0x80000u && (q & 1u))) q++;
  if (q > 0x7e) q = 0x7e;  // rounding past 448 saturates
  return (uint8_t)(sign | q);
}

// Two floats to e4m3 at once, lo in the low byte, each as floatToE4m3 converts it. Device code on sm_89 and later
// uses the hardware conversion (cvt.rn.satfinite.e4m3x2.f32: nearest even, saturating to +-448), with a NaN given
// floatToE4m3's answer (0x7f, its sign kept) whatever the hardware's; tests/gpu/m2n_exec_test.cu checks that the
// two agree on every fp32 in both halves.
NCCLEXT_HD uint16_t floatsToE4m3x2(float lo, float hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  uint16_t r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
  if (lo != lo) r = (uint16_t)((r & 0xff00u) | ((floatBits(lo) >> 24) & 0x80u) | 0x7fu);
  if (hi != hi) r = (uint16_t)((r & 0x00ffu) | ((floatBits(hi) >> 16) & 0x8000u) | 0x7f00u);
  return r;
#else
  return (uint16_t)(floatToE4m3(lo) | (uint16_t)floatToE4m3(hi) << 8);
#endif
}

// The scale of a block whose largest magnitude is `amax` (see the header comment).
NCCLEXT_HD float fp8BlockScale(float amax, bool pow2) {
  const float s = (amax > kFp8MinAmax ? amax : kFp8MinAmax) / kFp8E4m3Max;
  if (!pow2) return s;
  // 2^ceil(log2(s)): s's exponent, one up unless s is already a power of two.
  const uint32_t u = floatBits(s);
  uint32_t e = u >> 23;
  if (u & 0x7fffffu) e++;
  return bitsFloat(e << 23);
}

// One row of `n` floats (n a multiple of kFp8BlockElems) quantised block by block: scales[b] = fp8BlockScale of the
// block's largest magnitude, q[i] = e4m3(x[i] / scales[b]) (an IEEE division on both sides: no reciprocal).
NCCLEXT_HD void fp8QuantizeRow(const float* x, int n, bool pow2, uint8_t* q, float* scales) {
  for (int b = 0; b < n / kFp8BlockElems; b++) {
    float amax = 0.0f;
    for (int i = 0; i < kFp8BlockElems; i++) {
      const float a = x[b * kFp8BlockElems + i] < 0 ? -x[b * kFp8BlockElems + i] : x[b * kFp8BlockElems + i];
      amax = a > amax ? a : amax;  // a NaN never wins (NaN > amax is false)
    }
    const float s = fp8BlockScale(amax, pow2);
    scales[b] = s;
    for (int i = 0; i < kFp8BlockElems; i++) q[b * kFp8BlockElems + i] = floatToE4m3(x[b * kFp8BlockElems + i] / s);
  }
}

constexpr float kFp4E2m1Max = 6.0f;
constexpr int kNvfp4BlockElems = 16;

NCCLEXT_HD float e2m1ToFloat(uint8_t v) {
  const float mags[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const float m = mags[v & 7];
  return (v & 8) ? -m : m;
}

// The e2m1 code (low nibble) of f: the nearest of the eight magnitudes, a tie to the even code, past 6 (and NaN) 6.
NCCLEXT_HD uint8_t floatToE2m1(float f) {
  const uint32_t u = floatBits(f);
  const uint8_t sign = (uint8_t)((u >> 28) & 0x8);
  const uint32_t au = u & 0x7fffffffu;
  if (au > 0x7f800000u) return (uint8_t)(sign | 7);  // NaN: saturate
  const float a = bitsFloat(au);
  // mid[c]: the midpoint between codes c and c + 1; at a midpoint the even code wins (c when c is even, else c + 1).
  const float mid[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
  uint8_t c = 0;
  while (c < 7 && (a > mid[c] || (a == mid[c] && (c & 1)))) c++;
  return (uint8_t)(sign | c);
}

// The e4m3 scale of an NVFP4 block whose largest magnitude is `amax`, under global scale g.
NCCLEXT_HD uint8_t nvfp4BlockScale(float amax, float g) { return floatToE4m3(amax / kFp4E2m1Max * g); }

// What a block's elements are multiplied by before e2m1: g / scale, or 0 for a zero (or NaN) scale.
NCCLEXT_HD float nvfp4Factor(uint8_t scale, float g) {
  const float s = e4m3ToFloat(scale);
  return s > 0.0f || s < 0.0f ? g / s : 0.0f;
}

// One row of `n` floats (n a multiple of kNvfp4BlockElems) as NVFP4 under global scale g: packed[i / 2] holds
// elements i (low nibble) and i + 1, scales[b] block b's e4m3 scale.
NCCLEXT_HD void nvfp4QuantizeRow(const float* x, int n, float g, uint8_t* packed, uint8_t* scales) {
  for (int b = 0; b < n / kNvfp4BlockElems; b++) {
    const float* v = x + b * kNvfp4BlockElems;
    float amax = 0.0f;
    for (int i = 0; i < kNvfp4BlockElems; i++) {
      const float a = v[i] < 0 ? -v[i] : v[i];
      amax = a > amax ? a : amax;  // a NaN never wins
    }
    scales[b] = nvfp4BlockScale(amax, g);
    const float f = nvfp4Factor(scales[b], g);
    for (int i = 0; i < kNvfp4BlockElems; i += 2)
      packed[(b * kNvfp4BlockElems + i) / 2] =
          (uint8_t)(floatToE2m1(v[i] * f) | (uint8_t)(floatToE2m1(v[i + 1] * f) << 4));
  }
}

}  // namespace ncclext
