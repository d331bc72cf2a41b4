/* y[t, o] = sum_k W[o, k] * x[t, k] for a weight W stored as GGUF blocks, with float32 x and y.
 *
 * W is row-major: each row is `cols / 32` blocks of 32 weights, in llama.cpp's block layouts:
 *   Q8_0: f16 d, i8 q[32]        w = d * q
 *   Q4_1: f16 d, f16 m, u8 qs[16] w = d * q + m  (q[j] = low nibble of qs[j], q[16 + j] = its high nibble)
 * The weights are used exactly as stored (no activation quantisation): with Q4_1,
 *   sum_j w_j x_j = d * sum_j q_j x_j + m * sum_j x_j,
 * and the block sums of x are computed once per call. Products and sums are float32, as in a float32 GEMM of
 * the dequantised weights; only the summation order differs.
 *
 * `ntok` (1 .. BLOCKDOT_MAX_TOKENS) rows of x share each decoded block: a small decode batch reads W once.
 * Rows of W are split across OpenMP threads; the library is built against the libgomp that torch has loaded.
 * Vector paths: AVX-512, AVX2 + FMA, else portable C (chosen at build time by -march=native).
 */
#include <stdint.h>
#include <string.h>
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#define BLOCKDOT_MAX_TOKENS 4
#define QK 32

typedef struct {
    uint16_t d, m;
    uint8_t qs[16];
} block_q4_1;

typedef struct {
    uint16_t d;
    int8_t qs[32];
} block_q8_0;

int blockdot_max_tokens(void) { return BLOCKDOT_MAX_TOKENS; }

int blockdot_vector_width(void) {
#if defined(__AVX512F__)
    return 16;
#elif defined(__AVX2__) && defined(__FMA__)
    return 8;
#else
    return 1;
#endif
}

/* IEEE half -> float, portable (the vector paths use F16C where the CPU has it). */
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

/* The 32 weights of a block as floats (q only: d and m are applied by the caller). */
static inline void q4_1_values(const block_q4_1 *b, float *q) {
    for (int j = 0; j < 16; j++) {
        q[j] = (float)(b->qs[j] & 0x0F);
        q[j + 16] = (float)(b->qs[j] >> 4);
    }
}

void q4_1_matmul(const block_q4_1 *w, int rows, int cols, const float *x, int ntok, float *y, int ldy) {
    const int nb = cols / QK;
    float xsum[BLOCKDOT_MAX_TOKENS][nb > 0 ? nb : 1];
    for (int t = 0; t < ntok; t++) {
        for (int b = 0; b < nb; b++) {
            float s = 0.0f;
            for (int j = 0; j < QK; j++) s += x[(size_t)t * cols + b * QK + j];
            xsum[t][b] = s;
        }
    }
#pragma omp parallel for schedule(static)
    for (int o = 0; o < rows; o++) {
        const block_q4_1 *row = w + (size_t)o * nb;
        float mterm[BLOCKDOT_MAX_TOKENS] = {0};
#if defined(__AVX512F__)
        __m512 acc[BLOCKDOT_MAX_TOKENS];
        for (int t = 0; t < ntok; t++) acc[t] = _mm512_setzero_ps();
        const __m128i low = _mm_set1_epi8(0x0F);
        for (int b = 0; b < nb; b++) {
            const __m128i qs = _mm_loadu_si128((const __m128i *)row[b].qs);
            const __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(qs, low)));
            const __m512 hi = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(qs, 4), low)));
            const __m512 d = _mm512_set1_ps(half_to_float(row[b].d));
            const float m = half_to_float(row[b].m);
            for (int t = 0; t < ntok; t++) {
                const float *xb = x + (size_t)t * cols + b * QK;
                __m512 p = _mm512_mul_ps(lo, _mm512_loadu_ps(xb));
                p = _mm512_fmadd_ps(hi, _mm512_loadu_ps(xb + 16), p);
                acc[t] = _mm512_fmadd_ps(p, d, acc[t]);
                mterm[t] += m * xsum[t][b];
            }
        }
        for (int t = 0; t < ntok; t++) y[(size_t)t * ldy + o] = _mm512_reduce_add_ps(acc[t]) + mterm[t];
