/* GGUF's block layouts (ggml's block_* structs, little-endian) and what the kernels share about them.
 *
 * Kinds are ggml's type ids. Blocks of 32 weights: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0; super-blocks of 256: Q4_K,
 * Q5_K, Q6_K. The decoding rules are written out in runtime/model/dequant.py, which the tests hold to the `gguf`
 * package; `blockdot.c` (float32 activations) and `qdot.c` (int8 activations) read the same structs.
 */
#ifndef RADIXCACHE_GGML_BLOCKS_H
#define RADIXCACHE_GGML_BLOCKS_H

#include <stdint.h>
#include <string.h>
#if defined(__F16C__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#define QK 32    /* elements per block, and per activation block of the int8 path */
#define QK_K 256 /* elements per K-quant super-block */
#define BLOCKDOT_MAX_TOKENS 8
#define BLOCKDOT_MAX_PARTS 8

enum {
    KIND_F32 = 0, /* plain float32 rows: densedot.c only (block_elems and block_bytes give 0) */
    KIND_Q4_0 = 2,
    KIND_Q4_1 = 3,
    KIND_Q5_0 = 6,
    KIND_Q5_1 = 7,
    KIND_Q8_0 = 8,
    KIND_Q4_K = 12,
    KIND_Q5_K = 13,
    KIND_Q6_K = 14,
};

typedef struct {
    uint16_t d;
    uint8_t qs[16];
} block_q4_0;

typedef struct {
    uint16_t d, m;
    uint8_t qs[16];
} block_q4_1;

typedef struct {
    uint16_t d;
    uint8_t qh[4];
    uint8_t qs[16];
} block_q5_0;

typedef struct {
    uint16_t d, m;
    uint8_t qh[4];
    uint8_t qs[16];
} block_q5_1;

typedef struct {
    uint16_t d;
    int8_t qs[32];
} block_q8_0;

typedef struct {
    uint16_t d, dmin;
    uint8_t scales[12];
    uint8_t qs[128];
} block_q4_K;

typedef struct {
    uint16_t d, dmin;
    uint8_t scales[12];
    uint8_t qh[32];
    uint8_t qs[128];
} block_q5_K;

typedef struct {
    uint8_t ql[128];
    uint8_t qh[64];
    int8_t scales[16];
    uint16_t d;
} block_q6_K;

/* Elements per block of `kind` (32 or 256), or 0 for a kind the kernels do not take. */
static inline int block_elems(int kind) {
    switch (kind) {
    case KIND_Q4_0:
    case KIND_Q4_1:
    case KIND_Q5_0:
    case KIND_Q5_1:
    case KIND_Q8_0:
        return QK;
    case KIND_Q4_K:
    case KIND_Q5_K:
    case KIND_Q6_K:
        return QK_K;
    default:
        return 0;
    }
}

/* Bytes per block of `kind` (0 for a kind the kernels do not take). */
static inline size_t block_bytes(int kind) {
    switch (kind) {
    case KIND_Q4_0: return sizeof(block_q4_0);
    case KIND_Q4_1: return sizeof(block_q4_1);
    case KIND_Q5_0: return sizeof(block_q5_0);
    case KIND_Q5_1: return sizeof(block_q5_1);
    case KIND_Q8_0: return sizeof(block_q8_0);
    case KIND_Q4_K: return sizeof(block_q4_K);
    case KIND_Q5_K: return sizeof(block_q5_K);
    case KIND_Q6_K: return sizeof(block_q6_K);
    default: return 0;
    }
}

/* IEEE half -> float, portable (F16C where the CPU has it). */
static inline float half_to_float(uint16_t h) {
#if defined(__F16C__)
    return _cvtsh_ss(h);
#else
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1F, man = h & 0x3FF, bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else { /* subnormal: normalise */
            exp = 127 - 15 + 1;
            while (!(man & 0x400)) {
                man <<= 1;
                exp--;
            }
            bits = sign | (exp << 23) | ((man & 0x3FF) << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7F800000 | (man << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
#endif
}

/* The sum of a vector's 8 lanes (the 256-bit sums of blockdot.c, densedot.c, qdot.c and kquant_rows.h). */
#if defined(__AVX2__)
static inline float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
#endif

/* 8 packed bytes (byte s the s-th value) as 8 float lanes: a K-quant super-block's 6-bit scales or mins. */
#if defined(__AVX2__)
static inline __m256 widen8(uint64_t bytes) {
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)bytes)));
}
#endif

/* 16 in byte j where bit j of `bits` is set, else 0: a Q5_0 / Q5_1 block's fifth bits (its qh) at their values. */
#if defined(__AVX2__)
static inline __m256i fifth_bits(uint32_t bits) {
    const __m256i spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32((int)bits),
        _mm256_set_epi64x(0x0303030303030303LL, 0x0202020202020202LL, 0x0101010101010101LL, 0));
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
    return _mm256_and_si256(set, _mm256_set1_epi8(16));
}
#endif

/* Q4_K / Q5_K: the 6-bit scales and mins of the 8 sub-blocks, unpacked from their 12 bytes. */
static inline void k_scales_mins(const uint8_t *b, uint8_t sc[8], uint8_t m[8]) {
    for (int s = 0; s < 4; s++) {
        sc[s] = b[s] & 63;
        m[s] = b[s + 4] & 63;
        sc[s + 4] = (uint8_t)((b[s + 8] & 0x0F) | ((b[s] >> 6) << 4));
        m[s + 4] = (uint8_t)((b[s + 8] >> 4) | ((b[s + 4] >> 6) << 4));
    }
}

/* The same 16 fields packed: byte s of *sc is sc[s], of *m is m[s]. Four at a time from 32-bit words, for the
 * vector rows (the per-byte loop above cost the K-quant rows a fifth to two fifths of their time). */
static inline void k_scales_mins_packed(const uint8_t *b, uint64_t *sc, uint64_t *m) {
    uint32_t u[3];
    memcpy(u, b, sizeof u);
    const uint32_t sc_hi = (u[2] & 0x0F0F0F0Fu) | ((u[0] >> 2) & 0x30303030u);
    const uint32_t m_hi = ((u[2] >> 4) & 0x0F0F0F0Fu) | ((u[1] >> 2) & 0x30303030u);
    *sc = (uint64_t)(u[0] & 0x3F3F3F3Fu) | (uint64_t)sc_hi << 32;
    *m = (uint64_t)(u[1] & 0x3F3F3F3Fu) | (uint64_t)m_hi << 32;
}

/* The 5-bit quantised value of element j (0..31) of a Q5_0 / Q5_1 block, before its offset. */
static inline int q5_value(const uint8_t qs[16], const uint8_t qh[4], int j) {
    uint32_t h;
    memcpy(&h, qh, sizeof h);
    const int nib = j < 16 ? (qs[j] & 0x0F) : (qs[j - 16] >> 4);
    return nib | (int)(((h >> j) & 1u) << 4);
}

#endif