#elif defined(__AVX2__) && defined(__FMA__)
        __m256 acc[BLOCKDOT_MAX_TOKENS];
        for (int t = 0; t < ntok; t++) acc[t] = _mm256_setzero_ps();
        for (int b = 0; b < nb; b++) {
            const __m128i qs = _mm_loadu_si128((const __m128i *)row[b].qs);
            const __m128i low = _mm_set1_epi8(0x0F);
            const __m128i lo8 = _mm_and_si128(qs, low), hi8 = _mm_and_si128(_mm_srli_epi16(qs, 4), low);
            const __m256 q0 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo8));
            const __m256 q1 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(lo8, 8)));
            const __m256 q2 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi8));
            const __m256 q3 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(hi8, 8)));
            const __m256 d = _mm256_set1_ps(half_to_float(row[b].d));
            const float m = half_to_float(row[b].m);
            for (int t = 0; t < ntok; t++) {
                const float *xb = x + (size_t)t * cols + b * QK;
                __m256 p = _mm256_mul_ps(q0, _mm256_loadu_ps(xb));
                p = _mm256_fmadd_ps(q1, _mm256_loadu_ps(xb + 8), p);
                p = _mm256_fmadd_ps(q2, _mm256_loadu_ps(xb + 16), p);
                p = _mm256_fmadd_ps(q3, _mm256_loadu_ps(xb + 24), p);
                acc[t] = _mm256_fmadd_ps(p, d, acc[t]);
                mterm[t] += m * xsum[t][b];
            }
        }
        for (int t = 0; t < ntok; t++) {
            __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc[t]), _mm256_extractf128_ps(acc[t], 1));
            s = _mm_add_ps(s, _mm_movehl_ps(s, s));
            s = _mm_add_ss(s, _mm_movehdup_ps(s));
            y[(size_t)t * ldy + o] = _mm_cvtss_f32(s) + mterm[t];
        }
#else
        float acc[BLOCKDOT_MAX_TOKENS] = {0};
        float q[QK];
        for (int b = 0; b < nb; b++) {
            q4_1_values(&row[b], q);
            const float d = half_to_float(row[b].d), m = half_to_float(row[b].m);
            for (int t = 0; t < ntok; t++) {
                const float *xb = x + (size_t)t * cols + b * QK;
                float p = 0.0f;
                for (int j = 0; j < QK; j++) p += q[j] * xb[j];
                acc[t] += d * p;
                mterm[t] += m * xsum[t][b];
            }
        }
        for (int t = 0; t < ntok; t++) y[(size_t)t * ldy + o] = acc[t] + mterm[t];
#endif
    }
}

void q8_0_matmul(const block_q8_0 *w, int rows, int cols, const float *x, int ntok, float *y, int ldy) {
    const int nb = cols / QK;
#pragma omp parallel for schedule(static)
    for (int o = 0; o < rows; o++) {
        const block_q8_0 *row = w + (size_t)o * nb;
#if defined(__AVX512F__)
        __m512 acc[BLOCKDOT_MAX_TOKENS];
        for (int t = 0; t < ntok; t++) acc[t] = _mm512_setzero_ps();
        for (int b = 0; b < nb; b++) {
            const __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)row[b].qs)));
            const __m512 hi =
                _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(row[b].qs + 16))));
            const __m512 d = _mm512_set1_ps(half_to_float(row[b].d));
            for (int t = 0; t < ntok; t++) {
                const float *xb = x + (size_t)t * cols + b * QK;
                __m512 p = _mm512_mul_ps(lo, _mm512_loadu_ps(xb));
                p = _mm512_fmadd_ps(hi, _mm512_loadu_ps(xb + 16), p);
                acc[t] = _mm512_fmadd_ps(p, d, acc[t]);
            }
        }
        for (int t = 0; t < ntok; t++) y[(size_t)t * ldy + o] = _mm512_reduce_add_ps(acc[t]);
#elif defined(__AVX2__) && defined(__FMA__)
        __m256 acc[BLOCKDOT_MAX_TOKENS];
        for (int t = 0; t < ntok; t++) acc[t] = _mm256_setzero_ps();
        for (int b = 0; b < nb; b++) {
            __m256 q[4];
            for (int k = 0; k < 4; k++)
                q[k] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(row[b].qs + 8 * k))));
            const __m256 d = _mm256_set1_ps(half_to_float(row[b].d));
            for (int t = 0; t < ntok; t++) {
                const float *xb = x + (size_t)t * cols + b * QK;
                __m256 p = _mm256_mul_ps(q[0], _mm256_loadu_ps(xb));
                for (int k = 1; k < 4; k++) p = _mm256_fmadd_ps(q[k], _mm256_loadu_ps(xb + 8 * k), p);
                acc[t] = _mm256_fmadd_ps(p, d, acc[t]);
            }
        }
        for (int t = 0; t < ntok; t++) {
            __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc[t]), _mm256_extractf128_ps(acc[t], 1));
            s = _mm_add_ps(s, _mm_movehl_ps(s, s));
            s = _mm_add_ss(s, _mm_movehdup_ps(s));
            y[(size_t)t * ldy + o] = _mm_cvtss_f32(s);
        }
#else
        float acc[BLOCKDOT_MAX_TOKENS] = {0};
        for (int b = 0; b < nb; b++) {
            const float d = half_to_float(row[b].d);
            for (int t = 0; t < ntok; t++) {
                const float *xb = x + (size_t)t * cols + b * QK;
                float p = 0.0f;
                for (int j = 0; j < QK; j++) p += (float)row[b].qs[j] * xb[j];
                acc[t] += d * p;
            }
        }
        for (int t = 0; t < ntok; t++) y[(size_t)t * ldy + o] = acc[t];
#endif
    }
}
